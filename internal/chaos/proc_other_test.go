//go:build !linux

package chaos_test

import "os/exec"

// dieWithParent is a no-op where the kernel has no parent-death signal: the
// tests' cleanups still kill every process they started.
func dieWithParent(*exec.Cmd) {}
