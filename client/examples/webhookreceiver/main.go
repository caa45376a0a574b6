// Command webhookreceiver receives the service's webhooks: it verifies each
// delivery with the endpoint's secret (WEBHOOK_SECRET), handles each event
// once, and logs it. It listens on RECEIVER_ADDR, 127.0.0.1:8000 by default.
package main

import (
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/exactlyonce/payments/client"
)

// handled holds the ids of the events already handled. Keep yours where your
// effects are (a unique key in your database, written in the same
// transaction), so that a restart forgets none.
type handled struct {
	mu  sync.Mutex
	ids map[client.EventID]bool
}

// first reports whether id is new, and records it.
func (h *handled) first(id client.EventID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids[id] {
		return false
	}
	h.ids[id] = true
	return true
}

func main() {
	secret := os.Getenv("WEBHOOK_SECRET") // the endpoint's whsec_…, from its 201
	addr := os.Getenv("RECEIVER_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8000"
	}
	seen := &handled{ids: map[client.EventID]bool{}}
	http.HandleFunc("POST /hooks/payments", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read", http.StatusBadRequest)
			return
		}
		// The body exactly as received: the signature covers its bytes.
		event, err := client.ParseWebhook(body, r.Header.Get(client.WebhookSignatureHeader), secret, 0)
		if err != nil {
			log.Printf("refused: %v", err)
			http.Error(w, "bad delivery", http.StatusBadRequest)
			return
		}
		// At least once: deduplicate on the signed event.ID, never on the
		// Payments-Event-Id header, which the signature does not cover.
		if !seen.first(event.ID) {
			log.Printf("duplicate %s %s", event.Type, event.ID)
			w.WriteHeader(http.StatusNoContent) // acknowledged, so it is not sent again
			return
		}
		log.Printf("verified %s %s", event.Type, event.ID)
		w.WriteHeader(http.StatusNoContent)
	})
	// Bounds on a slow or silent sender, so it cannot hold a connection.
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	log.Print("listening")
	log.Fatal(srv.ListenAndServe())
}
