package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// A recorded move into a chain group whose driver stopped after its
// pre-copy is rolled back by `kefir cluster move-slots --abort`: the abort
// fences the chain group as it does a VR group (an empty fenced
// `KEFIR.SLOTS LOADF`, applied by the chain as any import), rolls the move
// back (the VR source keeps the slots, the chain's copy is purged) and
// records the abort; the same move then runs to its end and every key
// written before reads back.
func TestGroupsChainGroupAbortOfARecordedMove(t *testing.T) {
	g := cluster.StartGroups(t, 4, "1=1,2,3:0-8191;2=2,3,4:8192-16383")
	g.WaitLeaders(20 * time.Second)
	live := g.Addrs()[:3]
	addr := "--addr=" + live[0]
	if out, err := kefirCluster(t, "add-group", addr, "--members", "4,2,3", "--engine", "chain"); err != nil {
		t.Fatalf("add-group --engine chain: %v\n%s", err, out)
	}
	var keys []string
	for i := 0; len(keys) < 20; i++ {
		if k := fmt.Sprintf("k%d", i); kv.KeySlot([]byte(k)) >= 8192 && kv.KeySlot([]byte(k)) <= 12287 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if v, err := cluster.Command(live[0], "SET", k, "v-"+k); err != nil || string(v.Str) != "OK" {
			t.Fatalf("SET %s: %v %v", k, v, err)
		}
	}
	rs := []kv.SlotRange{{Start: 8192, End: 12287}}
	ctx, cancel := context.WithCancel(context.Background())
	mv := &kcluster.Mover{Seeds: live, Logf: t.Logf, Meta: true, Driver: t.Name(), AfterStep: func(step string) {
		if step == "precopy" {
			cancel() // the driver stops: the move is recorded, mid-move
		}
	}}
	if _, err := mv.Move(ctx, 2, 3, rs); err == nil {
		t.Fatal("the move stopped after its pre-copy did not stop")
	}
	mv.Close()
	cancel()
	out, err := kefirCluster(t, "move-slots", addr, "--from", "2", "--to", "3", "--slots", "8192-12287", "--abort")
	if err != nil || !strings.Contains(out, "marked for abort") || !strings.Contains(out, "rolled back the move of 8192-12287 from group 2 to group 3") {
		t.Fatalf("--abort of a move into a chain group: %v\n%s", err, out)
	}
	t.Logf("--abort:\n%s", strings.TrimSpace(out))
	// Node 1's metadata replica applies the abort's record (at once or
	// soon after the leader).
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool {
		cm := localMap(live[0])
		return cm != nil && len(cm.Moves) == 0 && cm.Owner(8192) == 2
	}) {
		t.Fatalf("the map after the abort: %+v", localMap(live[0]))
	}
	if out, err := kefirCluster(t, "move-slots", addr, "--from", "2", "--to", "3", "--slots", "8192-12287"); err != nil {
		t.Fatalf("the move again: %v\n%s", err, out)
	}
	for _, a := range live {
		for _, k := range keys {
			if v, err := cluster.Command(a, "GET", k); err != nil || string(v.Str) != "v-"+k {
				t.Fatalf("GET %s at %s after the move: %v %v", k, a, v, err)
			}
		}
	}
}
