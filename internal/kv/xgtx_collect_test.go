package kv

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Collecting cross-group decisions (docs/design/transactions.md,
// "Collecting the decisions"): a decision is deleted only below its
// group's low-water mark, and a commit only once every participant has
// resolved it; a late decide or prepare of a collected transaction is
// refused, never committed.

// decisions counts the decision records in s's state.
func (s *mvStore) decisions() int {
	n := 0
	get := s.at(s.last)
	for k := range s.vers {
		if strings.HasPrefix(k, string(TxDecisionPrefix)) {
			if _, _, _, ok, _ := get([]byte(k)); ok {
				n++
			}
		}
	}
	return n
}

func (s *mvStore) reply(t *testing.T, op Op) string {
	t.Helper()
	res, err := s.try(op)
	if err != nil {
		t.Fatalf("%v: %v", op.Kind, err)
	}
	return strings.TrimSuffix(string(res.Bulk), "\r\n")
}

// lateAfterCollectedAbort: transfer T (x at a, the primary; y at b) is
// aborted by a push, resolved everywhere, and its decision collected; then
// the coordinator's prepare at the primary and its commit arrive late.
// It answers what they did and whether x changed.
func lateAfterCollectedAbort(t *testing.T) (prepare, decide string, xAfter string) {
	t.Helper()
	ga, gb := newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	txid := string(NewTxID(1_000, []byte("nonce-01")))
	pa, pb := xfer(t, txid, ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	gb.mustReply(t, pb, "+PREPARED")
	ga.mustReply(t, NewTxDecide([]byte(txid), b("x"), false), "+ABORTED") // the push
	gb.mustReply(t, NewTxResolve([]byte(txid), b("y"), false), "+ABORTED")
	if ga.decisions() != 1 {
		t.Fatalf("%d decision records before the collect, want 1", ga.decisions())
	}
	ga.mustReply(t, NewTxCollect(b("x"), 2_000, [][]byte{[]byte(txid)}), "+COLLECTED 1")
	if ga.decisions() != 0 {
		t.Fatalf("%d decision records after the collect, want 0", ga.decisions())
	}
	prepare = ga.reply(t, pa)
	decide = ga.reply(t, NewTxDecide([]byte(txid), b("x"), true, b("y")))
	return prepare, decide, ga.get("x")
}

func TestXgtxLateOpsAfterCollectedAbort(t *testing.T) {
	prepare, decide, x := lateAfterCollectedAbort(t)
	if !strings.HasPrefix(prepare, "-TXABORT") || !strings.Contains(prepare, "low-water mark") {
		t.Errorf("a late prepare below the mark answered %q, want -TXABORT … low-water mark", prepare)
	}
	if decide != "+FORGOTTEN" {
		t.Errorf("a late commit below the mark answered %q, want +FORGOTTEN", decide)
	}
	if x != "100" {
		t.Errorf("x = %s after the aborted transfer, want 100", x)
	}
}

// pushAfterEarlyCollect: transfer T commits at the primary a, with y's part
// at b not resolved yet; a collect comes (the mark above T); b's leader
// then pushes T. It answers what the push's decide got.
func pushAfterEarlyCollect(t *testing.T) (push string, ga, gb *mvStore, txid string) {
	t.Helper()
	ga, gb = newMV(), newMV()
	ga.set(t, "x", "100")
	gb.set(t, "y", "0")
	txid = string(NewTxID(1_000, []byte("nonce-02")))
	pa, pb := xfer(t, txid, ga, gb, "x", "y")
	ga.mustReply(t, pa, "+PREPARED")
	gb.mustReply(t, pb, "+PREPARED")
	ga.mustReply(t, NewTxDecide([]byte(txid), b("x"), true, b("y")), "+COMMITTED")
	ga.reply(t, NewTxCollect(b("x"), 2_000, [][]byte{[]byte(txid)}))
	return ga.reply(t, NewTxDecide([]byte(txid), b("x"), false)), ga, gb, txid
}

func TestXgtxCollectWaitsForEveryResolve(t *testing.T) {
	push, ga, gb, txid := pushAfterEarlyCollect(t)
	if push != "+COMMITTED" {
		t.Fatalf("a push after a collect answered %q, want +COMMITTED (y's part had not resolved)", push)
	}
	gb.mustReply(t, NewTxResolve([]byte(txid), b("y"), true), "+COMMITTED")
	// A forget naming another key of y's slot counts for it; one naming
	// another slot does not.
	ga.mustReply(t, NewTxForget([]byte(txid), b("x"), [][]byte{b("zz")}), "+OK")
	ga.mustReply(t, NewTxCollect(b("x"), 2_000, [][]byte{[]byte(txid)}), "+COLLECTED 0")
	ga.mustReply(t, NewTxForget([]byte(txid), b("x"), [][]byte{b("{y}other")}), "+OK")
	ga.mustReply(t, NewTxCollect(b("x"), 2_000, [][]byte{[]byte(txid)}), "+COLLECTED 1")
	if ga.decisions() != 0 || ga.get("x") != "90" || gb.get("y") != "10" {
		t.Fatalf("after the collect: %d decisions, x=%s y=%s; want 0, 90, 10", ga.decisions(), ga.get("x"), gb.get("y"))
	}
	// Gone, its fate is still known: a late push answers forgotten (and
	// aborts only a late-prepared part), never records a decision.
	ga.mustReply(t, NewTxDecide([]byte(txid), b("x"), false), "+FORGOTTEN")
	if ga.decisions() != 0 {
		t.Fatal("a decide below the mark recorded a decision")
	}
}

func TestXgtxCollectOnlyBelowTheMark(t *testing.T) {
	ga := newMV()
	ga.set(t, "x", "1")
	old, young := NewTxID(1_000, b("nonce-03")), NewTxID(5_000, b("nonce-04"))
	ga.mustReply(t, NewTxDecide(old, b("x"), false), "+ABORTED")
	ga.mustReply(t, NewTxDecide(young, b("x"), false), "+ABORTED")
	// An id without a time (a test's, a legacy random one) is never below.
	ga.mustReply(t, NewTxDecide(b("t1"), b("x"), false), "+ABORTED")
	ga.mustReply(t, NewTxCollect(b("x"), 3_000, [][]byte{old, young, b("t1")}), "+COLLECTED 1")
	if ga.decisions() != 2 {
		t.Fatalf("%d decisions left, want 2 (the young one and the timeless one)", ga.decisions())
	}
	// The mark never falls: a collect with an older mark keeps it at 3 s.
	ga.mustReply(t, NewTxCollect(b("x"), 500, nil), "+COLLECTED 0")
	if m, err := TxMark(ga.at(ga.last)); err != nil || m != 3_000 {
		t.Fatalf("mark %d (%v), want 3000", m, err)
	}
	// A new transaction above the mark decides as before.
	ga.mustReply(t, NewTxDecide(NewTxID(4_000, b("nonce-05")), b("x"), true), "+ABORTED")
	// A legacy commit record (one byte) is never collected: its
	// participants are unknown.
	leg := NewTxID(1_500, b("nonce-06"))
	d, err := DecodeTxDecision(leg, []byte{txCommitted})
	if err != nil || !d.Legacy || d.Settled() {
		t.Fatalf("legacy commit: %+v %v, want legacy and unsettled", d, err)
	}
}

// TestXgtxCollectMutationsCaught: collecting too early is caught by the
// tests above — a commit collected before its participants resolved (a
// push then learns forgotten, not committed: half a transfer), and
// records deleted without the mark (a late prepare locks again and a late
// commit commits a transaction its participants aborted).
func TestXgtxCollectMutationsCaught(t *testing.T) {
	mutation.Require(t)
	XgtxMut.CollectIgnoresPending = true
	push, _, _, _ := pushAfterEarlyCollect(t)
	XgtxMut.CollectIgnoresPending = false
	if push == "+COMMITTED" {
		t.Fatal("CollectIgnoresPending not caught: the push still learned the commit")
	}
	t.Logf("CollectIgnoresPending caught: a push after the early collect answered %q", push)

	XgtxMut.IgnoreMark = true
	prepare, decide, x := lateAfterCollectedAbort(t)
	XgtxMut.IgnoreMark = false
	if decide != "+COMMITTED" || x == "100" {
		t.Fatalf("IgnoreMark not caught: prepare %q, decide %q, x=%s", prepare, decide, x)
	}
	t.Logf("IgnoreMark caught: the late prepare answered %q, the late commit %q, x=%s (the participant aborted)", prepare, decide, x)
}
