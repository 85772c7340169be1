package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A node that hosts a replica of the metadata group routes by the map its
// replica applied: read when it starts following (before any hosted table
// is consulted: a restarted node routes by the newest map at once), swapped
// when the record changes, never for an older epoch; a hosted table at a
// higher epoch than the map (a move in flight, not yet done in the map)
// still wins, and at an epoch no higher the map does (a replica lagging a
// move the map has done).
func TestMultiFollowsTheMetadataMap(t *testing.T) {
	static, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}, {ID: 3, ClientAddr: "n3:3"}}
	ver := uint64(0)
	write := func(cm *kv.ClusterMap) {
		t.Helper()
		ver++
		if _, err := db.Append(storage.Record{Key: kv.ClusterMapKey, Value: kv.AppendClusterMap(nil, cm), Version: ver}); err != nil {
			t.Fatal(err)
		}
	}
	// The map has moved group 1's first 100 slots to group 3 (epoch 2).
	cm := BootstrapMap(static, members)
	cm.Epoch = 2
	cm.Groups[0].Slots[0].Start = 100
	cm.Groups[2].Slots = append([]kv.SlotRange{{Start: 0, End: 99}}, cm.Groups[2].Slots...)
	write(cm)

	g1 := &tabledReplica{fakeReplica: &fakeReplica{name: "g1"}}
	spec1, _ := static.Group(1)
	mu, err := NewMulti(static, 1, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: g1, Group: &stateGroup{st: State{Normal: true, Leader: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var k string
	for i := 0; ; i++ {
		if k = fmt.Sprintf("k%d", i); Slot([]byte(k)) < 100 {
			break
		}
	}
	s := Slot([]byte(k))
	if id, _ := mu.owner(s); id != 1 {
		t.Fatalf("before following: slot %d routes to group %d, want the static map's 1", s, id)
	}
	if err := mu.HostMeta(Hosted{Engine: db}, nil); err != nil {
		t.Fatal(err)
	}
	if id, _ := mu.owner(s); id != 3 || mu.Slots().Epoch != 2 {
		t.Fatalf("after following: slot %d routes to group %d at epoch %d, want 3 at 2", s, id, mu.Slots().Epoch)
	}
	if got := mu.ClusterMap(); got == nil || got.Epoch != 2 {
		t.Fatalf("ClusterMap: %+v", got)
	}
	if _, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k)}, level.ConsLinearizable, shard.Session{}); err == nil || len(g1.ops) != 0 {
		t.Fatalf("a read of slot %d (group 3's by the map) reached group 1: %v", s, err)
	}
	// Group 1's own table (lagging: owned at epoch 1) does not win over
	// the map at epoch 2.
	g1.t = kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 5460}}, 1)
	if id, _ := mu.owner(s); id != 3 {
		t.Fatalf("a lagging table won over the map: group %d", id)
	}
	// A move in flight at epoch 3 (not done in the map): the table wins.
	g1.t, _ = kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 5460}}, 1).Set([]kv.SlotRange{{Start: 200, End: 299}}, kv.SlotMigrating, 2, 3)
	g1.t, _ = g1.t.Set([]kv.SlotRange{{Start: 200, End: 299}}, kv.SlotNone, 2, 3)
	if id, _ := mu.owner(250); id != 2 {
		t.Fatalf("a table at an epoch above the map's lost: slot 250 routes to group %d, want 2", id)
	}
	// The record changes: the routing map follows; an older epoch does not
	// replace a newer one.
	cm.Epoch = 3
	cm.Groups[0].Slots = []kv.SlotRange{{Start: 100, End: 199}, {Start: 300, End: 5460}}
	cm.Groups[1].Slots = append([]kv.SlotRange{{Start: 200, End: 299}}, cm.Groups[1].Slots...)
	write(cm)
	if changed, err := mu.RefreshMap(); err != nil || !changed || mu.smap().Epoch != 3 || mu.smap().Owner(250) != 2 {
		t.Fatalf("refresh: %v %v, epoch %d", changed, err, mu.smap().Epoch)
	}
	old := BootstrapMap(static, members)
	write(old)
	if _, err := mu.RefreshMap(); err != nil || mu.smap().Epoch != 3 {
		t.Fatalf("an older map replaced a newer one: epoch %d (%v)", mu.smap().Epoch, err)
	}
}

