package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// localMap is node addr's replica's metadata map (KEFIR.SLOTS META MAP
// LOCAL; nil if it has none yet).
func localMap(addr string) *kv.ClusterMap {
	v, err := cluster.Command(addr, "KEFIR.SLOTS", "META", "MAP", "LOCAL")
	if err != nil || v.Kind != resp.Bulk {
		return nil
	}
	var cm kv.ClusterMap
	if json.Unmarshal(v.Str, &cm) != nil {
		return nil
	}
	return &cm
}

func observation(src string, cm *kv.ClusterMap) check.MapObservation {
	o := check.MapObservation{Source: src, Epoch: cm.Epoch}
	for _, g := range cm.Groups {
		for _, r := range g.Slots {
			o.Ranges = append(o.Ranges, check.OwnedRange{Start: r.Start, End: r.End, Group: g.ID})
		}
	}
	return o
}

// The metadata group with real processes (three nodes, two data groups and
// the metadata group on all three): every node's replica gets the map
// bootstrapped from --groups at epoch 1; `kefir cluster move-slots` (a real
// process) records the move and is SIGKILLed in the middle of its
// pre-copy; the metadata group's leader sees its lease lapse, takes the
// move over and finishes it, and the map's epoch moves once, to 2. Every
// map any node showed meanwhile gives each slot one owner per epoch
// (check.SlotOwners); every node's CLUSTER SLOTS agrees after it and every
// acknowledged write is readable at every node; a node restarted afterwards
// routes by the new map as soon as it serves.
func TestGroupsMetadataResumesAMoveWhoseDriverDied(t *testing.T) {
	metadataResume(t, false, false)
}

// The same, and the metadata group's leader is SIGKILLed right after the
// driver: the next leader's resumer finishes the move; the killed node,
// restarted after it, catches up with the new map (it missed the change:
// until then it routes by the old one, and the fences send on what that
// gets wrong).
func TestGroupsMetadataResumesAfterTheDriverAndTheMetadataLeaderDied(t *testing.T) {
	metadataResume(t, true, false)
}

// The same driver SIGKILLed in its pre-copy, and `kefir cluster move-slots
// --abort` run at once: it takes the move over at once, marked for abort
// (the metadata leader's resumer, which would finish the move after two
// leases, then finds the record marked or gone), fences both groups and
// rolls the move back — group 1 keeps the slots, every write is readable at
// every node, the map is at the move's epoch with no move in flight. Before
// the mark the abort watched the beat for two leases and lost the record to
// the resumer, which finished the move.
func TestGroupsMetadataAbortAfterTheDriverDied(t *testing.T) {
	metadataResume(t, false, true)
}

