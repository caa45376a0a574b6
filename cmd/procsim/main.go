// Command procsim runs the card processor simulator (internal/procsim), a
// process of its own with a PostgreSQL database of its own.
//
//	procsim serve [flags]   answer the processor API (docs/processors.md)
//	procsim audit [flags]   print what was done to every reference, as JSON
//
// Each flag has an environment variable (PROCSIM_*); a flag overrides it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/exactlyonce/payments/internal/postgres"
	"github.com/exactlyonce/payments/internal/procsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "procsim:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  procsim serve [flags]   answer the processor API
  procsim audit [flags]   print what was done to every reference (JSON)`

// run is the whole program behind main, so tests can drive the real wiring.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("missing command\n%s", usage)
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], getenv, stdout, stderr)
	case "audit":
		err = audit(ctx, args[1:], getenv, stdout)
	case "-h", "-help", "--help", "help":
		_, err = fmt.Fprintln(stdout, usage)
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h printed the usage to stdout
	}
	return err
}

// settings are the flags of serve, each defaulting to its variable.
type settings struct {
	addr, databaseURL string
	cfg               procsim.Config
}

func parseServe(args []string, getenv func(string) string, stdout io.Writer) (settings, error) {
	s := settings{cfg: procsim.DefaultConfig()}
	fs := flag.NewFlagSet("procsim serve", flag.ContinueOnError)
	fs.SetOutput(stdout)
	env := envDefaults{getenv: getenv}
	fs.StringVar(&s.addr, "addr", env.str("PROCSIM_ADDR", "127.0.0.1:8090"), "listen address (PROCSIM_ADDR); port 0 picks one, printed at start")
	fs.StringVar(&s.databaseURL, "database-url", env.str("PROCSIM_DATABASE_URL", ""), "the simulator's own database (PROCSIM_DATABASE_URL)")
	fs.DurationVar(&s.cfg.DecisionDeadline, "decision-deadline", env.dur("PROCSIM_DECISION_DEADLINE", s.cfg.DecisionDeadline), "an approval never answered is cancelled after it (PROCSIM_DECISION_DEADLINE)")
	fs.DurationVar(&s.cfg.LateDelay, "late-delay", env.dur("PROCSIM_LATE_DELAY", s.cfg.LateDelay), "pm_card_approve_answer_late answers after it (PROCSIM_LATE_DELAY)")
	fs.DurationVar(&s.cfg.SlowDelay, "slow-delay", env.dur("PROCSIM_SLOW_DELAY", s.cfg.SlowDelay), "pm_card_slow and the random delay answer after it (PROCSIM_SLOW_DELAY)")
	fs.DurationVar(&s.cfg.AsyncDelay, "async-delay", env.dur("PROCSIM_ASYNC_DELAY", s.cfg.AsyncDelay), "pm_card_async_pending is decided after it (PROCSIM_ASYNC_DELAY)")
	fs.StringVar(&s.cfg.WebhookURL, "webhook-url", env.str("PROCSIM_WEBHOOK_URL", ""), "where async outcomes are POSTed (PROCSIM_WEBHOOK_URL)")
	fs.StringVar(&s.cfg.WebhookSecret, "webhook-secret", env.str("PROCSIM_WEBHOOK_SECRET", ""), "signs the webhooks (PROCSIM_WEBHOOK_SECRET)")
	fs.Float64Var(&s.cfg.FaultRate, "fault-rate", env.float("PROCSIM_FAULT_RATE", 0), "probability of a random fault per request; 0 is off (PROCSIM_FAULT_RATE)")
	fs.Uint64Var(&s.cfg.FaultSeed, "fault-seed", env.uint("PROCSIM_FAULT_SEED", s.cfg.FaultSeed), "seed of the random faults (PROCSIM_FAULT_SEED)")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if err := errors.Join(env.err, s.cfg.Validate()); err != nil {
		return s, err
	}
	if s.databaseURL == "" {
		return s, errors.New("PROCSIM_DATABASE_URL (or -database-url) is required")
	}
	return s, nil
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	s, err := parseServe(args, getenv, stdout)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	// Its own database, created when missing, so make run needs no psql.
	if err := postgres.EnsureDatabase(ctx, "PROCSIM_DATABASE_URL", s.databaseURL, "ENCODING 'UTF8' TEMPLATE template0", stderr); err != nil {
		return err
	}
	store, err := procsim.OpenStore(ctx, s.databaseURL)
	if err != nil {
		return err
	}
	defer store.Close()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	sim := procsim.NewServer(s.cfg, store, log)
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	work, stopWork := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); sim.Run(work) }()
	fmt.Fprintf(stdout, "procsim: listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(shutdown)
		cancel()
	}
	stopWork()
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func audit(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("procsim audit", flag.ContinueOnError)
	fs.SetOutput(stdout)
	url := fs.String("database-url", getenv("PROCSIM_DATABASE_URL"), "the simulator's database (PROCSIM_DATABASE_URL)")
	ref := fs.String("reference", "", "only this reference of ours")
	if err := fs.Parse(args); err != nil {
		return err
	}
	store, err := procsim.OpenStore(ctx, *url)
	if err != nil {
		return err
	}
	defer store.Close()
	a, err := store.Audit(ctx, *ref)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(a)
}

// envDefaults reads flag defaults from the environment, keeping the first
// unparsable value's error.
type envDefaults struct {
	getenv func(string) string
	err    error
}

func (e *envDefaults) str(name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

func (e *envDefaults) parse(name string, f func(string) error) {
	if v := e.getenv(name); v != "" {
		if err := f(v); err != nil && e.err == nil {
			e.err = fmt.Errorf("%s=%q: %w", name, v, err)
		}
	}
}

func (e *envDefaults) dur(name string, def time.Duration) time.Duration {
	e.parse(name, func(v string) (err error) { def, err = time.ParseDuration(v); return err })
	return def
}

func (e *envDefaults) float(name string, def float64) float64 {
	e.parse(name, func(v string) (err error) { def, err = strconv.ParseFloat(v, 64); return err })
	return def
}

func (e *envDefaults) uint(name string, def uint64) uint64 {
	e.parse(name, func(v string) (err error) { def, err = strconv.ParseUint(v, 10, 64); return err })
	return def
}
