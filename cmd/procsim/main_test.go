package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunRefusesBadSettings: settings that cannot work stop the command at
// start, naming what is wrong, before any database is opened.
func TestRunRefusesBadSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no command", nil, nil, "missing command"},
		{"unknown command", []string{"charge"}, nil, `unknown command "charge"`},
		{"no database", []string{"serve"}, nil, "PROCSIM_DATABASE_URL"},
		{"fault rate", []string{"serve", "-fault-rate", "2"}, map[string]string{"PROCSIM_DATABASE_URL": "postgres://x"}, "fault rate"},
		{"webhook without secret", []string{"serve"}, map[string]string{"PROCSIM_DATABASE_URL": "postgres://x", "PROCSIM_WEBHOOK_URL": "http://127.0.0.1:1"}, "webhook secret"},
		{"bad deadline", []string{"serve"}, map[string]string{"PROCSIM_DATABASE_URL": "postgres://x", "PROCSIM_DECISION_DEADLINE": "soon"}, "PROCSIM_DECISION_DEADLINE"},
		{"zero deadline", []string{"serve", "-decision-deadline", "0s"}, map[string]string{"PROCSIM_DATABASE_URL": "postgres://x"}, "decision deadline"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var out, errs bytes.Buffer
			err := run(t.Context(), c.args, func(k string) string { return c.env[k] }, &out, &errs)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// TestHelp prints the usage and the flags to stdout, and succeeds.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"serve", "-h"}, {"audit", "-h"}} {
		var out, errs bytes.Buffer
		if err := run(t.Context(), args, func(string) string { return "" }, &out, &errs); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if out.Len() == 0 || errs.Len() != 0 {
			t.Fatalf("%v: stdout %q, stderr %q", args, out.String(), errs.String())
		}
	}
}
