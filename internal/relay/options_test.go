package relay

import (
	"testing"
	"time"
)

// Zero and negative options take the defaults; set ones are kept.
func TestOptionsDefaults(t *testing.T) {
	want := Options{Batch: 100, Poll: time.Second, Retention: 30 * 24 * time.Hour, PruneBatch: 1000, MaxBackoff: 5 * time.Second}
	for _, in := range []Options{{}, {Batch: -1, Poll: -1, Retention: -1, PruneBatch: -1, MaxBackoff: -1}} {
		if got := in.withDefaults(); got != want {
			t.Errorf("%+v.withDefaults() = %+v, want %+v", in, got, want)
		}
	}
	set := Options{Batch: 1, Poll: time.Millisecond, Retention: time.Minute, PruneBatch: 1, MaxBackoff: time.Millisecond}
	if got := set.withDefaults(); got != set {
		t.Errorf("%+v.withDefaults() = %+v, want it unchanged", set, got)
	}
}
