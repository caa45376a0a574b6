package benchrun

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcessCPUTicks returns the user plus system CPU time of process pid so
// far, in clock ticks (getconf CLK_TCK), from /proc/PID/stat (fields 14 and
// 15).
func ProcessCPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return ParseCPUTicks(string(b))
}

// ParseCPUTicks reads utime and stime from the text of /proc/PID/stat. The
// command name (field 2) is in parentheses and may hold spaces, so fields are
// counted after its closing parenthesis.
func ParseCPUTicks(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/PID/stat: no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command name, want at least 13", len(f))
	}
	var sum int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: utime or stime %q: %w", s, err)
		}
		sum += n
	}
	return sum, nil
}
