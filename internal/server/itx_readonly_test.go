package server

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// KEFIR.TX BEGIN … READONLY: the words in either order, each once; every
// write refused with the transaction left open; reads (BITFIELD's GET
// included) served; COMMIT answers the start version, without the log.
func TestTxReadOnlyRefusesWrites(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	a.expect(`
SET k 1 => OK
KEFIR.TX BEGIN READONLY => (integer) 1
KEFIR.TX BEGIN SI READONLY => (integer) 2
KEFIR.TX BEGIN READONLY SERIALIZABLE => (integer) 3
KEFIR.TX BEGIN READONLY READONLY => ERR syntax error
KEFIR.TX BEGIN SI SERIALIZABLE => ERR syntax error
KEFIR.TX BEGIN READ ONLY => ERR unknown isolation level 'READ'*
KEFIR.TX ABORT 2 3 => OK
KEFIR.TX SET 1 k 2 => ERR cannot run KEFIR.TX SET in a READONLY transaction*
KEFIR.TX INCRBY 1 k 2 => ERR cannot run KEFIR.TX INCRBY in a READONLY transaction*
KEFIR.TX DEL 1 k => ERR cannot run KEFIR.TX DEL in a READONLY transaction*
KEFIR.TX SETRANGE 1 k 0 x => ERR cannot run KEFIR.TX SETRANGE in a READONLY transaction*
KEFIR.TX SETBIT 1 k 0 1 => ERR cannot run KEFIR.TX SETBIT in a READONLY transaction*
KEFIR.TX BITFIELD 1 k SET u8 0 1 => ERR cannot run KEFIR.TX BITFIELD in a READONLY transaction*
KEFIR.TX BITFIELD 1 k GET u8 0 => [(integer) 49]
KEFIR.TX BITFIELD 1 k GET u8 => ERR*
KEFIR.TX GET 1 k => "1"
KEFIR.TX MGET 1 k nx => ["1", (nil)]
`)
	a.expect(`
SET k 2 => OK
KEFIR.TX GET 1 k => "1"
KEFIR.TX COMMIT 1 => (integer)*
GET k => "2"
KEFIR.TX BEGIN READONLY THEN GET 9 k => "2"
KEFIR.TX BEGIN READONLY THEN SET 10 k 3 => ERR cannot run KEFIR.TX SET in a READONLY transaction*
KEFIR.TX GET 10 k => "2"
KEFIR.TX ABORT 9 10 => OK
GET k => "2"
`)
}

// A READONLY transaction's first read does not wait for a commit in flight
// that writes its key (txRefresh's wait, up to txFreshWait, is for
// read-modify-writes): behind a commit held in flight by an isolated leader
// it answers the value before the commit at once, and ends without an
// abort. The same read in a transaction that may write waits
// (TestTxFirstReadWaitsForACommitInFlight).
func TestTxReadOnlyFirstReadDoesNotWait(t *testing.T) {
	longFreshWait(t) // a wait would last seconds: the elapsed time shows it
	g := startIsolatableGroup(t, nil)
	l := g.leader(t)
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`SET k 1 => OK`)
	ha := txBegin(t, a, "SERIALIZABLE")
	hb := txBegin(t, b, "READONLY")
	a.expect(`KEFIR.TX SET ` + ha + ` k 2 => OK`)
	g.isolate(t, l, true)
	a.send("KEFIR.TX", "COMMIT", ha) // proposed; cannot commit while isolated
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	got := b.do("KEFIR.TX", "GET", hb, "k")
	took := time.Since(start)
	hc := "0"
	if got == `"1"` {
		// The chained form, on the event loop: at once too.
		hc = "99"
		start = time.Now()
		got = b.do("KEFIR.TX", "BEGIN", "READONLY", "THEN", "GET", hc, "k")
		took = max(took, time.Since(start))
	}
	g.isolate(t, l, false)
	// The read first: a read that waited the 5 s also outlasted the view
	// change timeout, and the writer's commit then answers "outcome
	// unknown", which would hide what failed.
	if got != `"1"` || took > time.Second {
		t.Fatalf("a READONLY transaction's first read behind a commit in flight: %s after %s, want \"1\" at once", got, took)
	}
	if got := a.reply(); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("the writer's commit: %s", got)
	}
	b.expect(`
KEFIR.TX COMMIT ` + hb + ` => (integer)*
KEFIR.TX COMMIT ` + hc + ` => (integer)*
GET k => "2"
`)
}

