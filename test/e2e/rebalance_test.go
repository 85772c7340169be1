package e2e

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// skewedGroups: three nodes, two 3-replica groups, group 1 with three
// quarters of the slots.
const skewedGroups = "1=1,2,3:0-12287;2=2,3,1:12288-16383"

// rebalanceOut is what kefir cluster rebalance --json prints.
type rebalanceOut struct {
	Epoch uint64                   `json:"epoch"`
	Plan  kcluster.Plan            `json:"plan"`
	Moves []kcluster.RebalanceMove `json:"moves"`
	Total int64                    `json:"total_ms"`
}

func runRebalance(t *testing.T, g *cluster.Groups, args ...string) (rebalanceOut, string) {
	t.Helper()
	cmd := exec.Command(cluster.Binary(t), append([]string{"cluster", "rebalance", "--addr", strings.Join(g.Addrs(), ","), "--json"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("kefir cluster rebalance %v: %v\n%s\n%s", args, err, b, stderr.String())
	}
	var out rebalanceOut
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("kefir cluster rebalance --json: %v\n%s", err, b)
	}
	return out, stderr.String()
}

// `kefir cluster rebalance --by keys` (a real process, adaptive pacing) on a
// cluster whose group 1 owns three quarters of the slots and so of the
// keys, under a redis-py RedisCluster workload that reads back each write:
// the plan is one contiguous move to group 2, the client sees no error,
// every loaded key and every acknowledged write is readable at every node
// afterwards, every map any node showed gives each slot one owner
// (check.SlotOwners), and a second dry run finds the groups' key counts
// within 10 % of the mean and nothing to move.
func TestGroupsRebalanceByKeysUnderLoad(t *testing.T) {
	keys := 3000
	if os.Getenv("KEFIR_SOAK") == "1" {
		keys = 60000
	}
	g := cluster.StartGroups(t, 3, skewedGroups)
	g.WaitLeaders(20 * time.Second)
	var obs []check.MapObservation
	observe := func() bool {
		all := true
		for _, n := range g.Nodes {
			cm := localMap(n.ClientAddr)
			if cm == nil {
				all = false
				continue
			}
			obs = append(obs, observation(n.ID, cm))
		}
		return all
	}
	for deadline := time.Now().Add(20 * time.Second); !observe(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the metadata group's map was not bootstrapped at every node\n%s", g.Nodes[0].Logs())
		}
	}
	var cmds [][]string
	for i := 0; i < keys; i++ {
		cmds = append(cmds, []string{"SET", "r" + strconv.Itoa(i), "v" + strconv.Itoa(i)})
		if len(cmds) == 500 || i == keys-1 {
			pipelineRetry(t, g.Nodes[i%3].ClientAddr, cmds...)
			cmds = cmds[:0]
		}
	}
	dry, _ := runRebalance(t, g, "--by", "keys", "--dry-run")
	if len(dry.Plan.Moves) != 1 || dry.Plan.Moves[0].From != 1 || dry.Plan.Moves[0].To != 2 || !dry.Plan.Balanced {
		t.Fatalf("dry run: plan %+v, want one move from group 1 to group 2", dry.Plan)
	}
	if m := dry.Plan.Moves[0].Slots; m.End != 12287 {
		t.Fatalf("the move %v is not next to group 2's slots", m)
	}

	wait := runMoveWorkload(t, g.Nodes[0].ClientAddr, 8, "w")
	time.Sleep(time.Second)
	// --by load weighs the slots by the keys written during the sample:
	// the workload's.
	byLoad, _ := runRebalance(t, g, "--by", "load", "--sample", "1s", "--dry-run")
	var written int64
	for _, gw := range byLoad.Plan.Groups {
		written += gw.Before
	}
	if written == 0 || written > 200 {
		t.Fatalf("--by load: %d keys written during the sample, want the workload's (1-120): %+v", written, byLoad.Plan)
	}
	stopObs := make(chan struct{})
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for {
			select {
			case <-stopObs:
				return
			case <-time.After(100 * time.Millisecond):
				observe()
			}
		}
	}()
	t0 := time.Now()
	out, log := runRebalance(t, g, "--by", "keys", "--baseline", "500ms")
	took := time.Since(t0)
	close(stopObs)
	<-obsDone
	t.Logf("rebalance in %v:\n%s", took.Round(time.Millisecond), log)
	if len(out.Moves) != 1 || out.Moves[0].Probe == nil || out.Moves[0].Result.Epoch != 2 {
		t.Fatalf("rebalance: %+v, want one move at epoch 2, paced by the probe", out)
	}
	// The probe's keys are gone (deleted as it stopped, not left to their
	// 5 s TTL): the log names them.
	probeKeys := regexp.MustCompile(`kefir-rebalance-probe-[0-9]+-[0-9a-f]+-[0-9]+`).FindAllString(log, -1)
	if len(probeKeys) == 0 {
		t.Fatalf("the rebalance's log names no probe key:\n%s", log)
	}
	for _, k := range probeKeys {
		if r := pipeline(t, g.Nodes[0].ClientAddr, []string{"EXISTS", k}); r[0].Int != 0 {
			t.Fatalf("the probe's key %q is left after the rebalance (%v)", k, r[0])
		}
	}
	errs, conns, last, wout := wait()
	if errs != 0 || conns != 0 {
		t.Fatalf("the client saw errors during the rebalance:\n%s", wout)
	}
	observe()
	if v := check.SlotOwners(obs); len(v) != 0 {
		t.Fatalf("slot ownership across the %d maps the nodes showed: %v", len(obs), v)
	}
	// Every loaded key and every acknowledged write, at every node.
	var gets [][]string
	var want []string
	for i := 0; i < keys; i++ {
		gets, want = append(gets, []string{"GET", "r" + strconv.Itoa(i)}), append(want, "v"+strconv.Itoa(i))
	}
	for k, v := range last {
		if strings.HasSuffix(k, "}h") {
			gets = append(gets, []string{"HGET", k, "f"})
		} else {
			gets = append(gets, []string{"GET", k})
		}
		want = append(want, v)
	}
	for _, n := range g.Nodes {
		for from := 0; from < len(gets); from += 500 {
			to := min(from+500, len(gets))
			for i, r := range pipeline(t, n.ClientAddr, gets[from:to]...) {
				if r.Kind == resp.Error || string(r.Str) != want[from+i] {
					t.Fatalf("%v at %s = %q (%v), want %q", gets[from+i], n.ID, r.Str, r.Kind, want[from+i])
				}
			}
		}
	}
	// Balanced: the groups' key counts within 10 % of the mean, nothing
	// left to move.
	after, _ := runRebalance(t, g, "--by", "keys", "--dry-run")
	for _, gw := range after.Plan.Groups {
		if math.Abs(float64(gw.Before)-after.Plan.Mean) > 0.1*after.Plan.Mean {
			t.Fatalf("group %d holds %d keys after the rebalance, mean %.0f: %+v", gw.ID, gw.Before, after.Plan.Mean, after.Plan)
		}
	}
	if len(after.Plan.Moves) != 0 || after.Epoch != 2 {
		t.Fatalf("after the rebalance: %+v at epoch %d, want nothing to move at epoch 2", after.Plan, after.Epoch)
	}
	t.Logf("%d keys; groups %+v; move %+v; --by load counted %d written keys", keys, after.Plan.Groups, out.Moves[0].Result, written)
}
