package limits

import (
	"testing"
	"time"
)

func TestMeasureGivesPlausibleFloors(t *testing.T) {
	r, err := Measure(t.TempDir(), 200)
	if err != nil {
		t.Fatal(err)
	}
	// A loopback round trip is microseconds, never zero and never a second; an fsync to
	// a real disk costs more than a loopback round trip.
	if r.LoopbackRTTP50us <= 0 || r.LoopbackRTTP50us > 10_000 {
		t.Errorf("loopback round trip p50 %.1f µs", r.LoopbackRTTP50us)
	}
	if r.FsyncP50us <= 0 || r.FsyncP50us > float64(time.Second/time.Microsecond) {
		t.Errorf("fsync p50 %.1f µs", r.FsyncP50us)
	}
	if r.LoopbackRTTP99us < r.LoopbackRTTP50us || r.FsyncP99us < r.FsyncP50us {
		t.Errorf("p99 below p50: %+v", r)
	}
	t.Log(r)
}

func TestPercentiles(t *testing.T) {
	ds := []time.Duration{5 * time.Microsecond, 1 * time.Microsecond, 3 * time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond}
	if got := pct(ds, 50); got != 3 {
		t.Fatalf("p50 = %v µs, want 3", got)
	}
	if got := pct(ds, 100); got != 5 {
		t.Fatalf("p100 = %v µs, want 5", got)
	}
}