// Read-only transactions under a stream of read-modify-write transactions
// on the same keys, at a 3-replica group's leader: none aborts, and every
// one reads a pair the writers keep equal — one snapshot.
func TestTxReadOnlyNeverAbortsUnderContention(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	w := dial(t, g.nodes[l])
	w.expect(`MSET x 0 y 0 => OK`)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var commits atomic.Int64
	for i := 0; i < 2; i++ {
		c := dial(t, g.nodes[l])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				h := strings.TrimPrefix(c.do("KEFIR.TX", "BEGIN"), "(integer) ")
				c.do("KEFIR.TX", "INCRBY", h, "x", "1")
				c.do("KEFIR.TX", "INCRBY", h, "y", "1")
				if strings.HasPrefix(c.do("KEFIR.TX", "COMMIT", h), "(integer)") {
					commits.Add(1)
				}
			}
		}()
	}
	r := dial(t, g.nodes[l])
	deadline := time.Now().Add(2 * time.Second)
	n := 0
	for ; time.Now().Before(deadline) || n < 50; n++ {
		h := strings.TrimPrefix(r.do("KEFIR.TX", "BEGIN", "READONLY"), "(integer) ")
		got := r.do("KEFIR.TX", "MGET", h, "x", "y")
		x, y, ok := strings.Cut(strings.Trim(got, "[]"), ", ")
		if !ok || x != y || x == "(nil)" {
			t.Fatalf("read-only transaction %d read %s: not one snapshot of the writers' pairs", n, got)
		}
		if c := r.do("KEFIR.TX", "COMMIT", h); !strings.HasPrefix(c, "(integer)") {
			t.Fatalf("read-only transaction %d: COMMIT = %s, want its start version", n, c)
		}
	}
	stop.Store(true)
	wg.Wait()
	if commits.Load() == 0 {
		t.Fatal("no writer committed: no contention was tried")
	}
	t.Logf("%d read-only transactions, none aborted, alongside %d committed writers", n, commits.Load())
}

// An ended transaction's struct serves the connection's next BEGIN
// (itxConn.take): READONLY is the new BEGIN's, not the old one's. A
// transaction begun plainly after a READONLY one on the same connection
// writes and commits; one begun READONLY after a plain one is refused its
// writes. With take leaving readOnly as it was, the plain transaction's SET
// was refused.
func TestTxReadOnlyNotKeptAcrossBegins(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	a.expect(`
SET k 1 => OK
KEFIR.TX BEGIN READONLY => (integer) 1
KEFIR.TX GET 1 k => "1"
KEFIR.TX ABORT 1 => OK
KEFIR.TX BEGIN => (integer) 2
KEFIR.TX SET 2 k 2 => OK
KEFIR.TX COMMIT 2 => (integer)*
GET k => "2"
KEFIR.TX BEGIN READONLY THEN GET 3 k => "2"
KEFIR.TX COMMIT 3 => (integer)*
KEFIR.TX BEGIN SI THEN SET 4 k 3 => OK
KEFIR.TX COMMIT 4 => (integer)*
KEFIR.TX BEGIN READONLY => (integer) 5
KEFIR.TX SET 5 k 4 => ERR cannot run KEFIR.TX SET in a READONLY transaction*
KEFIR.TX COMMIT 5 => (integer)*
GET k => "3"
`)
}
