package shard

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
)

// crashClean is a power cut where exactly the durable state survives.
func (n *testNode) crashClean() {
	n.t.Helper()
	n.fs.Crash(nil)
	_ = n.s.Close()
	_ = n.db.Close()
	n.open()
}

func (n *testNode) sessionGet(key string, sess Session) (kv.Result, error) {
	return n.s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte(key)}, level.Consistency{Kind: level.Session}, sess)
}

// A session whose own async write was lost in a crash must not be served as if
// it had been applied, even after the node has handed out that many versions
// again: read-your-writes would silently fail.
func TestSessionThatSawALostWriteIsRefused(t *testing.T) {
	for _, d := range []level.Durability{level.Async, level.CAD} {
		t.Run(d.String(), func(t *testing.T) {
			n := newNode(t, Options{NoBackgroundSync: true})
			n.write(set("k", "durable"), level.Sync, ReqID{})
			var sess Session
			sess = sess.AfterWrite(n.write(set("k", "mine"), d, ReqID{}).Pos())
			n.crashClean()
			if v, _ := n.get("k"); v != "durable" {
				t.Fatalf("setup: the %s write survived the crash (k = %q)", d, v)
			}
			// Other clients write enough to pass the lost version.
			var last kv.Result
			for range 5 {
				last = n.write(set("other", "x"), level.Sync, ReqID{})
			}
			if last.Version <= sess.LastWrite {
				t.Fatalf("a version was handed out again after the crash: %d after lost %d", last.Version, sess.LastWrite)
			}
			_, err := n.sessionGet("k", sess)
			if !errors.Is(err, ErrSessionLost) {
				t.Fatalf("session read after its write was lost: err = %v, want ErrSessionLost", err)
			}
			// A new session, and a session that saw only durable versions, are served.
			if _, err := n.sessionGet("k", Session{}); err != nil {
				t.Fatalf("fresh session: %v", err)
			}
			if _, err := n.sessionGet("k", Session{MaxRead: 1}); err != nil {
				t.Fatalf("session that saw a durable version: %v", err)
			}
		})
	}
}

// A clean restart keeps versions contiguous and every token valid.
func TestCleanRestartLeavesNoHole(t *testing.T) {
	n := newNode(t, Options{})
	var sess Session
	sess = sess.AfterWrite(n.write(set("k", "v"), level.Async, ReqID{}).Pos())
	if err := n.s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.db.Close(); err != nil {
		t.Fatal(err)
	}
	n.open()
	if len(n.s.holes) != 0 {
		t.Fatalf("clean restart recorded holes %+v", n.s.holes)
	}
	if r := n.write(set("k", "w"), level.Sync, ReqID{}); r.Version != sess.LastWrite+1 {
		t.Fatalf("version after a clean restart = %d, want %d", r.Version, sess.LastWrite+1)
	}
	if _, err := n.sessionGet("k", sess); err != nil {
		t.Fatalf("session read after a clean restart: %v", err)
	}
}

// Versions handed out past a reservation are covered by a durable one first, so
// a crash right after never lets them be reused.
func TestVersionsAcrossReservationsAreNeverReused(t *testing.T) {
	old := versionChunk
	versionChunk = 4
	t.Cleanup(func() { versionChunk = old })
	n := newNode(t, Options{NoBackgroundSync: true})
	seen := map[uint64]bool{}
	type acked struct {
		key  string
		sess Session
	}
	var all []acked
	lost := 0
	for round := range 4 {
		for i := range 7 {
			key := fmt.Sprintf("k%d.%d", round, i)
			r := n.write(set(key, "v"), level.Async, ReqID{})
			if seen[r.Version] {
				t.Fatalf("round %d write %d: version %d handed out twice", round, i, r.Version)
			}
			seen[r.Version] = true
			all = append(all, acked{key, Session{LastWrite: r.Version}})
		}
		// Reservations are fsynced, which makes the async writes before them
		// durable too; the ones after the last reservation are lost.
		n.crashClean()
		n.write(set("other", "v"), level.Sync, ReqID{}) // moves LastVersion past the lost ones
		lost = 0
		for _, a := range all {
			_, kept := n.get(a.key)
			_, err := n.sessionGet(a.key, a.sess)
			switch {
			case kept && err != nil:
				t.Fatalf("round %d: %s survived but its session fails: %v", round, a.key, err)
			case !kept && !errors.Is(err, ErrSessionLost):
				t.Fatalf("round %d: %s (version %d) was lost but its session read gave err = %v", round, a.key, a.sess.LastWrite, err)
			case !kept:
				lost++
			}
		}
	}
	if lost == 0 {
		t.Fatal("setup: no write was lost in any crash")
	}
}
