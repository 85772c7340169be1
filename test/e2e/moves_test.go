package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// twoGroups: three nodes, two 3-replica groups, half the slots each.
const twoGroups = "1=1,2,3:0-8191;2=2,3,1:8192-16383"

// moveWorkload is one sequential redis-py RedisCluster client (unmodified:
// it reads CLUSTER SLOTS, hashes keys itself, follows -MOVED) over 40 keys,
// a hash and a key with a TTL per key: each write is read back at once (a
// single client's reads must see its last write), for secs seconds. It
// prints its errors (ERRORS n: any exception the client saw; connection
// errors are retried, as an application does, and counted apart) and, as
// JSON, every key's last acknowledged value.
const moveWorkload = `
import sys, time, json, logging
logging.disable(logging.CRITICAL)
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError, TimeoutError, RedisClusterException
host, port, secs, prefix = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def connect():
    return RedisCluster(host=host, port=port, socket_timeout=5)
rc = connect()
conn_errors, errors = 0, []
def call(f):
    global rc, conn_errors
    deadline = time.time() + 20
    while True:
        try:
            return f()
        except (ConnectionError, TimeoutError, RedisClusterException) as e:
            conn_errors += 1
            if time.time() > deadline:
                raise
            time.sleep(0.1)
            if isinstance(e, RedisClusterException):
                try:
                    rc = connect()
                except Exception:
                    pass
last, i, end = {}, 0, time.time() + secs
while time.time() < end:
    k = "%s%d" % (prefix, i % 40)
    v = "v%d" % i
    try:
        call(lambda: rc.set(k, v))
        last[k] = v
        got = call(lambda: rc.get(k))
        if got is None or got.decode() != v:
            errors.append("get %s = %r after set %s" % (k, got, v))
        call(lambda: rc.hset("{%s}h" % k, "f", v))
        last["{%s}h" % k] = v
        got = call(lambda: rc.hget("{%s}h" % k, "f"))
        if got is None or got.decode() != v:
            errors.append("hget {%s}h = %r after hset %s" % (k, got, v))
        call(lambda: rc.set("{%s}t" % k, v, ex=3600))
        last["{%s}t" % k] = v
    except Exception as e:
        errors.append("%s: %s" % (type(e).__name__, e))
    i += 1
print("ERRORS", len(errors), "CONN", conn_errors, "OPS", i)
for e in errors[:10]:
    print("ERR", e)
print("LAST", json.dumps(last))
`

// runMoveWorkload starts moveWorkload against addr and returns a func that
// waits for it: its errors, connection retries and last values.
func runMoveWorkload(t *testing.T, addr string, secs float64, prefix string) func() (errs int, conns int, last map[string]string, out string) {
	t.Helper()
	if b, err := exec.Command("/usr/bin/python3", "-c", "import redis.cluster").CombinedOutput(); err != nil {
		t.Fatalf("redis-py not found (%v: %s): install Debian's python3-redis", err, b)
	}
	host, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command("/usr/bin/python3", "-c", moveWorkload, host, port, strconv.FormatFloat(secs, 'f', 1, 64), prefix)
	done := make(chan []byte, 1)
	go func() {
		b, _ := cmd.CombinedOutput()
		done <- b
	}()
	return func() (int, int, map[string]string, string) {
		b := <-done
		out := string(b)
		errs, conns := -1, -1
		last := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 4 && f[0] == "ERRORS":
				errs, _ = strconv.Atoi(f[1])
				conns, _ = strconv.Atoi(f[3])
			case strings.HasPrefix(line, "LAST "):
				if err := json.Unmarshal([]byte(line[5:]), &last); err != nil {
					t.Fatalf("workload output: %v\n%s", err, out)
				}
			}
		}
		if errs < 0 || len(last) == 0 {
			t.Fatalf("workload did not finish:\n%s", out)
		}
		return errs, conns, last, out
	}
}

// pausedMover is a Mover (pages of 64 keys) that pauses after its steps, so
// that a workload writes the moving keys while they are migrating (the
// final copy brings them: pause after "migrating" and "precopy") and meets
// the hand-over's window (its requests are held, not failed: window after
// "handover").
func pausedMover(t *testing.T, seeds []string, pause, window time.Duration) *kcluster.Mover {
	return &kcluster.Mover{Seeds: seeds, Logf: t.Logf, Page: 64, AfterStep: func(step string) {
		switch step {
		case "migrating", "precopy":
			time.Sleep(pause)
		case "handover":
			time.Sleep(window)
		}
	}}
}

