package retry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// The ceiling doubles from First with each failure and stops at Max; a
// long run of failures never overflows it.
func TestCeilingDoublesToTheCap(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		policy Policy
		want   []time.Duration // ceilings after failures 1, 2, ...
	}{
		{"default", Default, []time.Duration{250 * ms, 500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"periodic 15s", Periodic(15 * time.Second), []time.Duration{15 * time.Second, 30 * time.Second, time.Minute, time.Minute}},
		{"first above max", Policy{First: time.Second, Max: 300 * ms}, []time.Duration{300 * ms, 300 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, want := range tc.want {
				if got := tc.policy.Ceiling(i + 1); got != want {
					t.Errorf("Ceiling(%d) = %v, want %v", i+1, got, want)
				}
			}
			for _, n := range []int{33, 64, 1000} {
				if got := tc.policy.Ceiling(n); got != tc.policy.Max {
					t.Errorf("Ceiling(%d) = %v, want the cap %v", n, got, tc.policy.Max)
				}
			}
		})
	}
}

// A wait is drawn uniformly from zero to its ceiling (full jitter): never
// above it, and spread over all of it.
func TestWaitIsFullJitter(t *testing.T) {
	const draws = 10_000
	ceiling := Default.Ceiling(10) // the cap, 5 s
	var sum time.Duration
	var low, high int
	for range draws {
		w := Default.Wait(10)
		if w < 0 || w > ceiling {
			t.Fatalf("wait %v outside [0, %v]", w, ceiling)
		}
		sum += w
		if w < ceiling/5 {
			low++
		}
		if w > ceiling*4/5 {
			high++
		}
	}
	// Uniform: about a fifth in each end, a mean of half the ceiling. The
	// mean of 10,000 draws strays from 2.5 s by 15 ms (one standard
	// deviation); the bounds allow over ten times that.
	mean := sum / draws
	if mean < 2300*time.Millisecond || mean > 2700*time.Millisecond || low < draws/10 || high < draws/10 {
		t.Errorf("mean %v, %d below 1 s, %d above 4 s of %d draws: not uniform in [0, %v]", mean, low, high, draws, ceiling)
	}
}

// logLine is one line of a JSON log.
type logLine struct {
	Level    string `json:"level"`
	Msg      string `json:"msg"`
	State    string `json:"state"`
	Error    string `json:"error"`
	DownFor  string `json:"down_for"`
	Attempts int    `json:"attempts"`
	Attempt  int    `json:"attempt"`
	Ceiling  string `json:"backoff_ceiling"`
	RetryIn  string `json:"retry_in"`
	Outages  int    `json:"outages"`
	Loop     string `json:"loop"`
}

// jsonLog is a debug-level JSON logger writing to a buffer any goroutine may
// share.
type jsonLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *jsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *jsonLog) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// lines parses the log and empties it.
func (l *jsonLog) lines(t *testing.T) []logLine {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logLine
	for _, s := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if s == "" {
			continue
		}
		var ln logLine
		if err := json.Unmarshal([]byte(s), &ln); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, ln)
	}
	l.buf.Reset()
	return out
}

