package vrshard

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/sim"
)

// TestHostAgreeCatchesDivergentReplicas shows the host simulator's agreement
// check (hostAgree) failing on a deliberately broken host: with
// applyOwnClock every replica stamps what it applies with its own clock, so
// replicas that applied the same ops hold different engines. No client-side
// checker can see it (reads return no timestamps); the agreement check must.
func TestHostAgreeCatchesDivergentReplicas(t *testing.T) {
	mutation.Require(t)
	w := sim.KV{Keys: 3, Get: 2, Put: 4, Dur: level.Sync}
	for seed := uint64(1); seed <= 3; seed++ {
		if err := hostSim(seed, nil, hostSimOptions{}, w, nil); err != nil {
			t.Fatalf("seed %d without the mutation: %v", seed, err)
		}
		err := hostSim(seed, nil, hostSimOptions{mut: mutations{applyOwnClock: true}}, w, nil)
		if err == nil || !strings.Contains(err.Error(), "engines differ") {
			t.Fatalf("seed %d with applyOwnClock: %v; want the agreement check's \"engines differ\"", seed, err)
		}
	}
}