// checkAfterMove checks that every acknowledged write of last is readable
// through every node (plain clients, forwarded), that the keys with a TTL
// kept it, that the slot map every node reports gives rs to group to at
// epoch, and that the groups' tables give rs to group to only.
func checkAfterMove(t *testing.T, g *cluster.Groups, last map[string]string, rs []kv.SlotRange, to, epoch int) {
	t.Helper()
	for k, v := range last {
		for _, n := range g.Nodes {
			var got resp.Value
			var err error
			// A node whose replica of the destination has not applied the
			// take-over yet answers TRYAGAIN, which clients retry (go-redis
			// and redis-py do): so does this check, for a few seconds.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if strings.HasSuffix(k, "}h") {
					got, err = cluster.Command(n.ClientAddr, "HGET", k, "f")
				} else {
					got, err = cluster.Command(n.ClientAddr, "GET", k)
				}
				if err != nil || got.Kind != resp.Error || !strings.HasPrefix(string(got.Str), "TRYAGAIN") || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || string(got.Str) != v {
				t.Fatalf("%s at %s = %q (%v), want the last acknowledged %q", k, n.ID, got.Str, err, v)
			}
		}
		if strings.HasSuffix(k, "}t") {
			if ttl, err := cluster.Command(g.Nodes[0].ClientAddr, "TTL", k); err != nil || ttl.Int <= 0 {
				t.Fatalf("TTL %s = %d (%v): the expiry did not move with the key", k, ttl.Int, err)
			}
		}
	}
	in := kcluster.InRanges(rs)
	for _, n := range g.Nodes {
		// The moved slots' master is the master of the destination's
		// own slots (8191 is group 1's from the start, 8192 group 2's;
		// no test moves them).
		v, err := cluster.Command(n.ClientAddr, "CLUSTER", "SLOTS")
		if err != nil {
			t.Fatal(err)
		}
		if a, b := slotMaster(v, int(rs[0].Start)), slotMaster(v, 8191+to-1); a == "" || a != b {
			t.Fatalf("CLUSTER SLOTS at %s: slot %d's master %q, group %d's %q", n.ID, rs[0].Start, a, to, b)
		}
		info, _ := cluster.Command(n.ClientAddr, "CLUSTER", "INFO")
		if want := fmt.Sprintf("cluster_current_epoch:%d\r\n", epoch); !strings.Contains(string(info.Str), want) {
			t.Fatalf("CLUSTER INFO at %s: %s, want epoch %d", n.ID, info.Str, epoch)
		}
	}
	// Exactly one owner: the groups' own tables.
	for gid, want := range map[int]string{3 - to: "none", to: "owned"} {
		v, err := (&kcluster.Mover{Seeds: g.Addrs()}).Table(context.Background(), kcluster.GroupID(gid))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range v {
			if in(r.Start) && r.State != want {
				t.Fatalf("group %d's table: slots %d-%d are %s, want %s", gid, r.Start, r.End, r.State, want)
			}
		}
	}
}

