package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// procStep is what make bench's processor step measured, for the report.
type procStep struct {
	Measured bool
	Outcome  procOutcome
	Note     string // why it did not measure, when it did not
	took     int
}

// processor is make bench's step of card charges (proc.go: make
// bench-processor in this process), at PROC_SECONDS or BENCH_SECONDS,
// publishing to the run's NATS; its section replaces the one the report
// carried. Its progress goes to bin/bench-processor.log. A build or a
// run that fails is noted in the report; BENCH_PROCESSOR=0 skips it, and
// the report keeps the section it had.
func (b *bench) processor(ctx context.Context) error {
	if !b.s.processor {
		return nil
	}
	began := time.Now()
	defer func() { b.proc.took = int(time.Since(began).Seconds()) }()
	s, err := readProcSettings(b.s.seconds)
	if err != nil {
		return err
	}
	// The load before make bench: its own steps load the machine since.
	s.admin, s.goBin, s.loadBefore = b.s.admin, b.s.goBin, b.loadBefore
	const logPath = "bin/bench-processor.log"
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	b.say("processor charges: building %s; %d rounds of %d s at %d clients (progress in %s)",
		procsimBin, s.rounds, s.seconds, s.clients, logPath)
	out, err := benchrun.BuildAt(ctx, b.s.goBin, "", "./cmd/procsim", procsimBin)
	_, _ = f.Write(out)
	if err != nil {
		b.proc.Note = fmt.Sprintf("%s did not build: %s", procsimBin, firstLines(string(out), 3))
		b.say("WARNING: processor charges not measured: %s", b.proc.Note)
		return nil
	}
	b.proc.Outcome, err = measureProcessor(ctx, s, log.New(f, "bench-processor: ", 0), f)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		fmt.Fprintf(f, "bench-processor: %v\n", err)
		b.proc.Note = "the run failed: " + strings.ReplaceAll(benchrun.Tail(logPath, 3), "\n", " ")
		b.say("WARNING: processor charges not measured: %v (see %s)", err, logPath)
		return nil
	}
	b.proc.Measured = true
	return nil
}
