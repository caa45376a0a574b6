package chaos_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/relay"
)

// streamMessageIDs reads the whole PAYMENTS stream and returns how many times
// each Nats-Msg-Id (event id) is in it.
func streamMessageIDs(t *testing.T, url string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	must(t, err, "connect to NATS")
	defer nc.Close()
	js, err := jetstream.New(nc)
	must(t, err, "JetStream")
	stream, err := js.Stream(ctx, relay.Stream)
	must(t, err, "stream %s", relay.Stream)
	info, err := stream.Info(ctx)
	must(t, err, "stream info")
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	must(t, err, "consumer")
	ids := map[string]int{}
	var read uint64
	for read < info.State.Msgs && ctx.Err() == nil {
		batch, err := cons.Fetch(min(500, int(info.State.Msgs-read)), jetstream.FetchMaxWait(5*time.Second))
		must(t, err, "fetch")
		for m := range batch.Messages() {
			ids[m.Headers().Get(nats.MsgIdHdr)]++
			read++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("fetch: %v", err)
		}
	}
	if read < info.State.Msgs {
		t.Fatalf("read %d of the stream's %d messages before the deadline", read, info.State.Msgs)
	}
	return ids
}

// waitDrained waits until the relay has published every event: up to 30 s
// (3 minutes in the long mode).
func waitDrained(t *testing.T, ctx context.Context, db *pgxpool.Pool) {
	t.Helper()
	bound := scale(30*time.Second, 3*time.Minute)
	deadline := time.Now().Add(bound)
	for {
		var left int
		must(t, db.QueryRow(ctx, `SELECT count(*) FROM unpublished_events`).Scan(&left), "count unpublished")
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d events still unpublished after %v", left, bound)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compareStream checks that every event in the outbox is in the JetStream
// stream. It returns the events missing from the stream and how many events
// the stream holds more than once (a republish after a crash that fell outside
// the broker's duplicate window: allowed, consumers deduplicate by id).
func compareStream(t *testing.T, ctx context.Context, db *pgxpool.Pool, natsURL string) (missing, republished int) {
	t.Helper()
	inStream := streamMessageIDs(t, natsURL)
	rows, err := db.Query(ctx, `SELECT 'evt_' || replace(id::text, '-', '') FROM events`)
	must(t, err, "select events")
	defer rows.Close()
	var events int
	for rows.Next() {
		var id string
		must(t, rows.Scan(&id), "scan event")
		events++
		switch n := inStream[id]; {
		case n == 0:
			missing++
			if missing <= 5 {
				t.Errorf("event %s is not in the stream", id)
			}
		case n > 1:
			republished += n - 1
		}
		delete(inStream, id)
	}
	must(t, rows.Err(), "select events")
	if len(inStream) > 0 {
		var ids []string
		for id := range inStream {
			ids = append(ids, id)
		}
		t.Errorf("the stream has %d messages for no event: %s", len(ids), strings.Join(ids[:min(5, len(ids))], ", "))
	}
	t.Logf("%d events in the outbox, all published: %d missing from the stream", events, missing)
	return missing, republished
}