func metadataResume(t *testing.T, killMetaLeader, abort bool) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	var obs []check.MapObservation
	observe := func() (all bool, maps []*kv.ClusterMap) {
		all = true
		for _, n := range g.Nodes {
			if !n.Running() {
				continue
			}
			cm := localMap(n.ClientAddr)
			if cm == nil {
				all = false
				continue
			}
			obs = append(obs, observation(n.ID, cm))
			maps = append(maps, cm)
		}
		return all, maps
	}
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
		all, maps := observe()
		return all && maps[0].Epoch == 1 && maps[2].Epoch == 1
	}) {
		t.Fatalf("the metadata group's map was not bootstrapped at every node\n%s", g.Nodes[0].Logs())
	}
	rs := []kv.SlotRange{{Start: 0, End: 4095}}
	want := map[string]string{}
	var cmds [][]string
	for i := 0; len(want) < 150; i++ {
		k := "m" + strconv.Itoa(i)
		if kv.KeySlot([]byte(k)) <= 4095 {
			want[k] = strconv.Itoa(i)
			cmds = append(cmds, []string{"SET", k, want[k]})
		}
	}
	pipelineRetry(t, g.Nodes[0].ClientAddr, cmds...)

	// The driver: slow pages so that it is killed in its pre-copy.
	drv := exec.Command(cluster.Binary(t), "cluster", "move-slots", "--addr", strings.Join(g.Addrs(), ","),
		"--from", "1", "--to", "2", "--slots", "0-4095", "--page", "5", "--page-pause", "100ms", "--lease", "1s")
	var out testgroup.Buffer // the driver's output, read while it runs
	drv.Stdout, drv.Stderr = &out, &out
	if err := drv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "recorded the move") || strings.Count(out.String(), "\n") < 2 {
		if time.Now().After(deadline) {
			_ = drv.Process.Kill()
			t.Fatalf("the driver did not record the move:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Killed a few pages into the pre-copy (the source migrating).
	for {
		tab, err := (&kcluster.Mover{Seeds: g.Addrs()}).Table(context.Background(), 1)
		if err == nil && len(tab) > 0 && tab[0].Start == 0 && tab[0].State == "migrating" {
			break
		}
		if time.Now().After(deadline) {
			_ = drv.Process.Kill()
			t.Fatalf("the driver did not start the move: %+v %v\n%s", tab, err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	_ = drv.Process.Kill()
	_ = drv.Wait()
	killed := time.Now()
	t.Logf("driver killed:\n%s", out.String())
	if _, maps := observe(); len(maps) == 0 || len(maps[0].Moves) != 1 || maps[0].Epoch != 1 {
		t.Fatalf("after the driver died the map should record the move in flight at epoch 1: %+v", maps)
	}
	tab, err := (&kcluster.Mover{Seeds: g.Addrs()}).Table(context.Background(), 1)
	if err != nil || len(tab) == 0 || tab[0].Start != 0 || tab[0].State != "migrating" {
		t.Fatalf("the driver was not killed mid-move: group 1's table %+v (%v)", tab, err)
	}
	if abort {
		// The default lease (2 s), the resumer's: an abort that watched
		// the beat for two of them first would lose to the resumer, whose
		// watch began at the beat's last change, before the driver died.
		args := []string{"cluster", "move-slots", "--addr", strings.Join(g.Addrs(), ","), "--from", "1", "--to", "2", "--slots", "0-4095", "--abort"}
		out, err := exec.Command(cluster.Binary(t), args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "took over the move at epoch 2") || !strings.Contains(string(out), "marked for abort") ||
			!strings.Contains(string(out), "rolled back the move of 0-4095 from group 1 to group 2") {
			t.Fatalf("kefir %v (%v %v after the driver was killed):\n%s", args, err, time.Since(killed).Round(10*time.Millisecond), out)
		}
		t.Logf("--abort %v after the driver was killed:\n%s", time.Since(killed).Round(10*time.Millisecond), out)
		if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool {
			all, maps := observe()
			for _, cm := range maps {
				all = all && cm.Epoch == 2 && len(cm.Moves) == 0 && cm.Owner(0) == 1
			}
			return all
		}) {
			_, maps := observe()
			t.Fatalf("the map after the abort: %+v", maps)
		}
		// Past the resumer's two leases (2 s each): nobody drives the move.
		time.Sleep(5 * time.Second)
		for _, n := range g.Nodes {
			if strings.Contains(n.Logs(), "resuming it") {
				t.Fatalf("%s's resumer took the aborted move over:\n%s", n.ID, n.Logs())
			}
		}
		if _, maps := observe(); len(maps) == 0 || maps[0].Epoch != 2 || len(maps[0].Moves) != 0 {
			t.Fatalf("the map after the resumer's leases: %+v", maps)
		}
		if v := check.SlotOwners(obs); len(v) != 0 {
			t.Fatalf("slot ownership across the maps the nodes showed: %v", v)
		}
		checkAfterMove(t, g, want, rs, 1, 2)
		return
	}
	var victim *cluster.Node
	if killMetaLeader {
		st, err := (&kcluster.Mover{Seeds: g.Addrs()}).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range g.Nodes {
			if n.ClientAddr == st.MetaLeader {
				victim = n
			}
		}
		if victim == nil {
			t.Fatalf("no node is the metadata leader %q", st.MetaLeader)
		}
		victim.Kill()
		t.Logf("killed the metadata leader %s", victim.ID)
	}

	// The metadata leader resumes it: two leases (2 s each) without a beat.
	deadline = time.Now().Add(40 * time.Second)
	for {
		all, maps := observe()
		done := all
		for _, cm := range maps {
			done = done && cm.Epoch == 2 && len(cm.Moves) == 0
		}
		if done {
			t.Logf("the move was finished by the metadata leader %v after the driver was killed", time.Since(killed).Round(10*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move was not finished by the metadata leader: %+v\n%s", maps, g.Nodes[0].Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := check.SlotOwners(obs); len(v) != 0 {
		t.Fatalf("slot ownership across the maps the nodes showed: %v", v)
	}
	resumed := false
	for _, n := range g.Nodes {
		resumed = resumed || n.Running() && strings.Contains(n.Logs(), "took over the move at epoch 2")
	}
	if !resumed {
		t.Fatalf("no node says it took the move over:\n%s", g.Nodes[0].Logs())
	}
	if killMetaLeader {
		// The killed node missed the change: it routes by the map it had
		// (its groups' fences send what it gets wrong on) until its
		// replica catches up, which it does from the group's leader.
		victim.Start()
		deadline = time.Now().Add(20 * time.Second)
		for cm := localMap(victim.ClientAddr); cm == nil || cm.Epoch != 2; cm = localMap(victim.ClientAddr) {
			if time.Now().After(deadline) {
				t.Fatalf("the restarted metadata leader's map did not catch up: %+v", cm)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// A node that was up through the move and restarts after it routes by
	// the new map as soon as it serves: its replica's map and CLUSTER INFO
	// say epoch 2 at once.
	n := g.Nodes[2]
	if n == victim && killMetaLeader {
		n = g.Nodes[1]
	}
	n.Stop()
	n.Start()
	cm := localMap(n.ClientAddr)
	info, _ := cluster.Command(n.ClientAddr, "CLUSTER", "INFO")
	if cm == nil || cm.Epoch != 2 || cm.Owner(0) != 2 || !strings.Contains(string(info.Str), "kefir_map_epoch:2\r\n") {
		t.Fatalf("the restarted node's map at once: %+v, CLUSTER INFO %s", cm, info.Str)
	}
	obs = append(obs, observation(n.ID+" restarted", cm))
	checkAfterMove(t, g, want, rs, 2, 2)
	var slots []string
	for _, n := range g.Nodes {
		v, err := cluster.Command(n.ClientAddr, "CLUSTER", "SLOTS")
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, r := range v.Elems {
			b.WriteString(strconv.FormatInt(r.Elems[0].Int, 10) + "-" + strconv.FormatInt(r.Elems[1].Int, 10) + "@" + slotMaster(v, int(r.Elems[0].Int)) + " ")
		}
		slots = append(slots, b.String())
	}
	if slots[0] != slots[1] || slots[1] != slots[2] {
		t.Fatalf("the nodes' CLUSTER SLOTS disagree after the move:\n%s", strings.Join(slots, "\n"))
	}

	if v := check.SlotOwners(obs); len(v) != 0 {
		t.Fatalf("slot ownership: %v", v)
	}
	for k, v := range want {
		if got, err := cluster.Command(n.ClientAddr, "GET", k); err != nil || string(got.Str) != v {
			t.Fatalf("GET %s at the restarted node = %q (%v), want %q", k, got.Str, err, v)
		}
	}
	// /status shows the map this node follows and its metadata replica.
	var hs struct {
		Map struct {
			Epoch uint64       `json:"epoch"`
			Moves []kv.MapMove `json:"moves_in_flight"`
			Meta  *struct {
				Leader uint64 `json:"leader"`
				Role   string `json:"role"`
			} `json:"metadata_replica"`
		} `json:"cluster_map"`
	}
	hr, err := http.Get("http://" + g.Nodes[1].HTTPAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(hr.Body).Decode(&hs)
	hr.Body.Close()
	if err != nil || hs.Map.Epoch != 2 || hs.Map.Moves == nil || len(hs.Map.Moves) != 0 || hs.Map.Meta == nil || hs.Map.Meta.Leader == 0 || hs.Map.Meta.Role == "" {
		t.Fatalf("/status cluster_map: %+v (%v)", hs.Map, err)
	}
	// kefir cluster status prints the map.
	st, err := exec.Command(cluster.Binary(t), "cluster", "status", "--addr", g.Nodes[0].ClientAddr).CombinedOutput()
	t.Logf("kefir cluster status:\n%s", st)
	if err != nil || !strings.Contains(string(st), "map epoch 2") || !strings.Contains(string(st), "moves in flight: none") {
		t.Fatalf("kefir cluster status: %v\n%s", err, st)
	}
	// kefir cluster add-node: a node joins the map (in no group), the
	// epoch moves; the same node again changes nothing.
	for range 2 {
		out, err := exec.Command(cluster.Binary(t), "cluster", "add-node", "--addr", g.Nodes[1].ClientAddr,
			"--id", "4", "--client-addr", "127.0.0.1:1", "--peer-addr", "127.0.0.1:2").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "epoch 3") {
			t.Fatalf("kefir cluster add-node: %v\n%s", err, out)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for cm = localMap(g.Nodes[2].ClientAddr); cm == nil || len(cm.Nodes) != 4 || cm.Epoch != 3; cm = localMap(g.Nodes[2].ClientAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("the added node is not in node 3's map: %+v", cm)
		}
		time.Sleep(50 * time.Millisecond)
	}
	observe()
	if v := check.SlotOwners(obs); len(v) != 0 {
		t.Fatalf("slot ownership: %v", v)
	}
}

// metaCommand sends a KEFIR.SLOTS META command to the metadata group's
// leader (following -MOVED from node 1).
func metaCommand(t *testing.T, g *cluster.Groups, args ...string) resp.Value {
	t.Helper()
	v := metaCommandAt(g, args...)
	if v.Kind == resp.Error && strings.HasPrefix(string(v.Str), "e2e: ") {
		t.Fatal(string(v.Str))
	}
	return v
}

// metaCommandAt is metaCommand for any goroutine: a failure is an error
// value starting "e2e: ".
func metaCommandAt(g *cluster.Groups, args ...string) resp.Value {
	addr := g.Nodes[0].ClientAddr
	for hops := 0; hops < 4; hops++ {
		v, err := cluster.Command(addr, append([]string{"KEFIR.SLOTS", "META"}, args...)...)
		if err != nil {
			return resp.Value{Kind: resp.Error, Str: []byte("e2e: " + err.Error())}
		}
		if v.Kind == resp.Error && strings.HasPrefix(string(v.Str), "MOVED ") {
			f := strings.Fields(string(v.Str))
			addr = f[len(f)-1]
			continue
		}
		return v
	}
	return resp.Value{Kind: resp.Error, Str: []byte(fmt.Sprintf("e2e: KEFIR.SLOTS META %v: too many redirects", args))}
}

// A move recorded by a driver that died before its first step is rolled
// back with `kefir cluster move-slots --abort` (which takes the record over
// at once, marked for abort, and fences both groups): the record goes, the
// map's epoch moves to the move's, the slots stay where they were; the same
// move then runs and the epoch moves once more.
func TestGroupsMetadataAbortOfARecordedMove(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	if !testgroup.Until(20*time.Second, 50*time.Millisecond, func() bool { return localMap(g.Nodes[0].ClientAddr) != nil }) {
		t.Fatal("no map")
	}
	if v := metaCommand(t, g, "PLAN", "1", "2", "0-99", "2", "a driver that died"); v.Kind != resp.Int || v.Int != 1 {
		t.Fatalf("PLAN: %v %s", v.Kind, v.Str)
	}
	move := func(extra ...string) string {
		args := append([]string{"cluster", "move-slots", "--addr", strings.Join(g.Addrs(), ","), "--from", "1", "--to", "2", "--slots", "0-99", "--lease", "300ms"}, extra...)
		out, err := exec.Command(cluster.Binary(t), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("kefir %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := move("--abort")
	if !strings.Contains(out, "took over the move at epoch 2") || !strings.Contains(out, "rolled back") {
		t.Fatalf("--abort did not take the record over:\n%s", out)
	}
	var cm kv.ClusterMap
	if err := json.Unmarshal(metaCommand(t, g, "MAP").Str, &cm); err != nil || cm.Epoch != 2 || len(cm.Moves) != 0 || cm.Owner(0) != 1 {
		t.Fatalf("map after the abort: %+v (%v)", cm, err)
	}
	out = move()
	if !strings.Contains(out, "at epoch 3") {
		t.Fatalf("the move after the abort:\n%s", out)
	}
	// Paced by the latency probe, as a rebalance's moves are, unless
	// --page-pause fixes the pause (below).
	if !strings.Contains(out, "steady probe p99") || !strings.Contains(out, "during the move") {
		t.Fatalf("move-slots was not paced by the probe:\n%s", out)
	}
	if err := json.Unmarshal(metaCommand(t, g, "MAP").Str, &cm); err != nil || cm.Epoch != 3 || len(cm.Moves) != 0 || cm.Owner(0) != 2 || cm.Owner(100) != 1 {
		t.Fatalf("map after the move: %+v (%v)", cm, err)
	}
	// The pollers' form: nothing when the asker has the map's epoch, the
	// map when it is older; a bad argument is refused, not taken for MAP.
	if v := metaCommand(t, g, "MAP", "SINCE", "3"); !v.IsNull() {
		t.Fatalf("MAP SINCE 3 at epoch 3: %v %s, want null", v.Kind, v.Str)
	}
	if err := json.Unmarshal(metaCommand(t, g, "MAP", "SINCE", "2").Str, &cm); err != nil || cm.Epoch != 3 {
		t.Fatalf("MAP SINCE 2 at epoch 3: %+v (%v)", cm, err)
	}
	// The long poll: held while the map is at the asked epoch — null once
	// the wait passes, the new map as soon as a change is applied.
	start := time.Now()
	if v := metaCommand(t, g, "MAP", "SINCE", "3", "WAIT", "300"); !v.IsNull() || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("MAP SINCE 3 WAIT 300 at epoch 3: %v %s after %v, want null after 300 ms", v.Kind, v.Str, time.Since(start))
	}
	type answer struct {
		v    resp.Value
		at   time.Time
		asks int
	}
	held := make(chan answer, 1)
	go func() { // a poller: held polls, asked again after each null
		for n := 1; ; n++ {
			if v := metaCommandAt(g, "MAP", "SINCE", "3", "WAIT", "3000"); !v.IsNull() || n == 20 {
				held <- answer{v, time.Now(), n}
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	if out := move("--from", "2", "--to", "1", "--page-pause", "1ms"); strings.Contains(out, "probe") {
		t.Fatalf("move-slots --page-pause ran the probe:\n%s", out)
	}
	moved := time.Now()
	select {
	case a := <-held:
		if err := json.Unmarshal(a.v.Str, &cm); err != nil || cm.Epoch != 4 {
			t.Fatalf("the held MAP SINCE 3 answered %v %s, want the map at epoch 4", a.v.Kind, a.v.Str)
		}
		// The map changes before the command returns: the answer comes
		// then, not after the wait.
		if late := a.at.Sub(moved); late > time.Second {
			t.Fatalf("the held poll answered %v after the move returned (poll %d)", late, a.asks)
		}
		t.Logf("the held poll answered %v after the move returned (poll %d)", a.at.Sub(moved), a.asks)
	case <-time.After(4 * time.Second):
		t.Fatal("the held MAP SINCE 3 was not answered when the map changed")
	}
	for _, bad := range [][]string{{"MAP", "SINCE", "x"}, {"MAP", "LATEST"}, {"MAP", "SINCE"}, {"MAP", "SINCE", "4", "WAIT", "x"}, {"MAP", "SINCE", "4", "HOLD", "5"}, {"MAP", "LOCAL", "WAIT", "5"}} {
		if v := metaCommand(t, g, bad...); v.Kind != resp.Error {
			t.Fatalf("META %v: %v %s, want an error", bad, v.Kind, v.Str)
		}
	}
}
