package procsim

import (
	"errors"
	"time"
)

// Config is what the simulator is told at start; cmd/procsim reads it from
// flags and the environment.
type Config struct {
	// DecisionDeadline is how long an authorization whose answer was never
	// delivered stays approved before the simulator cancels it (Adyen: 120 s).
	DecisionDeadline time.Duration
	LateDelay        time.Duration // pm_card_approve_answer_late answers after it
	SlowDelay        time.Duration // pm_card_slow (and a random delay fault) answers after it
	AsyncDelay       time.Duration // pm_card_async_pending is decided after it
	WebhookURL       string        // where async outcomes are POSTed; "" sends none
	WebhookSecret    string        // signs them (Procsim-Signature)
	FaultRate        float64       // probability of a random fault per POST; 0 turns them off
	FaultSeed        uint64        // seeds the random faults
}

// DefaultConfig returns the defaults documented in docs/processors.md.
func DefaultConfig() Config {
	return Config{
		DecisionDeadline: 120 * time.Second,
		LateDelay:        30 * time.Second,
		SlowDelay:        2 * time.Second,
		AsyncDelay:       2 * time.Second,
		FaultSeed:        1,
	}
}

// Validate returns an error naming the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.DecisionDeadline <= 0:
		return errors.New("the decision deadline must be positive")
	case c.LateDelay < 0 || c.SlowDelay < 0 || c.AsyncDelay < 0:
		return errors.New("delays must not be negative")
	case c.FaultRate < 0 || c.FaultRate > 1:
		return errors.New("the fault rate must be between 0 and 1")
	case c.WebhookURL != "" && c.WebhookSecret == "":
		return errors.New("a webhook URL needs a webhook secret")
	}
	return nil
}

// tick is how often the background work (async decisions, the decision
// deadline, webhook deliveries) looks for something to do.
func (c Config) tick() time.Duration {
	t := min(c.DecisionDeadline/10, c.AsyncDelay/4, time.Second)
	return max(t, 20*time.Millisecond)
}
