package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// serveMetrics serves h at /metrics on its own listener at addr
// (METRICS_ADDR), never on the API's: what a scrape shows is for operators. It
// returns a function that stops it.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return serveAside("METRICS_ADDR", addr, mux, log, "metrics listening")
}

// serveAside serves h on a listener of its own at addr, the value of the
// variable named setting, and logs msg with the address it got. It returns a
// function that stops it.
func serveAside(setting, addr string, h http.Handler, log *slog.Logger, msg string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s: %w", setting, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: maxHeaderBytes}
	go func() { _ = srv.Serve(ln) }()
	log.Info(msg, "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
