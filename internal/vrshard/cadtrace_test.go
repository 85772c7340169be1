//go:build cadtrace

package vrshard

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// The joined timeline (docs/design/write-path.md) covers every hand-off of a
// sync write at one writer: a stage that lost its stamp (a hook moved, a
// field left unset) would drop out of the report or show no samples.
// Runs only with -tags cadtrace: go test -tags cadtrace -run TestTraceTimeline ./internal/vrshard/
func TestTraceTimelineCoversTheWritePath(t *testing.T) {
	t.Setenv("KEFIR_CADTRACE", "1")
	c := newCluster(t, 3, nil)
	l := c.leader(10 * time.Second)
	const writes = 50
	for i := range writes {
		if _, err := c.reps[l].Write(context.Background(), set(fmt.Sprintf("k%d", i), "v"), level.Sync, shard.ReqID{Client: 7, Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	tl := traceTimeline(c.reps[l], c.reps[(l+1)%3], c.reps[(l+2)%3])
	for _, stage := range []string{"L0 ", "L1 ", "L2 ", "F1 ", "F2 ", "F3 ", "F4 ", "F5 ", "L3 ", "L4 ", "L5 ", "T  "} {
		line := ""
		for _, s := range strings.Split(tl, "\n") {
			if strings.Contains(s, stage) {
				line = s
			}
		}
		if line == "" {
			t.Errorf("stage %q missing from the timeline:\n%s", stage, tl)
			continue
		}
		var n int
		if _, err := fmt.Sscanf(line[strings.Index(line, "n=")+2:], "%d", &n); err != nil || n < writes*9/10 {
			t.Errorf("stage %q has %d samples (%v), want about %d:\n%s", stage, n, err, writes, tl)
		}
	}
}