// An outage tried every second for two and a half minutes is three WARN
// lines (down, then still down after one and two minutes) and one INFO when
// it ends; a success while up and a second success log nothing; the next
// failure begins a new outage.
func TestOutageLogsStateChanges(t *testing.T) {
	var logs jsonLog
	o := NewOutage(logs.logger(), "sampler: read")
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o.now = func() time.Time { return clock }

	o.Succeeded()
	boom := errors.New("connection refused")
	for range 150 {
		o.Failed(boom, "extra", 1)
		clock = clock.Add(time.Second)
	}
	if !o.Down() {
		t.Error("Down() = false during the outage")
	}
	o.Succeeded()
	o.Succeeded()
	if o.Down() {
		t.Error("Down() = true after a success")
	}
	o.Failed(boom)

	got := logs.lines(t)
	want := []logLine{
		{Level: "WARN", Msg: "sampler: read", State: "down", Error: "connection refused"},
		{Level: "WARN", Msg: "sampler: read", State: "still down", Error: "connection refused", DownFor: "1m0s", Attempts: 61},
		{Level: "WARN", Msg: "sampler: read", State: "still down", Error: "connection refused", DownFor: "2m0s", Attempts: 121},
		{Level: "INFO", Msg: "sampler: read", State: "up", DownFor: "2m30s", Attempts: 150},
		{Level: "WARN", Msg: "sampler: read", State: "down", Error: "connection refused"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// Three loops of one process losing the database together (tried every
// second for two and a half minutes) warn as one: the first "down" is WARN
// and the others' INFO, one reminder a minute is WARN and the others INFO,
// and each loop's story is whole (down, still down a minute apart, up).
// Later, one loop failing alone warns (the others' outages are over), and
// so does a second failing more than a minute after it; a logger derived
// with With shares the record; an outage on a logger of its own warns as
// always.
func TestSharedOutagesWarnAsOne(t *testing.T) {
	var logs jsonLog
	log := slog.New(SharedOutages(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := func() time.Time { return clock }
	loops := []*Outage{NewOutage(log, "readiness"), NewOutage(log.With("loop", "j"), "janitor"), NewOutage(log, "sampler")}
	alone := NewOutage(logs.logger(), "alone")
	for _, o := range append(loops, alone) {
		o.now = now
	}
	boom := errors.New("connection refused")
	for second := range 150 {
		loops[second%3].Failed(boom) // each loop every third second
		clock = clock.Add(time.Second)
	}
	for _, o := range loops {
		o.Succeeded()
	}
	loops[2].Failed(boom)
	loops[2].Succeeded()
	clock = clock.Add(time.Second)
	loops[1].Failed(boom) // alone: the sampler's outage is over
	clock = clock.Add(61 * time.Second)
	loops[0].Failed(boom) // the janitor's is under way, but warned a minute ago
	alone.Failed(boom)

	type line struct{ level, msg, state string }
	var got []line
	lines := logs.lines(t)
	for _, l := range lines {
		got = append(got, line{l.Level, l.Msg, l.State})
	}
	if len(lines) > 3 && (lines[0].Outages != 1 || lines[1].Outages != 2 || lines[2].Outages != 3 || lines[1].Loop != "j") {
		t.Errorf("the first three lines count %d, %d, %d outages (janitor's loop %q), want 1, 2, 3 (\"j\")",
			lines[0].Outages, lines[1].Outages, lines[2].Outages, lines[1].Loop)
	}
	want := []line{
		{"WARN", "readiness", "down"}, {"INFO", "janitor", "down"}, {"INFO", "sampler", "down"},
		{"WARN", "readiness", "still down"}, {"INFO", "janitor", "still down"}, {"INFO", "sampler", "still down"},
		{"WARN", "readiness", "still down"}, {"INFO", "janitor", "still down"}, {"INFO", "sampler", "still down"},
		{"INFO", "readiness", "up"}, {"INFO", "janitor", "up"}, {"INFO", "sampler", "up"},
		{"WARN", "sampler", "down"}, {"INFO", "sampler", "up"},
		{"WARN", "janitor", "down"},
		{"WARN", "readiness", "down"},
		{"WARN", "alone", "down"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %v, want %v", i, got[i], want[i])
		}
	}
}

// Many goroutines failing at once begin one outage: one line.
func TestOutageConcurrentFailuresLogOnce(t *testing.T) {
	var logs jsonLog
	o := NewOutage(logs.logger(), "readyz")
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			<-start
			o.Failed(errors.New("down"))
		})
	}
	close(start)
	wg.Wait()
	o.Succeeded()
	got := logs.lines(t)
	if len(got) != 2 || got[0].State != "down" || got[1].State != "up" || got[1].Attempts != 32 {
		t.Errorf("lines %+v, want one down and one up after 32 attempts", got)
	}
}

// A loop's ceilings double to the cap while it fails, every attempt logged
// once (WARN for the first, DEBUG after) with its wait below its ceiling; a
// success resets the backoff, so the next outage starts again from First.
func TestLoopBacksOffAndResetsAfterSuccess(t *testing.T) {
	var logs jsonLog
	l := NewLoop(logs.logger(), "relay: publish events", Policy{First: time.Millisecond, Max: 8 * time.Millisecond})
	ctx := context.Background()
	boom := errors.New("no database")
	for range 6 {
		if !l.Fail(ctx, boom) {
			t.Fatal("Fail reported an ended context")
		}
	}
	l.Succeed()
	l.Succeed()
	l.Fail(ctx, boom)

	got := logs.lines(t)
	wantCeilings := []string{"1ms", "2ms", "4ms", "8ms", "8ms", "8ms", "", "1ms"}
	wantStates := []string{"down", "retrying", "retrying", "retrying", "retrying", "retrying", "up", "down"}
	if len(got) != len(wantStates) {
		t.Fatalf("%d lines, want %d: %+v", len(got), len(wantStates), got)
	}
	for i, ln := range got {
		if ln.State != wantStates[i] || ln.Ceiling != wantCeilings[i] {
			t.Errorf("line %d: state %q ceiling %q, want %q %q", i, ln.State, ln.Ceiling, wantStates[i], wantCeilings[i])
		}
		if ln.Ceiling != "" {
			wait, err1 := time.ParseDuration(ln.RetryIn)
			ceiling, err2 := time.ParseDuration(ln.Ceiling)
			if err1 != nil || err2 != nil || wait < 0 || wait > ceiling {
				t.Errorf("line %d: retry_in %q, ceiling %q", i, ln.RetryIn, ln.Ceiling)
			}
		}
	}
	if up := got[6]; up.Level != "INFO" || up.Attempts != 6 {
		t.Errorf("the end of the outage: %+v, want INFO after 6 attempts", up)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if l.Fail(cancelled, boom) {
		t.Error("Fail with an ended context reported it live")
	}
}