// A live move of a quarter of the slots from group 1 to group 2 under a
// redis-py RedisCluster workload (and redis-cli -c): the client sees no
// error, every acknowledged write is readable after, hashes and TTLs move,
// and the groups' tables give the slots one owner.
func TestGroupsLiveSlotMove(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 0, End: 4095}}
	wait := runMoveWorkload(t, g.Nodes[0].ClientAddr, 6, "k")
	// redis-cli -c as well, one process per command, on keys of the
	// moving slots: every SET answers OK and the GET after it its value.
	var cliKeys []string
	for i := 0; len(cliKeys) < 5; i++ {
		if k := "cli" + strconv.Itoa(i); kv.KeySlot([]byte(k)) <= 4095 {
			cliKeys = append(cliKeys, k)
		}
	}
	var stopCLI atomic.Bool
	cliDone := make(chan string, 1)
	cliLast := map[string]string{}
	go func() {
		n := 0
		for ; !stopCLI.Load(); n++ {
			k, v := cliKeys[n%len(cliKeys)], "c"+strconv.Itoa(n)
			if out, err := exec.Command("redis-cli", "-c", "-p", g.Nodes[1].Port(), "set", k, v).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "OK" {
				cliDone <- fmt.Sprintf("redis-cli -c set %s %s = %q %v", k, v, out, err)
				return
			}
			cliLast[k] = v
			if out, err := exec.Command("redis-cli", "-c", "-p", g.Nodes[2].Port(), "get", k).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != v {
				cliDone <- fmt.Sprintf("redis-cli -c get %s = %q %v, want %s", k, out, err, v)
				return
			}
		}
		cliDone <- fmt.Sprintf("ok %d", n)
	}()
	time.Sleep(1500 * time.Millisecond)
	mv := pausedMover(t, g.Addrs(), 500*time.Millisecond, 300*time.Millisecond)
	res, err := mv.Move(context.Background(), 1, 2, rs)
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	t.Logf("move: %+v", res)
	if res.Final == 0 {
		t.Errorf("the final copy brought nothing: no write met the migrating slots")
	}
	errs, conns, last, out := wait()
	stopCLI.Store(true)
	if r := <-cliDone; !strings.HasPrefix(r, "ok ") {
		t.Fatalf("redis-cli -c during the move: %s", r)
	} else {
		t.Logf("redis-cli -c: %s set+get pairs before, during and after the move", r[3:])
	}
	for k, v := range cliLast {
		last[k] = v
	}
	if errs != 0 || conns != 0 {
		t.Fatalf("the client saw errors during the move:\n%s", out)
	}
	moved := 0
	for k := range last {
		if kv.KeySlot([]byte(k)) <= 4095 {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key of the workload was in the moved slots")
	}
	checkAfterMove(t, g, last, rs, 2, 2)
	// redis-cli -c follows the new map.
	for k, v := range last {
		if strings.HasSuffix(k, "}h") || strings.HasSuffix(k, "}t") {
			continue
		}
		if out := redisCLI(t, g.Nodes[2].ClientAddr, "-c", "get", k); out != v {
			t.Fatalf("redis-cli -c get %s = %q, want %q", k, out, v)
		}
	}
	t.Logf("%d keys, %d in the moved slots; %s", len(last), moved, strings.SplitN(out, "\n", 2)[0])
}

// The source group's leader is killed (SIGKILL) in the middle of the
// pre-copy: the mover's steps go on at the group's new leader (each step is
// idempotent and the move's state is in the groups' logs), the move
// finishes, the slots have exactly one owner, and no acknowledged write is
// lost; the killed node restarts and catches up. The same with the
// destination group's leader.
func TestGroupsSlotMoveLeaderKilledMidCopy(t *testing.T) {
	t.Run("source", func(t *testing.T) { slotMoveLeaderKilled(t, 0) })
	t.Run("destination", func(t *testing.T) { slotMoveLeaderKilled(t, 8192) })
}

// slotMoveLeaderKilled moves 0-4095 from group 1 to group 2 and kills the
// leader of the group that owns slot victimSlot mid-copy.
func slotMoveLeaderKilled(t *testing.T, victimSlot int) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 0, End: 4095}}
	// Enough keys in the moving slots for a pre-copy of many pages.
	pre := map[string]string{}
	for i := 0; len(pre) < 600; i++ {
		k := "pre" + strconv.Itoa(i)
		if kv.KeySlot([]byte(k)) <= 4095 {
			pre[k] = strconv.Itoa(i)
		}
	}
	var cmds [][]string
	for k, v := range pre {
		cmds = append(cmds, []string{"SET", k, v})
	}
	for _, r := range pipelineRetry(t, g.Nodes[0].ClientAddr, cmds...) {
		if string(r.Str) != "OK" {
			t.Fatalf("preload: %v", r)
		}
	}
	victim := g.SlotLeader(victimSlot)
	if victim < 0 {
		t.Fatalf("no leader known for slot %d's group", victimSlot)
	}
	seed := (victim + 1) % 3
	wait := runMoveWorkload(t, g.Nodes[seed].ClientAddr, 7, "w")
	time.Sleep(1 * time.Second)
	var pages atomic.Int32
	mv := &kcluster.Mover{Seeds: []string{g.Nodes[seed].ClientAddr, g.Nodes[(seed+1)%3].ClientAddr}, Logf: t.Logf, Page: 50,
		AfterStep: func(step string) {
			if step == "precopy-page" && pages.Add(1) == 3 {
				t.Logf("killing %s, the leader of slot %d's group, after 3 pages of the pre-copy", g.Nodes[victim].ID, victimSlot)
				g.Nodes[victim].Kill()
			}
		}}
	res, err := mv.Move(context.Background(), 1, 2, rs)
	if err != nil {
		t.Fatalf("move: %v", err)
	}
	if pages.Load() < 3 {
		t.Fatalf("the pre-copy had %d pages: the kill did not happen mid-copy", pages.Load())
	}
	t.Logf("move: %+v", res)
	g.Nodes[victim].Start()
	errs, conns, last, out := wait()
	if errs != 0 {
		t.Fatalf("the client saw errors:\n%s", out)
	}
	for k, v := range pre {
		last[k] = v
	}
	g.WaitLeaders(20 * time.Second)
	checkAfterMove(t, g, last, rs, 2, 2)
	t.Logf("%d keys checked; the client retried %d times over the kill; %s", len(last), conns, strings.SplitN(out, "\n", 2)[0])
}

