package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/exactlyonce/payments/internal/cards"
	"github.com/exactlyonce/payments/internal/httpapi"
	"github.com/exactlyonce/payments/internal/payment"
)

const chargeCommandsUsage = `usage:
  payments charges resolve CHARGE_ID --as succeeded|failed --reason TEXT --operator NAME
      settle a card charge in requires_review from the processor's records (audited); prints the charge`

// charges runs the operator's commands on charges: resolve settles a card
// charge in review (cards.Cards.Resolve) and prints it as JSON. It needs
// the database only: the processor is not called.
func charges(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(chargeCommandsUsage)
	}
	if isHelp(args[0]) {
		_, err := fmt.Fprintln(stdout, chargeCommandsUsage)
		return err
	}
	if args[0] != "resolve" {
		return fmt.Errorf("unknown charges command %q\n%s", args[0], chargeCommandsUsage)
	}
	const cmd = "charges resolve"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	as := fs.String("as", "", "what the processor's records say it did: succeeded (it kept the money; a charge created "+
		"with capture false becomes authorized) or failed (it did not) (required)")
	reason := fs.String("reason", "", fmt.Sprintf("the evidence, kept in the audit: what the processor's records show "+
		"(required, at most %d characters)", cards.MaxReasonLength))
	operator := fs.String("operator", "", fmt.Sprintf("who settles it, kept in the audit (required, at most %d characters)",
		cards.MaxOperatorLength))
	load := addSettings(fs, cmd, getenv)
	synopsis := commandNamed(cmd).usage()
	if err := parseFlags(fs, args[1:], synopsis, stdout, stderr); err != nil {
		return err
	}
	// One CHARGE_ID, before or after the flags.
	if fs.NArg() == 0 {
		return fmt.Errorf("%s: name the charge to settle: %s", cmd, synopsis)
	}
	given := fs.Arg(0)
	if err := parseFlags(fs, fs.Args()[1:], synopsis, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q\n%s", cmd, fs.Arg(0), chargeCommandsUsage)
	}
	id, ok := payment.ParseID(payment.PrefixCharge, given)
	if !ok {
		return fmt.Errorf("%s: %q is not a charge id (ch_ and 32 hexadecimal digits)", cmd, given)
	}
	for _, f := range []struct{ name, value string }{{"as", *as}, {"reason", *reason}, {"operator", *operator}} {
		if f.value == "" {
			return fmt.Errorf("%s: --%s is required\n%s", cmd, f.name, chargeCommandsUsage)
		}
	}
	store, err := openAdmin(ctx, load)
	if err != nil {
		return err
	}
	defer store.Close()
	// No processor: Resolve calls none, and every other use is refused.
	c := cards.New(store.Cards, cards.Options{Render: httpapi.RenderCardCharge})
	settled, err := c.Resolve(ctx, cards.Settlement{Charge: id, As: payment.ChargeStatus(*as), Reason: *reason, Operator: *operator})
	switch {
	case errors.Is(err, payment.ErrNotFound):
		return fmt.Errorf("%s: unknown card charge %s", cmd, given)
	case err != nil:
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return json.NewEncoder(stdout).Encode(settled)
}
