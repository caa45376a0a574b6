package chaos_test

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the service if the test binary dies
// first (a panic or a -timeout), so no process outlives its test.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
