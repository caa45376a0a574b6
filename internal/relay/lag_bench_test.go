package relay_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// BenchmarkCommitToPublish measures how long an event takes from its
// transaction (created_at, the transaction's start) to a NATS subscriber,
// under a steady load of charges at a fixed rate, with LISTEN/NOTIFY waking
// the relay and a 1 s polling fallback. It reports p50 and p99 in ms.
//
//	go test -run '^$' -bench CommitToPublish -benchtime 1x ./internal/relay/
func BenchmarkCommitToPublish(b *testing.B) {
	for range b.N {
		lags := measureLag(b, 200, 10*time.Second)
		slices.Sort(lags)
		b.ReportMetric(ms(lags[len(lags)/2]), "p50-ms")
		b.ReportMetric(ms(lags[len(lags)*99/100]), "p99-ms")
		b.ReportMetric(ms(lags[len(lags)-1]), "max-ms")
		b.ReportMetric(float64(len(lags)), "events")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// measureLag charges at rate per second for d and returns each charge
// event's lag.
func measureLag(b *testing.B, rate int, d time.Duration) []time.Duration {
	e := setupBench(b)
	nc := e.nats.Connect()
	var (
		mu   sync.Mutex
		lags []time.Duration
	)
	sub, err := nc.Subscribe("payments.charge.succeeded", func(m *nats.Msg) {
		received := time.Now()
		var ev struct {
			CreatedAt time.Time `json:"created_at"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			b.Error(err)
			return
		}
		mu.Lock()
		lags = append(lags, received.Sub(ev.CreatedAt))
		mu.Unlock()
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.startRelay()
	accounts := make([]uuid.UUID, 64)
	for i := range accounts {
		accounts[i] = e.account(99_999_999)
	}

	b.ResetTimer()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	sent := 0
	for time.Now().Before(deadline) {
		<-tick.C
		i := sent
		wg.Go(func() { e.charge(accounts[i%len(accounts)], 1) })
		sent++
	}
	wg.Wait()
	e.waitUntil("every event is received", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lags) == sent
	})
	b.StopTimer()
	return lags
}