// A node that hosts no replica of the metadata group polls its leader (at
// the metadata members' client addresses, following -MOVED) and routes by
// the map it gets, newer epochs only.
func TestMultiWithoutAMetadataReplicaPollsTheMap(t *testing.T) {
	static, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cm := BootstrapMap(static, []Member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}})
	cm.Epoch = 2
	cm.Groups[0].Slots[0].Start = 100
	cm.Groups[2].Slots = append([]kv.SlotRange{{Start: 0, End: 99}}, cm.Groups[2].Slots...)
	leader := fakeLeader(t, func(_ int, args []string) string {
		if len(args) < 3 || args[0] != "KEFIR.SLOTS" || args[1] != "META" || args[2] != "MAP" {
			return "-ERR unexpected\r\n"
		}
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(cm)
		return fmt.Sprintf("$%d\r\n%s\r\n", len(b), b)
	})
	follower := fakeLeader(t, func(int, []string) string { return "-MOVED " + leader + "\r\n" })
	// Node 4 hosts group 1 only; node 1 (a metadata member) redirects.
	members := []Member{{ID: 1, ClientAddr: follower}, {ID: 2, ClientAddr: follower}, {ID: 3, ClientAddr: follower}, {ID: 4, ClientAddr: "n4:4"}}
	spec1, _ := static.Group(1)
	mu4, err := NewMulti(static, 4, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: &fakeReplica{name: "g1"}, Group: &stateGroup{}}}})
	if err != nil {
		t.Fatal(err)
	}
	if mu4.HostsMeta() {
		t.Fatal("node 4 hosts the metadata group")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); mu4.FollowMap(ctx, FollowConfig{Every: 2 * time.Millisecond}) }()
	defer func() { cancel(); <-done }()
	wait := func(epoch uint64) {
		t.Helper()
		if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return mu4.smap().Epoch == epoch }) {
			t.Fatalf("node 4 routes by epoch %d, want %d", mu4.smap().Epoch, epoch)
		}
	}
	wait(2)
	if id, _ := mu4.owner(50); id != 3 {
		t.Fatalf("slot 50 routes to group %d by the polled map, want 3", id)
	}
	mu.Lock()
	cm.Epoch = 1 // an older map (a lagging leader's) is not adopted
	mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	if mu4.smap().Epoch != 2 {
		t.Fatalf("an older map replaced the newer one: epoch %d", mu4.smap().Epoch)
	}
	mu.Lock()
	cm.Epoch = 3
	mu.Unlock()
	wait(3)
}

