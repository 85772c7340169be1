package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// fakeSlots is a KEFIR.SLOTS endpoint for two groups (1 the source, 2 the
// destination) holding slots 0-99, enough of internal/server/slots.go's
// replies for a Mover to run a whole move against it; it records when each
// step arrived. Every key has version 1, so the pre-copy takes one round.
type fakeSlots struct {
	mu     sync.Mutex
	tables map[string]SlotRunInfo
	keys   map[string][]string // group → its keys, sorted
	events []fakeEvent
	// lockedHandOvers is how many hand-overs the source refuses as a
	// group does while a prepared cross-group transaction locks a key of
	// the slots (kv.ErrTxLocked, as -TRYAGAIN).
	lockedHandOvers int
}

type fakeEvent struct {
	at  time.Time
	cmd string // "SET 1 none", "LOAD 1", "DUMP 1"
}

func startFakeSlots(t *testing.T, nkeys int) (*fakeSlots, string) {
	f := &fakeSlots{tables: map[string]SlotRunInfo{
		"1": {Start: 0, End: 99, State: "owned", Epoch: 1},
		"2": {Start: 0, End: 99, State: "none", Epoch: 1},
	}, keys: map[string][]string{}}
	for i := range nkeys {
		f.keys["1"] = append(f.keys["1"], fmt.Sprintf("k%04d", i))
	}
	// forward_test.go's loopback server, answering with f.do's values.
	addr := fakeLeader(t, func(_ int, args []string) string {
		var b bytes.Buffer
		w := resp.NewWriter(&b, 0)
		if w.WriteValue(f.do(args)) != nil || w.Flush() != nil {
			return ""
		}
		return b.String()
	})
	return f, addr
}

func (f *fakeSlots) do(args []string) resp.Value {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(args) < 3 || args[0] != "KEFIR.SLOTS" {
		return resp.Value{Kind: resp.Error, Str: []byte("ERR fake: unknown command")}
	}
	sub, g := args[1], args[2]
	ev := sub + " " + g
	if sub == "SET" {
		ev += " " + args[3]
	}
	f.events = append(f.events, fakeEvent{time.Now(), ev})
	num := func(n int64) resp.Value { return resp.Value{Kind: resp.Int, Int: n} }
	bulk := func(s string) resp.Value { return resp.Value{Kind: resp.Bulk, Str: []byte(s)} }
	arr := func(vs []resp.Value) resp.Value { return resp.Value{Kind: resp.Array, Elems: vs} }
	switch sub {
	case "TABLE":
		r := f.tables[g]
		return arr([]resp.Value{arr([]resp.Value{num(int64(r.Start)), num(int64(r.End)), bulk(r.State), num(int64(r.Peer)), num(int64(r.Epoch))})})
	case "SET": // g state peer epoch ranges
		if g == "1" && args[3] == "none" && f.lockedHandOvers > 0 {
			f.lockedHandOvers--
			return resp.Value{Kind: resp.Error, Str: []byte("TRYAGAIN " + kv.ErrTxLocked.Error() + ": slot 3, transaction 01: the hand-over waits for its resolve")}
		}
		r := f.tables[g]
		r.State = args[3]
		r.Peer, _ = strconv.ParseUint(args[4], 10, 64)
		r.Epoch, _ = strconv.ParseUint(args[5], 10, 64)
		f.tables[g] = r
		return num(5)
	case "DUMP": // g ranges cursor limit since frozen
		limit, _ := strconv.Atoi(args[5])
		since, _ := strconv.ParseUint(args[6], 10, 64)
		ks := f.keys[g]
		i, _ := slices.BinarySearch(ks, args[4])
		j := min(i+limit, len(ks))
		var entries, keys []resp.Value
		for _, k := range ks[i:j] {
			keys = append(keys, bulk(k))
			if since < 1 {
				entries = append(entries, bulk(k), bulk(""), bulk("v"), num(1))
			}
		}
		next := ""
		if j < len(ks) {
			next = ks[j]
		}
		return arr([]resp.Value{bulk(next), arr(entries), arr(keys), num(1)})
	case "LOAD": // g (key meta payload)...; at the source only the purge's deletions
		for i := 3; i+2 < len(args); i += 3 {
			k := args[i]
			ks := f.keys[g]
			at, found := slices.BinarySearch(ks, k)
			switch {
			case g == "1" && found:
				f.keys[g] = slices.Delete(ks, at, at+1)
			case g == "2" && !found:
				f.keys[g] = slices.Insert(ks, at, k)
			}
		}
		return resp.Value{Kind: resp.Simple, Str: []byte("OK")}
	case "CLIENTS":
		return arr(nil)
	}
	return resp.Value{Kind: resp.Error, Str: []byte("ERR fake: unknown subcommand " + sub)}
}

