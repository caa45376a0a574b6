package main

import (
	"context"
	"errors"
	"log"
)

// runBench is make bench.
func runBench(context.Context, *log.Logger) error {
	return errors.New("not yet")
}
