package main

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
)

// servePprof serves Go's profiler on its own listener at addr (PPROF_ADDR),
// never on the API's: profiles show internals and cost CPU, so they are for
// an operator on the machine, opted into. It returns a function that stops it.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveAside("PPROF_ADDR", addr, mux, log, "profiler listening")
}