// A move whose mover stops after any step (its process killed: here its
// context is cancelled) is finished by a mover run again, from the groups'
// logged states: after the hand-over (the slots owned by neither group, the
// requests for them held) it resumes at the final copy; writes made before
// the stop are all there after. Then the slots move back (epoch 3).
func TestGroupsSlotMoveResumesAfterTheMoverStops(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 100, End: 2000}}
	want := map[string]string{}
	var cmds [][]string
	for i := 0; len(want) < 50; i++ {
		k := "r" + strconv.Itoa(i)
		if s := kv.KeySlot([]byte(k)); s >= 100 && s <= 2000 {
			want[k] = strconv.Itoa(i)
			cmds = append(cmds, []string{"SET", k, want[k]})
		}
	}
	pipelineRetry(t, g.Nodes[0].ClientAddr, cmds...)
	for _, stopAfter := range []string{"migrating", "handover"} {
		ctx, cancel := context.WithCancel(context.Background())
		mv := &kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf, AfterStep: func(step string) {
			if step == stopAfter {
				cancel()
			}
		}}
		if _, err := mv.Move(ctx, 1, 2, rs); err == nil {
			t.Fatalf("the move stopped after %s did not stop", stopAfter)
		}
		cancel()
		if stopAfter == "migrating" {
			// Still group 1's: a write now is copied by the resumed move.
			for k := range want {
				want[k] += "-2"
				if v, err := cluster.Command(g.Nodes[1].ClientAddr, "SET", k, want[k]); err != nil || string(v.Str) != "OK" {
					t.Fatalf("SET %s while migrating: %v %v", k, v, err)
				}
				break
			}
		}
	}
	res, err := (&kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf}).Move(context.Background(), 1, 2, rs)
	if err != nil {
		t.Fatalf("resumed move: %v", err)
	}
	if res.Resumed != "final copy" {
		t.Fatalf("the move resumed at %q, want the final copy", res.Resumed)
	}
	checkAfterMove(t, g, want, rs, 2, 2)
	// Run once more, the move is done: only the (empty) purge is left.
	res, err = (&kcluster.Mover{Seeds: g.Addrs()}).Move(context.Background(), 1, 2, rs)
	if err != nil || res.Resumed != "purge" || res.Purged != 0 {
		t.Fatalf("a finished move run again: %+v %v", res, err)
	}
	// And back, after a write at the new owner: group 1 imports what it
	// handed over (its old copy was purged), at epoch 3.
	for k := range want {
		want[k] += "-3"
		if v, err := cluster.Command(g.Nodes[2].ClientAddr, "SET", k, want[k]); err != nil || string(v.Str) != "OK" {
			t.Fatalf("SET %s at group 2: %v %v", k, v, err)
		}
		break
	}
	if res, err = (&kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf}).Move(context.Background(), 2, 1, rs); err != nil || res.Epoch != 3 {
		t.Fatalf("the move back: %+v %v", res, err)
	}
	checkAfterMove(t, g, want, rs, 1, 3)
}