// A node without a metadata replica long-polls the leader (MAP SINCE e
// WAIT ms): a change reaches it when the leader answers, not at the next
// poll, and an idle map costs one held request per MapWait rather than one
// every ten ticks. A leader that does not know WAIT (an older version) is
// asked at the old pace, MAP SINCE e.
func TestMultiWithoutAMetadataReplicaLongPollsTheMap(t *testing.T) {
	static, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("old=%v", old), func(t *testing.T) {
			var mu sync.Mutex
			cm := BootstrapMap(static, []Member{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}})
			cm.Epoch = 2
			changed := make(chan struct{})
			var asked, held int
			leader := fakeLeader(t, func(_ int, args []string) string {
				mu.Lock()
				asked++
				m := *cm
				ch := changed
				mu.Unlock()
				if len(args) == 7 && args[5] == "WAIT" {
					if old {
						return "-ERR wrong number of arguments for 'kefir.slots|meta|map' command\r\n"
					}
					since, _ := strconv.ParseUint(args[4], 10, 64)
					if m.Epoch <= since {
						mu.Lock()
						held++
						mu.Unlock()
						ms, _ := strconv.Atoi(args[6])
						select {
						case <-ch:
						case <-time.After(time.Duration(ms) * time.Millisecond):
							return "$-1\r\n"
						}
						mu.Lock()
						m = *cm
						mu.Unlock()
					}
				} else if len(args) == 5 && args[3] == "SINCE" {
					if since, _ := strconv.ParseUint(args[4], 10, 64); m.Epoch <= since {
						return "$-1\r\n"
					}
				}
				b, _ := json.Marshal(&m)
				return fmt.Sprintf("$%d\r\n%s\r\n", len(b), b)
			})
			members := []Member{{ID: 1, ClientAddr: leader}, {ID: 2, ClientAddr: leader}, {ID: 3, ClientAddr: leader}, {ID: 4, ClientAddr: "n4:4"}}
			spec1, _ := static.Group(1)
			mu4, err := NewMulti(static, 4, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: &fakeReplica{name: "g1"}, Group: &stateGroup{}}}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			// Ten ticks are 500 ms, the old pace.
			go func() { defer close(done); mu4.FollowMap(ctx, FollowConfig{Every: 50 * time.Millisecond}) }()
			defer func() {
				// A held poll does not hold the follower's end.
				cancel()
				select {
				case <-done:
				case <-time.After(500 * time.Millisecond):
					t.Error("the follower did not stop within 500 ms of its context's end")
					<-done
				}
			}()
			if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return mu4.smap().Epoch == 2 }) {
				t.Fatalf("node 4 routes by epoch %d, want 2", mu4.smap().Epoch)
			}
			time.Sleep(300 * time.Millisecond) // let a poll be held
			mu.Lock()
			cm.Epoch = 3
			close(changed)
			changed = make(chan struct{})
			asked0 := asked
			mu.Unlock()
			start := time.Now()
			if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return mu4.smap().Epoch == 3 }) {
				t.Fatalf("node 4 routes by epoch %d, want 3", mu4.smap().Epoch)
			}
			took := time.Since(start)
			time.Sleep(time.Second)
			mu.Lock()
			n, h := asked-asked0, held
			mu.Unlock()
			t.Logf("epoch 3 adopted %v after the change; %d requests in the next second (%d held in all)", took, n, h)
			if old {
				if h != 0 || n > 4 {
					t.Fatalf("against a leader without WAIT: %d held, %d requests in a second (want the old pace, ~2)", h, n)
				}
				return
			}
			// Held: the change is answered at once; an unchanged map is asked
			// once per MapWait (plus the answer to the change).
			if took > 150*time.Millisecond || h == 0 || n > 3 {
				t.Fatalf("long poll: adopted after %v (want < 150 ms), %d held, %d requests in a second (want ≤ 3)", took, h, n)
			}
		})
	}
}

// Two drivers of one move with the same name (two `kefir cluster
// move-slots` of the default name, or two Movers of one process) must
// record distinct names: the map answers a plan of a move already planned
// only to the driver its record names (kv's KindMapMovePlan), so a shared
// name would hand the second driver the first one's lease (review
// finding 2). The name given stays readable in front of the token.
func TestMoversOfOneNameRecordDistinctDrivers(t *testing.T) {
	a, b := &Mover{Driver: "ops"}, &Mover{Driver: "ops"}
	a.identify()
	b.identify()
	if a.Driver == b.Driver || !strings.HasPrefix(a.Driver, "ops #") || !strings.HasPrefix(b.Driver, "ops #") {
		t.Fatalf("two drivers named %q record %q and %q", "ops", a.Driver, b.Driver)
	}
	d := a.Driver
	a.identify()
	if a.Driver != d {
		t.Fatalf("a driver's name changed from %q to %q: its claims would not match its plan", d, a.Driver)
	}
	var c Mover
	c.identify()
	if !strings.HasPrefix(c.Driver, "kefir cluster move-slots #") {
		t.Fatalf("a driver without a name records %q", c.Driver)
	}
}

