package main

import "testing"

func TestLastLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, data string
		n          int
		want       string
	}{
		{"more lines than asked", "a\nb\nc\nd\n", 2, "c\nd\n"},
		{"no final newline", "a\nb\nc", 2, "b\nc\n"},
		{"fewer lines than asked", "a\nb\n", 15, "a\nb\n"},
		{"exactly as many", "a\nb\n", 2, "a\nb\n"},
		{"one line", "only", 3, "only\n"},
		{"empty", "", 15, ""},
	}
	for _, tt := range tests {
		if got := string(lastLines([]byte(tt.data), tt.n)); got != tt.want {
			t.Errorf("%s: lastLines(%q, %d) = %q, want %q", tt.name, tt.data, tt.n, got, tt.want)
		}
	}
}
