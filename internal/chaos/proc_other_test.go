//go:build !linux

package chaos_test

import "os/exec"

// dieWithParent is a no-op where the kernel has no parent-death signal: the
// tests' cleanups still kill every process they started.
func dieWithParent(*exec.Cmd) {}

// memoryOf cannot read a process's memory here; see proc_linux_test.go.
func memoryOf(int) (rss, peak int64, err error) { return 0, 0, errNoProcfs }