// KEFIR.SLOTS META CLAIM … ABORT carries the abort mark, DONE/ABORT with a
// driver and beat carry them (compare-and-set at apply), the older forms
// stay as they were, and anything else after the beat is refused.
func TestMetaCommandAbortMarkAndLeasedEnds(t *testing.T) {
	parse := func(args ...string) (kv.Op, error) {
		b := [][]byte{[]byte("KEFIR.SLOTS"), []byte("META")}
		for _, a := range args {
			b = append(b, []byte(a))
		}
		c, err := MetaCommand(b)
		return c.Op, err
	}
	move := func(op kv.Op) kv.MapMove {
		t.Helper()
		mv, err := kv.DecodeMapMove(op.Key)
		if err != nil {
			t.Fatal(err)
		}
		return mv
	}
	for _, tc := range []struct {
		args []string
		kind kv.Kind
		want kv.MapMove
	}{
		{[]string{"CLAIM", "2", "d", "5"}, kv.KindMapMoveClaim, kv.MapMove{Epoch: 2, Driver: "d", Beat: 5}},
		{[]string{"CLAIM", "2", "d", "5", "abort"}, kv.KindMapMoveClaim, kv.MapMove{Epoch: 2, Driver: "d", Beat: 5, AbortWanted: true}},
		{[]string{"DONE", "2"}, kv.KindMapMoveDone, kv.MapMove{Epoch: 2}},
		{[]string{"DONE", "2", "d", "6"}, kv.KindMapMoveDone, kv.MapMove{Epoch: 2, Driver: "d", Beat: 6}},
		{[]string{"ABORT", "2", "d", "6"}, kv.KindMapMoveAbort, kv.MapMove{Epoch: 2, Driver: "d", Beat: 6}},
	} {
		op, err := parse(tc.args...)
		if err != nil || op.Kind != tc.kind {
			t.Fatalf("%v: %v %v", tc.args, op.Kind, err)
		}
		if got := move(op); got.Epoch != tc.want.Epoch || got.Driver != tc.want.Driver || got.Beat != tc.want.Beat || got.AbortWanted != tc.want.AbortWanted {
			t.Fatalf("%v: %+v, want %+v", tc.args, got, tc.want)
		}
	}
	for _, bad := range [][]string{{"CLAIM", "2", "d", "5", "FORCE"}, {"DONE", "2", "d"}, {"DONE", "2", "", "6"}, {"ABORT", "2", "d", "x"}, {"CLAIM", "2", "d", "5", "ABORT", "x"}} {
		if _, err := parse(bad...); err == nil {
			t.Fatalf("%v parsed", bad)
		}
	}
}

// A node started with --zone records it in the map (FollowConfig.Zone):
// seeing itself there without that zone, it asks the metadata leader once
// (KEFIR.SLOTS META ADDNODE with the map's addresses for it and ZONE), and
// asks no more once the map has it; a node without --zone never asks.
func TestMultiRecordsItsZone(t *testing.T) {
	z := newZoneMeta(t, true)
	mu, cm := &z.mu, z.cm
	for _, zone := range []string{"", "rack-b"} {
		mu4 := z.node4(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); mu4.FollowMap(ctx, FollowConfig{Every: 2 * time.Millisecond, Zone: zone}) }()
		if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return mu4.smap().Epoch == cm.Epoch && (zone == "" || cm.Nodes[3].Zone == zone)
		}) {
			t.Fatalf("--zone %q: node 4 routes by epoch %d; asks %q", zone, mu4.smap().Epoch, z.asks)
		}
		time.Sleep(100 * time.Millisecond) // more ticks: no other ask
		cancel()
		<-done
		mu.Lock()
		want := []string(nil)
		if zone != "" {
			want = []string{"4 n4:4 n4:14 ZONE rack-b"}
		}
		if !slices.Equal(z.asks, want) {
			t.Fatalf("--zone %q: the node asked %q, want %q", zone, z.asks, want)
		}
		mu.Unlock()
	}
}
