package main

import (
	"context"
	"log"
	"time"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// scratch is one measurement's service and the database it runs on, as
// bench-pair and batch-cost make a new pair of them per measurement.
type scratch struct {
	svc *benchrun.Service
	db  string // the database's name while it exists
}

// end stops the service and drops the database on admin's server, within a
// minute whether or not ctx was cancelled; a drop that fails is logged.
func (s *scratch) end(ctx context.Context, admin string, logger *log.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.svc.Stop()
	s.svc = nil
	if s.db != "" {
		if err := benchrun.DropDB(ctx, admin, s.db); err != nil {
			logger.Printf("could not drop %s: %v", s.db, err)
		}
		s.db = ""
	}
}
