package server

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// With loop polling on (Config.LoopSpin, --loop-spin), a loop polls before it sleeps: replies are the
// same whether a command finds it spinning (back-to-back round trips), asleep
// (after a pause longer than the spin) or busy with a pipeline.
func TestLoopSpinServesAsWithout(t *testing.T) {
	s := startServer(t, func(c *Config) { c.IOModel = IOEpoll; c.LoopSpin = 50 * time.Microsecond })
	if got := loopSpin.Load(); got != int64(50*time.Microsecond) {
		t.Fatalf("loop spin %v after New, want 50µs", time.Duration(got))
	}
	c := dial(t, s)
	for i := range 200 {
		if got := c.do("SET", fmt.Sprint("k", i), fmt.Sprint(i)); got != "OK" {
			t.Fatalf("SET %d: %s", i, got)
		}
		if i%50 == 0 {
			time.Sleep(2 * time.Millisecond) // long enough to fall asleep
		}
		if got := c.do("GET", fmt.Sprint("k", i)); got != fmt.Sprintf("%q", fmt.Sprint(i)) {
			t.Fatalf("GET %d: %s", i, got)
		}
	}
	for i := range 100 {
		c.send("GET", fmt.Sprint("k", i))
	}
	var got []string
	for range 100 {
		got = append(got, c.reply())
	}
	for i, g := range got {
		if g != fmt.Sprintf("%q", fmt.Sprint(i)) {
			t.Fatalf("pipelined GET k%d: %s (all: %s)", i, g, strings.Join(got, " "))
		}
	}
}

// A single node polls by default; a replica does not unless told to, and a
// negative LoopSpin turns polling off everywhere.
func TestLoopSpinDefaults(t *testing.T) {
	group := []Member{{ID: 1}, {ID: 2}, {ID: 3}}
	for _, tc := range []struct {
		name    string
		spin    time.Duration
		members []Member
		want    time.Duration
	}{
		{"single node, auto", 0, nil, DefaultLoopSpin},
		{"single node, off", -1, nil, 0},
		{"single node, set", 80 * time.Microsecond, nil, 80 * time.Microsecond},
		{"replica, auto", 0, group, 0},
		{"replica, set", 30 * time.Microsecond, group, 30 * time.Microsecond},
	} {
		if got := (Config{LoopSpin: tc.spin, Members: tc.members}).effectiveLoopSpin(); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
