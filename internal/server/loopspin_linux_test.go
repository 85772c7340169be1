package server

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// With KEFIR_LOOP_SPIN on, a loop polls before it sleeps: replies are the
// same whether a command finds it spinning (back-to-back round trips), asleep
// (after a pause longer than the spin) or busy with a pipeline.
func TestLoopSpinServesAsWithout(t *testing.T) {
	old := loopSpin.Swap(int64(50 * time.Microsecond))
	defer loopSpin.Store(old)
	s := startServer(t, func(c *Config) { c.IOModel = IOEpoll })
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
