package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the command itself when a test starts this test binary as
// hacluster (HACLUSTER_RUN_MAIN=1), so that reap's wait4(-1) never reaps
// another test's children.
func TestMain(m *testing.M) {
	if os.Getenv("HACLUSTER_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hacluster returns the command that runs this test binary as hacluster
// with args.
func hacluster(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "HACLUSTER_RUN_MAIN=1")
	return cmd
}

// TestReapAdoptsAndReapsOrphans: a process that reap's child starts and
// leaves (as Patroni leaves its postmaster) becomes reap's, not PID 1's, and
// is reaped as soon as it is killed, not left a zombie that Patroni would
// count as running. reap passes SIGTERM on and exits as its child did.
func TestReapAdoptsAndReapsOrphans(t *testing.T) {
	t.Parallel()
	// The inner shell starts an orphan, prints its pid and exits; the outer
	// one becomes a sleep, reap's child for as long as the test wants.
	cmd := hacluster("reap", "sh", "-c", `sh -c 'sleep 300 >/dev/null 2>&1 & echo $!'; exec sleep 300`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the orphan's pid: %v", err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the orphan's pid: %q", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	// Adopted once the inner shell, which printed the pid, has exited.
	for deadline := time.Now().Add(5 * time.Second); parentOf(t, orphan) != cmd.Process.Pid; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan's parent is %d after 5 s, want reap (%d)", parentOf(t, orphan), cmd.Process.Pid)
		}
	}
	if err := syscall.Kill(orphan, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed orphan %d is still in /proc after 5 s: reap did not reap it", orphan)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("reap after SIGTERM to its sleeping child: %v, want exit status 1 (its child ended by the signal)", err)
	}
}

func TestReapExitsAsItsChild(t *testing.T) {
	t.Parallel()
	for code, script := range map[int]string{0: "exit 0", 3: "exit 3"} {
		err := hacluster("reap", "sh", "-c", script).Run()
		var exit *exec.ExitError
		switch {
		case code == 0 && err != nil:
			t.Errorf("reap sh -c %q: %v, want success", script, err)
		case code != 0 && (!errors.As(err, &exit) || exit.ExitCode() != code):
			t.Errorf("reap sh -c %q: %v, want exit status %d", script, err, code)
		}
	}
}

// parentOf returns pid's parent, from /proc/PID/status.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return ppid
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}
