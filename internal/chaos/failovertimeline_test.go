package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// timeline is what happened between a fault and the first charge after it,
// each step with its time: what Patroni named leader and synchronous standby
// and when, each change of /readyz's answer, the fault's end and the first
// charge's answer. It says which step of a recovery took the time.
type timeline struct {
	mu    sync.Mutex
	steps []timedStep
}

type timedStep struct {
	at   time.Time
	what string
}

// add records that what happened now.
func (tl *timeline) add(what string) { tl.addAt(time.Now(), what) }

// addAt records that what happened at at.
func (tl *timeline) addAt(at time.Time, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.steps = append(tl.steps, timedStep{at, what})
}

// attempts returns a hook for withAttempts that records each change of the
// outcome of what's attempts: "what, attempt 12: 503 service-unavailable",
// "what, attempt 20: no answer (context deadline exceeded ...)".
func (tl *timeline) attempts(what string) func(int, answer, error) {
	last := ""
	return func(attempt int, a answer, err error) {
		outcome := fmt.Sprintf("%d %s", a.status, a.code())
		if err != nil {
			outcome = "no answer (" + err.Error() + ")"
		}
		if outcome != last {
			tl.add(fmt.Sprintf("%s, attempt %d: %s", what, attempt, outcome))
			last = outcome
		}
	}
}

// from renders the steps in the order they happened, each at its time from
// zero: "+3.052s the fault done; +4.61s Patroni: leader pg1 (running), ...".
func (tl *timeline) from(zero time.Time) string {
	tl.mu.Lock()
	steps := slices.Clone(tl.steps)
	tl.mu.Unlock()
	slices.SortStableFunc(steps, func(a, b timedStep) int { return a.at.Compare(b.at) })
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = fmt.Sprintf("%+.3fs %s", s.at.Sub(zero).Seconds(), s.what)
	}
	return strings.Join(out, "; ")
}

// readyWatch watches a recovery from the fault until the first charge after
// it: it asks /readyz every 50 ms and counts its statuses (it must say 503
// while no primary is reachable), asks Patroni for the cluster every 100 ms,
// and commits on the cluster itself, one commit after another (canary); it
// records on a timeline each change of /readyz's status, of the members'
// roles and states, and of the commits' outcome.
type readyWatch struct {
	stop    chan struct{}
	stopped context.Context // ends when stop closes: it cancels the canary
	seen    chan map[int]int
	steps   *timeline
	done    sync.WaitGroup
	// commits are when the canary's commits returned, in order.
	mu      sync.Mutex
	commits []time.Time
}

// watchReady starts a readyWatch of c's service and of cl; end stops it.
func watchReady(ctx context.Context, c *client, cl *cluster) *readyWatch {
	w := &readyWatch{stop: make(chan struct{}), seen: make(chan map[int]int, 1), steps: &timeline{}}
	stopped, cancel := context.WithCancel(ctx)
	w.stopped = stopped
	go func() { <-w.stop; cancel() }()
	w.done.Add(3)
	go func() {
		defer w.done.Done()
		w.canary(cl.url)
	}()
	go func() {
		defer w.done.Done()
		seen, last := map[int]int{}, 0
		defer func() { w.seen <- seen }()
		for w.wait(50 * time.Millisecond) {
			a, err := c.send(ctx, 1, http.MethodGet, "/readyz", "", nil)
			if err != nil {
				continue
			}
			seen[a.status]++
			if a.status != last {
				w.steps.add(fmt.Sprintf("/readyz %d", a.status))
				last = a.status
			}
		}
	}()
	go func() {
		defer w.done.Done()
		last := ""
		for w.wait(100 * time.Millisecond) {
			ms, err := cl.members()
			if err != nil {
				continue
			}
			if now := "Patroni: " + memberRoles(ms); now != last {
				w.steps.add(now)
				last = now
			}
		}
	}()
	return w
}

// memberRoles is the members as Patroni names them, by name: "pg1 leader/running,
// pg2 replica/stopped, pg3 sync_standby/streaming".
func memberRoles(ms []member) string {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.Name, b.Name) })
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name + " " + m.Role + "/" + m.State
	}
	return strings.Join(out, ", ")
}

// canaryCommit writes a transactional logical message: its commit, like a
// charge's, returns once a synchronous standby has it.
const canaryCommit = `SELECT pg_logical_emit_message(true, 'chaos-canary', '')`

// canary commits on the cluster at url, on whichever member accepts writes,
// one commit after another until the watch ends, and records each change of
// outcome on the timeline and the time of each commit that returned. A
// commit is never cancelled while it waits for the standby (PostgreSQL
// would then keep it with a WARNING, as if confirmed): it returns when a
// standby confirms it or its server dies, or when the watch ends.
func (w *readyWatch) canary(url string) {
	if !strings.Contains(url, "connect_timeout=") {
		url += map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "connect_timeout=2"
	}
	last := ""
	for w.wait(50 * time.Millisecond) {
		outcome := "committed"
		conn, err := pgx.Connect(w.stopped, url)
		if err == nil {
			_, err = conn.Exec(w.stopped, canaryCommit)
			conn.Close(context.Background())
		} else {
			// pgx names every host it tried, each on a line of its own: the
			// first line says what failed.
			first, _, _ := strings.Cut(err.Error(), "\n")
			err = errors.New(strings.TrimSuffix(first, ":"))
		}
		if w.stopped.Err() != nil {
			return
		}
		if err != nil {
			outcome = "failed (" + strings.Join(strings.Fields(err.Error()), " ") + ")"
		} else {
			w.mu.Lock()
			w.commits = append(w.commits, time.Now())
			w.mu.Unlock()
		}
		if outcome != last {
			w.steps.add("a commit on the cluster " + outcome)
			last = outcome
		}
	}
}

// committedSince returns when the first of the canary's commits to return
// after since did, or false when none has: the moment the cluster could
// commit again after a fault that ended at since.
func (w *readyWatch) committedSince(since time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := slices.IndexFunc(w.commits, func(at time.Time) bool { return at.After(since) })
	if i < 0 {
		return time.Time{}, false
	}
	return w.commits[i], true
}

// wait waits d and reports whether the watch goes on.
func (w *readyWatch) wait(d time.Duration) bool {
	select {
	case <-w.stop:
		return false
	case <-time.After(d):
		return true
	}
}

// end stops the watch and returns the count of each status /readyz gave.
func (w *readyWatch) end() map[int]int {
	close(w.stop)
	w.done.Wait()
	return <-w.seen
}
