package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheck asks the running service whether it is ready (GET /readyz) and
// fails unless it answers 200. It is the container healthcheck of
// docker-compose.yml: the image has no shell, curl or wget.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	target := fs.String("url", "", "the URL to GET (default: /readyz at $HTTP_ADDR, on 127.0.0.1 when it names no host)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	if err := parseFlags(fs, args, "usage: payments healthcheck [flags]", stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("healthcheck: unexpected argument %q", fs.Arg(0))
	}
	if *target == "" {
		*target = readyzURL(getenv("HTTP_ADDR"))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: GET %s: %s %s", *target, resp.Status, bytes.TrimSpace(body))
	}
	_, err = fmt.Fprintf(stdout, "GET %s: %s %s\n", *target, resp.Status, bytes.TrimSpace(body))
	return err
}

// readyzURL is the /readyz URL of a service listening on addr (HTTP_ADDR,
// default :8080), on 127.0.0.1 when addr names no host or all of them.
func readyzURL(addr string) string {
	if addr == "" {
		addr = ":8080"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/readyz"
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz"
}