// The mover's rate limit (PagePause) paces every page outside the
// hand-over's window — the pre-copy's and the purge's — and none inside
// it, where the slots are held: the purge rewrites as many keys as the
// pre-copy, at the source's leader, and unpaced it took foreground
// throughput during a measured move (bench/reshard-vs.sh;
// docs/design/cluster.md, "Measured").
func TestMoverPagePausePacesThePurgeNotTheWindow(t *testing.T) {
	const nkeys, page, pause = 40, 10, 150 * time.Millisecond
	f, addr := startFakeSlots(t, nkeys)
	mv := &Mover{Seeds: []string{addr}, Page: page, PagePause: pause}
	res, err := mv.Move(context.Background(), 1, 2, []kv.SlotRange{{Start: 0, End: 99}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Copied != nkeys || res.Purged != nkeys || len(f.keys["1"]) != 0 || len(f.keys["2"]) != nkeys {
		t.Fatalf("move: %+v; source keeps %d keys, destination has %d", res, len(f.keys["1"]), len(f.keys["2"]))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	find := func(cmd string) int {
		for i, e := range f.events {
			if e.cmd == cmd {
				return i
			}
		}
		t.Fatalf("no %q among the steps", cmd)
		return -1
	}
	handover, owned := find("SET 1 none"), find("SET 2 owned")
	if w := f.events[owned].at.Sub(f.events[handover].at); w >= pause {
		t.Errorf("the window (hand-over to take-over) lasted %v: paced inside (pause %v)", w, pause)
	}
	// Nor between the pre-copy's last page and the hand-over: no rest
	// after the last page, and the destination's listing is not paced
	// (the source's writes meanwhile all go to the final copy, in the
	// window).
	lastDump := -1 // the pre-copy's last page read at the source
	for i, e := range f.events[:handover] {
		if e.cmd == "DUMP 1" {
			lastDump = i
		}
	}
	if lastDump < 0 {
		t.Fatal("no pre-copy DUMP before the hand-over")
	}
	if w := f.events[handover].at.Sub(f.events[lastDump].at); w >= pause {
		t.Errorf("the pre-copy's last page to the hand-over took %v: paced (pause %v)", w, pause)
	}
	gaps := func(from, to int, cmd string) (n int, short []time.Duration) {
		var last time.Time
		for _, e := range f.events[from:to] {
			if e.cmd != cmd {
				continue
			}
			if n++; n > 1 && e.at.Sub(last) < pause {
				short = append(short, e.at.Sub(last))
			}
			last = e.at
		}
		return n, short
	}
	if n, short := gaps(0, handover, "LOAD 2"); n != nkeys/page || len(short) > 0 {
		t.Errorf("pre-copy: %d LOADs at the destination, gaps under the pause: %v", n, short)
	}
	if n, short := gaps(owned, len(f.events), "LOAD 1"); n != nkeys/page || len(short) > 0 {
		t.Errorf("purge: %d LOADs at the source, gaps under the pause %v: %v", n, pause, short)
	}
}

func TestMoverRestEndsWithTheContext(t *testing.T) {
	mv := &Mover{PagePause: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := mv.rest(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("rest with a cancelled context: %v", err)
	}
	if err := (&Mover{}).rest(ctx); err != nil {
		t.Fatalf("no pause: %v", err)
	}
}
