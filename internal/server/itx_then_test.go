package server

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// KEFIR.TX's chained form (txChain): BEGIN … THEN runs the transaction's
// first command in the transaction it begins, reading at its start however
// many writes commit after; the handle it names must be new (above every
// handle the connection used), so an open transaction's handle is never
// taken again and a refused one reads nothing; ABORT h… THEN ends before
// it runs the rest.
func TestTxBeginThen(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	a.expect(`
SET x 1 => OK
KEFIR.TX FEATURES => ["THEN", "READONLY"]
KEFIR.TX BEGIN SI THEN GET 5 x => "1"
`)
	// A write committed after the BEGIN … THEN: the transaction's later
	// reads are still of its start.
	b.expect(`
SET x 2 => OK
`)
	a.expect(`
KEFIR.TX GET 5 x => "1"
KEFIR.TX BEGIN THEN GET 5 x => ERR KEFIR.TX BEGIN … THEN names handle 5: this connection has used handles up to 5*
KEFIR.TX GET 5 x => "1"
KEFIR.TX BEGIN THEN MGET 3 x => ERR KEFIR.TX BEGIN … THEN names handle 3*
KEFIR.TX GET 3 x => ERR no such transaction*
KEFIR.TX BEGIN => (integer) 6
KEFIR.TX GET 6 x => "2"
KEFIR.TX ABORT 5 6 THEN BEGIN SERIALIZABLE THEN MGET 9 x zz => ["2", (nil)]
KEFIR.TX GET 5 x => ERR no such transaction*
KEFIR.TX GET 6 x => ERR no such transaction*
KEFIR.TX ABORT 9 THEN GET 9 x => ERR no such transaction*
KEFIR.TX ABORT 1 2 9 => OK
KEFIR.TX BEGIN THEN SET 10 y 5 => OK
KEFIR.TX ABORT 4 THEN GET 10 y => "5"
KEFIR.TX COMMIT 10 => (integer)*
GET y => "5"
KEFIR.TX BEGIN THEN GET x x => ERR KEFIR.TX BEGIN … THEN GET 'x': the new transaction's handle is an integer
KEFIR.TX BEGIN THEN GET => ERR KEFIR.TX BEGIN … THEN takes a subcommand*
KEFIR.TX BEGIN THEN BEGIN 11 => ERR KEFIR.TX BEGIN … THEN BEGIN*
KEFIR.TX BEGIN RC THEN GET 11 x => ERR unknown isolation level 'RC'*
KEFIR.TX BEGIN SI SI THEN GET 11 x => ERR syntax error
KEFIR.TX ABORT x => ERR no such transaction*
KEFIR.TX ABORT 1 x => ERR KEFIR.TX ABORT takes handles*
KEFIR.TX ABORT 1 THEN => ERR KEFIR.TX ABORT … THEN takes a command*
KEFIR.TX ABORT 1 THEN ABORT 2 => ERR KEFIR.TX ABORT … THEN ABORT*
KEFIR.TX BEGIN THEN GET 11 x => "2"
KEFIR.TX COMMIT 11 => (integer)*
`)
}

// A BEGIN … THEN refused reads nothing, and a command pipelined after it
// naming its handle fails as naming no transaction: on a connection with
// txMaxOpen transactions open (the read would otherwise have gone to one
// of them, or been served outside a snapshot), and at a follower (-MOVED).
func TestTxBeginThenRefusedReadsNothing(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	a.expect(`
SET x 1 => OK
`)
	for i := 1; i <= txMaxOpen; i++ {
		a.expect(`KEFIR.TX BEGIN => (integer) ` + strconv.Itoa(i))
	}
	var buf []byte
	buf = appendCmd(buf, "KEFIR.TX", "BEGIN", "THEN", "GET", "17", "x")
	buf = appendCmd(buf, "KEFIR.TX", "GET", "17", "x")
	buf = appendCmd(buf, "KEFIR.TX", "ABORT", "1", "THEN", "BEGIN", "THEN", "GET", "18", "x")
	if _, err := a.nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"ERR too many open transactions", "ERR no such transaction", `"1"`} {
		if got := a.reply(); !strings.HasPrefix(got, want) {
			t.Errorf("reply %d: %s, want %s…", i+1, got, want)
		}
	}

	g := startGroup(t)
	l := g.leader(t)
	f := dial(t, g.nodes[(l+1)%3])
	buf = appendCmd(nil, "KEFIR.TX", "BEGIN", "THEN", "GET", "1", "x")
	buf = appendCmd(buf, "KEFIR.TX", "GET", "1", "x")
	if _, err := f.nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"MOVED", "ERR no such transaction"} {
		if got := f.reply(); !strings.HasPrefix(got, want) {
			t.Errorf("at a follower, reply %d: %s, want %s…", i+1, got, want)
		}
	}
	// At the leader it begins, on the loop or on a worker alike.
	ld := dial(t, g.nodes[l])
	ld.expect(`
SET x 7 => OK
KEFIR.TX BEGIN THEN GET 3 x => "7"
KEFIR.TX ABORT 3 THEN BEGIN SI THEN SET 4 x 8 => OK
KEFIR.TX COMMIT 4 => (integer)*
GET x => "8"
`)
}

// A BEGIN … THEN whose read finds a commit in flight writing its key waits
// for it (txRefresh) and reads its result, as a BEGIN and a first read do.
// On the leader's loop the BEGIN is undone when the read must wait
// (txBegin), and a worker runs the whole command again: the transaction
// has the handle it named, once (kept, the rerun was refused as a used
// handle), and the next plain BEGIN continues above it.
func TestTxBeginThenWaitsForACommitInFlight(t *testing.T) {
	longFreshWait(t)
	g := startIsolatableGroup(t, nil)
	l := g.leader(t)
	a, b := dial(t, g.nodes[l]), dial(t, g.nodes[l])
	a.expect(`SET k 1 => OK`)
	ha := txBegin(t, a, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + ha + ` k => "1"
KEFIR.TX SET ` + ha + ` k 2 => OK
`)
	b.expect(`
KEFIR.TX BEGIN THEN GET 1 other => (nil)
KEFIR.TX ABORT 1 => OK
`)
	g.isolate(t, l, true)
	a.send("KEFIR.TX", "COMMIT", ha) // proposed; cannot commit while isolated
	time.Sleep(50 * time.Millisecond)
	b.send("KEFIR.TX", "ABORT", "1", "THEN", "BEGIN", "THEN", "GET", "2", "k")
	time.Sleep(100 * time.Millisecond)
	g.isolate(t, l, false)
	if got := a.reply(); !strings.HasPrefix(got, "(integer)") {
		t.Fatalf("first commit: %s", got)
	}
	if got := b.reply(); got != `"2"` {
		t.Fatalf("BEGIN … THEN GET behind the first commit: %s, want \"2\" (the commit in flight)", got)
	}
	b.expect(`
KEFIR.TX SET 2 k 3 => OK
KEFIR.TX COMMIT 2 => (integer)*
GET k => "3"
KEFIR.TX BEGIN => (integer) 3
`)
}
