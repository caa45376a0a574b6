// Command webhookreceiver receives the service's webhooks: it checks each
// delivery's signature with the endpoint's secret (WEBHOOK_SECRET) and logs
// the event. It listens on RECEIVER_ADDR, 127.0.0.1:8000 by default.
package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/exactlyonce/payments/client"
)

func main() {
	secret := os.Getenv("WEBHOOK_SECRET") // the endpoint's whsec_…, from its 201
	addr := os.Getenv("RECEIVER_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8000"
	}
	http.HandleFunc("POST /hooks/payments", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		// The body exactly as received: the signature covers its bytes.
		if err := client.VerifyWebhook(body, r.Header.Get("Payments-Signature"), secret, 0); err != nil {
			log.Printf("refused: %v", err)
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		var event struct{ ID, Type string }
		if err := json.Unmarshal(body, &event); err != nil {
			http.Error(w, "not an event", http.StatusBadRequest)
			return
		}
		// Deliveries are at least once: deduplicate by event.ID before acting.
		log.Printf("verified %s %s", event.Type, event.ID)
		w.WriteHeader(http.StatusNoContent)
	})
	// Bounds on a slow or silent sender, so it cannot hold a connection.
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	log.Print("listening")
	log.Fatal(srv.ListenAndServe())
}
