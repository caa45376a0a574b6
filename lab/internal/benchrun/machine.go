package benchrun

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strings"
)

// Machine describes where a run ran, for the report's table.
type Machine struct {
	CPUs     int
	CPU      string
	Memory   string
	OS       string
	Go       string
	Commit   string
	Revision string // the short commit alone
}

// Describe reads the machine, the Go toolchain goBin and the checkout.
func Describe(goBin string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), CPU: "unknown", Memory: "unknown", OS: "unknown", Go: "unknown", Revision: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if s := regexp.MustCompile(`(?m)^model name\s*: (.*)$`).FindSubmatch(b); s != nil {
			m.CPU = string(s[1])
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.Memory = fmt.Sprintf("%.1f GiB", kb/1048576)
		}
	}
	m.OS = command("uname", "-sr")
	m.Go = strings.TrimPrefix(command(goBin, "version"), "go version ")
	m.Revision = command("git", "rev-parse", "--short", "HEAD")
	m.Commit = m.Revision
	if command("git", "status", "--porcelain") != "" {
		m.Commit += " with uncommitted changes"
	}
	return m
}

// command is cmd's trimmed output, "unknown" when it fails.
func command(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

var logLevel = regexp.MustCompile(`"level":"(WARN|ERROR)".*?"msg":"([^"]*)"`)

// LogWarnings counts the distinct WARN and ERROR messages in the service
// logs at paths, except "NATS disconnected", which every shutdown logs:
// "WARN msg ×2; ERROR other ×1", "" when there are none.
func LogWarnings(paths ...string) string {
	counts := map[string]int{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := logLevel.FindStringSubmatch(sc.Text()); m != nil && m[2] != "NATS disconnected" {
				counts[m[1]+" "+m[2]]++
			}
		}
		_ = f.Close()
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, counts[k])
	}
	return strings.Join(parts, "; ")
}
