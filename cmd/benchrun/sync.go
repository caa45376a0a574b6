package main

import (
	"context"
	"errors"
	"log"
)

// runSync is make bench-sync; scripts/bench-sync.sh still runs it in bash
// until it moves here.
func runSync(context.Context, *log.Logger) error {
	return errors.New("not yet: make bench-sync runs scripts/bench-sync.sh")
}
