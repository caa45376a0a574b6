// Package chaos proves the service's promise under injected faults: the real
// binary, run as separate processes against a real PostgreSQL database, is
// killed with SIGKILL mid-request, has its database acknowledgements dropped
// and its database cut off, runs as several replicas racing one key, and is fed
// hostile input, and delivers webhooks through kills and a receiver's outage;
// afterwards the tests count, in the database, duplicate charges, lost money,
// lost events and lost webhook deliveries, which must all be zero.
//
// It has no code of its own. Its tests run in make test in a short version;
// CHAOS_LONG=1 (make chaos) runs the long one. Each scenario logs one line
// starting "chaos-summary:" with its numbers, the rows of docs/reliability.md.
package chaos
