package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A session whose write a view change dropped in one group is lost at
// every group of a node that hosts the first (cluster.Multi.sessionAt), and
// so in particular at the group the write's key moved to — which holds
// nothing of the first group's log and could not tell (docs/design/cluster.md
// §8, "What carries across a move"). The dropped write is the token's: its
// group 1 part names the op of the session's SET with a view that op was not
// ordered in, exactly what a cad or async write acknowledged in a view that
// lost it leaves in a token (vrshard TestSessionTokenDetectsAWriteAViewChangeDropped
// makes one for real). Reads of group 2's keys with it fail with the lost
// session's error; with the mutation OtherPartsUnchecked they are served.
// Then the key's slot moves to group 2, and its read there fails too, while
// a fresh session reads the key.
func TestSessionLostInOneGroupIsLostAtEvery(t *testing.T) {
	g := startTwoGroups(t)
	ka, kb := keyOfGroup(1, "lost"), keyOfGroup(2, "other")
	c := dial(t, g.nodes[0])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET ` + ka + ` a0 => OK`)
	c.expect(`SET ` + kb + ` b0 => OK`)
	tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
	s, err := shard.ParseSession(tok)
	if err != nil || len(s.Groups) != 2 || s.Groups[0].Group != 1 || !s.Groups[0].WriteViewKnown {
		t.Fatalf("token %q: %+v %v", tok, s, err)
	}
	s.Groups[0].WriteView++ // the op went to another view's write
	lost := s.String()

	read := func(k string) string {
		t.Helper()
		rc := dial(t, g.nodes[0])
		rc.expect(`KEFIR.CONSISTENCY session => OK`)
		rc.expect(`KEFIR.SESSION ` + lost + ` => OK`)
		return rc.do("GET", k)
	}
	isLost := func(got string) bool {
		return strings.Contains(got, "lost") && strings.Contains(got, "group 1")
	}
	if got := read(ka); !strings.Contains(got, "lost") {
		t.Fatalf("GET %s (group 1) with the lost token: %s, want the lost session's error", ka, got)
	}
	if got := read(kb); !isLost(got) {
		t.Fatalf("GET %s (group 2) with a token whose group 1 part is lost: %s, want the lost session's error naming group 1", kb, got)
	}
	if mutation.On {
		cluster.MultiMut.OtherPartsUnchecked.Store(true)
		got := read(kb)
		cluster.MultiMut.OtherPartsUnchecked.Store(false)
		if isLost(got) {
			t.Fatalf("OtherPartsUnchecked not caught: %s", got)
		}
		t.Logf("with OtherPartsUnchecked group 2 serves the lost session: %s", got)
	}

	slot := uint16(cluster.Slot([]byte(ka)))
	mv := &cluster.Mover{Seeds: []string{g.cfgs[0].ClientAddr, g.cfgs[1].ClientAddr}, RetryFor: 10 * time.Second, Meta: true, Driver: "TestSessionLostInOneGroupIsLostAtEvery"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: slot, End: slot}}); err != nil {
		t.Fatalf("move slot %d to group 2: %v", slot, err)
	}
	if got := read(ka); !isLost(got) {
		t.Fatalf("GET %s after its slot moved to group 2, with the lost token: %s, want the lost session's error naming group 1", ka, got)
	}
	fresh := dial(t, g.nodes[0])
	fresh.expect(`KEFIR.CONSISTENCY session => OK`)
	fresh.expect(`GET ` + ka + ` => "a0"`)
}