// A move stopped after its pre-copy (before the hand-over) is rolled back
// (kefir cluster move-slots --abort): group 1 owns the slots again and
// served them throughout, group 2's copy is purged (the nodes' key counts
// are back), and the move then runs again from the start, at a new epoch.
func TestGroupsSlotMoveAbortBeforeTheHandOver(t *testing.T) {
	g := cluster.StartGroups(t, 3, twoGroups)
	g.WaitLeaders(20 * time.Second)
	rs := []kv.SlotRange{{Start: 100, End: 2000}}
	want := map[string]string{}
	var cmds [][]string
	for i := 0; len(want) < 40; i++ {
		k := "a" + strconv.Itoa(i)
		if s := kv.KeySlot([]byte(k)); s >= 100 && s <= 2000 {
			want[k] = strconv.Itoa(i)
			cmds = append(cmds, []string{"SET", k, want[k]})
		}
	}
	pipelineRetry(t, g.Nodes[0].ClientAddr, cmds...)
	dbsize := func() int64 {
		v, err := cluster.Command(g.Nodes[0].ClientAddr, "DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		return v.Int
	}
	// DBSIZE counts what the asked node has applied (docs/commands.md): the
	// writes were acknowledged by group 1's leader, and node 1 — a follower
	// if a view change at start moved the lead, or a leader whose reply
	// came before its apply — may not have applied them yet (under load
	// this read 0 once). Wait for all of them.
	var before int64
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { before = dbsize(); return before >= int64(len(want)) }) {
		t.Fatalf("DBSIZE %d at %s after writing %d keys", before, g.Nodes[0].ID, len(want))
	}
	ctx, cancel := context.WithCancel(context.Background())
	mv := &kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf, AfterStep: func(step string) {
		if step == "precopy" {
			cancel()
		}
	}}
	if _, err := mv.Move(ctx, 1, 2, rs); err == nil {
		t.Fatal("the move stopped after its pre-copy did not stop")
	}
	cancel()
	t.Logf("DBSIZE %d before the move, %d with group 2's copy", before, dbsize())
	if err := (&kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf}).Abort(context.Background(), 1, 2, rs); err != nil {
		t.Fatalf("abort: %v", err)
	}
	for gid, st := range map[int]string{1: "owned", 2: "none"} {
		tab, err := (&kcluster.Mover{Seeds: g.Addrs()}).Table(context.Background(), kcluster.GroupID(gid))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range tab {
			if r.Start <= 100 && r.End >= 100 && r.State != st {
				t.Fatalf("group %d's table after the abort: slot 100 is %s, want %s", gid, r.State, st)
			}
		}
	}
	var got int64
	if !testgroup.Until(10*time.Second, 50*time.Millisecond, func() bool { got = dbsize(); return got == before }) {
		t.Fatalf("DBSIZE %d after the abort, %d before the move: group 2's copy was not purged", got, before)
	}
	for k, v := range want {
		if r, err := cluster.Command(g.Nodes[1].ClientAddr, "GET", k); err != nil || string(r.Str) != v {
			t.Fatalf("GET %s after the abort = %q %v, want %q", k, r.Str, err, v)
		}
	}
	// A move past its hand-over cannot be rolled back; this one starts
	// over and finishes, at epoch 3.
	res, err := (&kcluster.Mover{Seeds: g.Addrs(), Logf: t.Logf}).Move(context.Background(), 1, 2, rs)
	if err != nil || res.Epoch != 3 || res.Resumed != "" {
		t.Fatalf("the move after the abort: %+v %v", res, err)
	}
	if err := (&kcluster.Mover{Seeds: g.Addrs()}).Abort(context.Background(), 1, 2, rs); err == nil || !strings.Contains(err.Error(), "only a move before its hand-over") {
		t.Fatalf("abort of a finished move: %v", err)
	}
	checkAfterMove(t, g, want, rs, 2, 3)
}

// pipelineRetry is pipeline after the cluster settled (a write can meet a
// view change at start).
func pipelineRetry(t *testing.T, addr string, cmds ...[]string) []resp.Value {
	t.Helper()
	var out []resp.Value
	for try := 0; try < 50; try++ {
		var err error
		if out, err = pipelineErr(addr, cmds...); err != nil {
			// The node closed the connection (a leader change with the
			// writes in flight): send them again.
			if try == 49 {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		ok := true
		for _, r := range out {
			if r.Kind == resp.Error {
				ok = false
			}
		}
		if ok {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out
}

// slotMaster is the address of the master of slot in a CLUSTER SLOTS reply.
func slotMaster(v resp.Value, slot int) string {
	for _, r := range v.Elems {
		if len(r.Elems) >= 3 && int(r.Elems[0].Int) <= slot && slot <= int(r.Elems[1].Int) {
			return fmt.Sprintf("%s:%d", r.Elems[2].Elems[0].Str, r.Elems[2].Elems[1].Int)
		}
	}
	return ""
}
