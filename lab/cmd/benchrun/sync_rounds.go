package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/exactlyonce/payments/lab/internal/benchrun"
)

// syncConfigs are the three configurations, in the report's order.
var syncConfigs = []string{"A", "B", "C"}

// syncOrder is the order of the configurations in round r (from 1): A B C,
// then C B A, so that drift on a shared machine falls on all three.
func syncOrder(r int) []string {
	if r%2 == 1 {
		return []string{"A", "B", "C"}
	}
	return []string{"C", "B", "A"}
}

// syncRunName names a load-generator run: A-c16-r1.
func syncRunName(cfg string, clients, round int) string {
	return fmt.Sprintf("%s-c%d-r%d", cfg, clients, round)
}

// syncRefTag names the pg-reference run that follows it: A-ref-c16-r1.
func syncRefTag(cfg string, clients, round int) string {
	return fmt.Sprintf("%s-ref-c%d-r%d", cfg, clients, round)
}

// runRounds runs every round, each after checking the cluster.
func (s *syncRun) runRounds(ctx context.Context) error {
	s.log.Printf("%d rounds of A (sync standby), B (synchronous_commit=local), C (single server); "+
		"fresh at %s clients, %d s a run", s.rounds, s.clientList(), s.seconds)
	for r := 1; r <= s.rounds; r++ {
		if err := s.checkCluster(ctx); err != nil {
			return err
		}
		order := syncOrder(r)
		s.log.Printf("round %d of %d (%s)", r, s.rounds, strings.Join(order, " "))
		for _, cfg := range order {
			if err := s.runConfig(ctx, cfg, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// runConfig is one configuration's turn in round r: a CHECKPOINT, a fresh
// service, the fresh scenario at each client count, then pg-reference at
// each. A run without a result is noted in lost; the round goes on.
func (s *syncRun) runConfig(ctx context.Context, cfg string, r int) error {
	database, key, admin := s.haDB, s.haKey, s.cluster.primary.admin()
	if cfg == "C" {
		database, key, admin = s.localDB, s.localKey, s.localAdmin
	}
	var refEnv []string
	if cfg == "B" {
		if err := s.setSyncLocal(ctx); err != nil {
			return err
		}
		refEnv = []string{"PGOPTIONS=-c synchronous_commit=local"}
	}
	if err := benchrun.Exec(ctx, benchrun.WithDB(admin, s.db), "CHECKPOINT"); err != nil {
		return err
	}
	svc, err := benchrun.Start(ctx, "", database, fmt.Sprintf("bin/bench-sync-server-%s-r%d.log", cfg, r))
	if err != nil {
		return err
	}
	s.service = svc
	for _, n := range s.clients {
		tag := syncRunName(cfg, n, r)
		run, err := s.loadgen.Fresh(ctx, tag, svc.URL, key, n, "-d", fmt.Sprintf("%ds", s.seconds))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			s.log.Print(err)
			s.lost = append(s.lost, tag)
		default:
			s.log.Print("  " + benchrun.Summary(run))
		}
	}
	svc.Stop()
	s.service = nil
	if cfg == "B" {
		if err := benchrun.Exec(ctx, s.haPrimaryDB, syncResetCommit(s.db)); err != nil {
			return err
		}
	}
	return s.runReferences(ctx, cfg, r, admin, refEnv)
}

// runReferences runs pg-reference at each client count on admin's server.
// Interrupted, the run under way finishes first: pg-reference drops its
// own scratch database only when it ends by itself.
func (s *syncRun) runReferences(ctx context.Context, cfg string, r int, admin string, env []string) error {
	for _, n := range s.clients {
		tag := syncRefTag(cfg, n, r)
		rr, err := s.ref.Run(context.WithoutCancel(ctx), tag, n, admin, env...)
		if err != nil {
			s.log.Print(err)
			s.lost = append(s.lost, tag)
		} else {
			s.log.Printf("  pg-reference -c %d (%s): %s tps, avg %s ms, p50 %s ms, p99 %s ms", n, tag, rr.TPS, rr.Avg, rr.P50, rr.P99)
			if err := s.ref.WriteFile(syncPgrefPath); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}
