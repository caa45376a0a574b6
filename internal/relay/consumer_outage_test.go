package relay_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/payments/internal/pgtest"
	"github.com/exactlyonce/payments/internal/relay"
	"github.com/exactlyonce/payments/internal/testkit"
)

// TestConsumerWaitsOutOutagesCalmly: a consumer started before the stream
// exists, then fed events while its database refuses every connection,
// backs off (ceilings from 250 ms doubling) and writes one WARN per outage
// (attaching, then applying), not one per attempt or per event; when each
// outage ends one INFO says so, and every event is applied once.
func TestConsumerWaitsOutOutagesCalmly(t *testing.T) {
	e := setup(t)
	logs := &testkit.LogBuffer{}
	c := e.startConsumer(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	lines := func(msg string) []testkit.LogLine { return testkit.JSONLog(t, logs.String(), msg) }

	// No stream until the relay first runs.
	e.waitUntil("three attempts to attach", func() bool {
		return len(testkit.Where(lines("consumer: attach to the stream"), "state", "down", "retrying")) >= 3
	})
	e.startRelay()
	accounts := []uuid.UUID{e.account(1000), e.account(1000)}
	for i := range 6 {
		e.charge(accounts[i%2], 10)
	}
	events := int64(e.count(`SELECT count(*) FROM events`))
	e.waitUntil("every event is applied", func() bool { return c.Stats.Applied.Load() == events })

	// An event delivered while the consumer's database is down: the last one
	// again, under a new message id (a republish the broker does not drop).
	db := testkit.NewDatabaseSwitch(t, pgtest.AdminURL(t), e.store.Pool().Config().ConnString())
	msgs := e.streamMessages()
	again := nats.NewMsg(msgs[len(msgs)-1].Subject())
	again.Data = msgs[len(msgs)-1].Data()
	again.Header.Set(relay.MerchantHeader, msgs[len(msgs)-1].Headers().Get(relay.MerchantHeader))
	again.Header.Set(jetstream.MsgIDHeader, "again-"+uuid.NewString())
	db.Cut()
	if _, err := e.jetStream().PublishMsg(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	// Ceilings 250 ms, 500 ms, 1 s, 2 s: four attempts within 1.75 s of waits.
	e.waitUntil("four attempts to apply", func() bool {
		return len(testkit.Where(lines("consumer: apply events"), "state", "down", "retrying")) >= 4
	})
	db.Restore()
	e.waitUntil("the event is recognised as applied", func() bool { return c.Stats.Redelivery.Load() == 1 })
	if n := c.Stats.Applied.Load(); n != events {
		t.Errorf("%d events applied, want %d", n, events)
	}

	for _, msg := range []string{"consumer: attach to the stream", "consumer: apply events"} {
		all := lines(msg)
		attempts := testkit.Where(all, "state", "down", "retrying")
		for i, ln := range attempts {
			if want := (250 * time.Millisecond) << min(i, 4); ln["backoff_ceiling"] != want.String() {
				t.Errorf("%s, attempt %d: ceiling %v, want %v", msg, i+1, ln["backoff_ceiling"], want)
			}
		}
		ups := testkit.Where(all, "state", "up")
		if len(ups) != 1 || ups[0]["level"] != "INFO" || ups[0]["attempts"] != float64(len(attempts)) {
			t.Errorf("%s: %d attempts, back up: %v; want one INFO line counting them", msg, len(attempts), ups)
		}
	}
	warns := testkit.Where(lines(""), "level", "WARN", "ERROR")
	if len(warns) != 2 || warns[0]["msg"] != "consumer: attach to the stream" || warns[1]["msg"] != "consumer: apply events" {
		t.Errorf("%d WARN/ERROR lines for two outages, want two (attach, apply): %v", len(warns), warns)
	}
}
