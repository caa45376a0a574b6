package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// reap runs argv (Patroni) as its child and waits for every process
// orphaned below it, until the child exits; it exits as the child did.
// Patroni leaves its postmaster to "the init process" to reap (it starts it
// from a process that exits at once), and a killed postmaster stays a
// zombie until it is reaped, which Patroni's psutil counts as running: under
// a PID 1 that reaps only every second or two (this development machine's
// did, measured 1.3-1.7 s), Patroni failed over that much later, one or two
// of its loops. As a child subreaper (subreaper_linux.go), reap is where
// orphans go instead, and it reaps them at once, as a proper init does.
// SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1 and SIGUSR2 are passed on to the
// child: `down` stops Patroni by stopping reap.
func reap(argv []string) error {
	if len(argv) == 0 {
		return errors.New("usage: hacluster reap PROGRAM [ARGS]")
	}
	if err := becomeSubreaper(); err != nil {
		return fmt.Errorf("become a child subreaper: %w", err)
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // G204: patroni with a configuration in HA_DIR, as up starts it
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	child := cmd.Process.Pid
	go func() {
		for s := range signals {
			_ = cmd.Process.Signal(s)
		}
	}()
	// Only wait4(-1) reaps here, never cmd.Wait: it would race for the
	// child's status.
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("wait for %s: %w", argv[0], err)
		case pid != child:
			continue // an orphan: a killed postmaster, its backends
		case status.Exited() && status.ExitStatus() == 0:
			return nil
		case status.Exited():
			return exitError(status.ExitStatus())
		default:
			return fmt.Errorf("%s ended by %v", argv[0], status.Signal())
		}
	}
}

// exitError is the child's exit status, which reap exits with.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
