package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// procProfiler takes, during each phase of the first round (PROC_PROFILE=1),
// a CPU profile of the service over its measured seconds but the first and
// the last two, and its goroutines halfway (where requests wait), from the
// profiler the service serves at PPROF_ADDR, into PROC_OUT:
// profile-TAG.pprof and goroutines-TAG.txt (`go tool pprof -top
// bin/payments PROC_OUT/profile-now.pprof`). Profiling costs the service
// some CPU: a profiled run's figures are not a result.
type procProfiler struct {
	addr string // the profiler's host:port
	done chan struct{}
}

// profilerAddr reads the address of the "profiler listening" line of the
// service's JSON log, "" when there is none.
func profilerAddr(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "profiler listening" {
			return line.Addr
		}
	}
	return ""
}

// start profiles one phase of seconds in the background, its files named
// by tag in dir; wait returns when both are written (or failed, said on
// log).
func (p *procProfiler) start(ctx context.Context, dir, tag string, seconds int, log io.Writer) {
	p.done = make(chan struct{})
	cpu := max(seconds-4, 1)
	go func() {
		defer close(p.done)
		get := func(path, file string) {
			if err := fetchTo(ctx, "http://"+p.addr+path, filepath.Join(dir, file)); err != nil {
				fmt.Fprintf(log, "bench-processor: profile %s: %v\n", tag, err)
			}
		}
		if !benchrun.Sleep(ctx, 2*time.Second) {
			return
		}
		half := make(chan struct{})
		go func() {
			defer close(half)
			if benchrun.Sleep(ctx, time.Duration(cpu)*time.Second/2) {
				get("/debug/pprof/goroutine?debug=1", "goroutines-"+tag+".txt")
			}
		}()
		get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", cpu), "profile-"+tag+".pprof")
		<-half
	}()
}

// wait returns when the phase's profiles are written.
func (p *procProfiler) wait() {
	if p != nil && p.done != nil {
		<-p.done
		p.done = nil
	}
}

// fetchTo writes the body of GET url into the file at path.
func fetchTo(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
