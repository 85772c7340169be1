package check

import (
	"reflect"
	"strings"
	"testing"
)

// txb builds hand-made transaction histories.
type txb struct{ h TxnHistory }

func (b *txb) txn(p int, inv, ret int64, out Outcome, mops ...Mop) {
	if out == Unknown {
		ret = Never
	}
	b.h.Txns = append(b.h.Txns, Txn{ID: len(b.h.Txns), Process: p, Mops: mops, Outcome: out, Invoke: inv, Return: ret})
}

// ok appends a committed transaction of process p over [inv, ret].
func (b *txb) ok(p int, inv, ret int64, mops ...Mop) { b.txn(p, inv, ret, OK, mops...) }

func ap(k string, v int) Mop { return Mop{Kind: MopAppend, Key: k, Value: v} }
func rl(k string, l ...int) Mop {
	return Mop{Kind: MopRead, Key: k, List: append([]int{}, l...)}
}
func wr(k string, v int) Mop { return Mop{Kind: MopWrite, Key: k, Value: v} }
func wv(k string, v int, ver uint64) Mop {
	return Mop{Kind: MopWrite, Key: k, Value: v, Version: ver}
}
func rr(k string, v int) Mop { return Mop{Kind: MopRead, Key: k, Value: v} }

type txnCase struct {
	name  string
	build func(b *txb)
	// want: the anomaly names AnalyzeTxns finds (sorted); pass: the models
	// under which CheckTxns accepts the history (it must reject it under
	// every other one).
	want []string
	pass []TxnModel
	opts TxnOptions
}

var allModels = []TxnModel{ReadCommitted, SnapshotIsolation, Serializable, StrictSerializable}

func runTxnCases(t *testing.T, cases []txnCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b txb
			c.build(&b)
			o := c.opts
			o.Model = StrictSerializable
			a := AnalyzeTxns(b.h, o)
			if got := a.Names(); !reflect.DeepEqual(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Fatalf("anomalies %v, want %v:\n%+v", got, c.want, a.Anomalies)
			}
			for _, m := range allModels {
				o.Model = m
				v := CheckTxns(b.h, o)
				wantOK := false
				for _, p := range c.pass {
					wantOK = wantOK || p == m
				}
				if v.OK != wantOK {
					t.Fatalf("under %v: ok=%t, want %t: %v", m, v.OK, wantOK, v)
				}
				if !v.OK && (len(v.Violations) == 0 || len(v.Violations[0].Txns) == 0) {
					t.Fatalf("under %v: a violation without its transactions: %v", m, v)
				}
			}
		})
	}
}

func TestTxnListAppendAnomalies(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "valid concurrent history", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), rl("y"))
			b.ok(1, 5, 15, ap("x", 2), ap("y", 1))
			b.ok(2, 20, 30, rl("x", 1, 2), rl("y", 1))
			b.txn(3, 0, 0, Failed, ap("x", 3))   // aborted, never seen
			b.txn(4, 21, 0, Unknown, ap("y", 2)) // unknown, seen: it committed
			b.ok(0, 40, 50, rl("y", 1, 2), ap("x", 4), rl("x", 1, 2, 4))
		}, pass: allModels},
		{name: "G0 write cycle", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), ap("y", 1))
			b.ok(1, 0, 10, ap("x", 2), ap("y", 2))
			b.ok(2, 20, 30, rl("x", 1, 2), rl("y", 2, 1))
		}, want: []string{G0}},
		{name: "G1a aborted read", build: func(b *txb) {
			b.txn(0, 0, 10, Failed, ap("x", 1))
			b.ok(1, 20, 30, rl("x", 1))
		}, want: []string{G1a}},
		{name: "G1b intermediate read", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), ap("x", 2))
			b.ok(1, 0, 10, rl("x", 1))
		}, want: []string{GSingle, G1b}}, // T1 -rw-> T0 (2 comes later) -wr-> T1
		{name: "G1c circular information flow", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), rl("y", 1))
			b.ok(1, 0, 10, ap("y", 1), rl("x", 1))
		}, want: []string{G1c}},
		{name: "G-single read skew", build: func(b *txb) {
			b.ok(0, 0, 10, rl("x"), rl("y", 1))
			b.ok(1, 0, 10, ap("x", 1), ap("y", 1))
			b.ok(2, 20, 30, rl("x", 1))
		}, want: []string{GSingle}, pass: []TxnModel{ReadCommitted}},
		{name: "write skew is G2-item, allowed by SI", build: func(b *txb) {
			b.ok(0, 0, 10, rl("x"), rl("y"), ap("x", 1))
			b.ok(1, 0, 10, rl("x"), rl("y"), ap("y", 1))
			b.ok(2, 20, 30, rl("x", 1), rl("y", 1))
		}, want: []string{G2Item}, pass: []TxnModel{ReadCommitted, SnapshotIsolation}},
		{name: "lost update", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 20, 30, rl("x", 1), ap("x", 2))
			b.ok(2, 20, 30, rl("x", 1), ap("x", 3))
			b.ok(3, 40, 50, rl("x", 1, 2, 3))
		}, want: []string{GSingle, LostUpdate}, pass: []TxnModel{ReadCommitted}},
		{name: "lost update that vanished", build: func(b *txb) {
			b.ok(1, 20, 30, rl("x"), ap("x", 2))
			b.ok(2, 20, 30, rl("x"), ap("x", 3))
			b.ok(3, 40, 50, rl("x", 3))
		}, want: []string{GSingle, LostUpdate}, pass: []TxnModel{ReadCommitted}},
		{name: "internal inconsistency", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), rl("x"))
		}, want: []string{Internal}},
		{name: "internal: a second read forgets the first", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 20, 30, rl("x", 1), rl("x"))
		}, want: []string{Internal}},
		{name: "incompatible orders", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 0, 10, ap("x", 2))
			b.ok(2, 0, 10, ap("x", 3))
			b.ok(3, 20, 30, rl("x", 1, 2))
			b.ok(4, 20, 30, rl("x", 1, 3))
		}, want: []string{IncompatibleOrder}},
		{name: "garbage and duplicates", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 20, 30, rl("x", 1, 1))
			b.ok(2, 20, 30, rl("y", 7))
		}, want: []string{DuplicateElements, GarbageRead}},
		{name: "stale read is G-single-realtime", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 20, 30, rl("x"))
			b.ok(2, 40, 50, rl("x", 1))
		}, want: []string{GSingle + "-realtime"}, pass: []TxnModel{ReadCommitted, SnapshotIsolation, Serializable}},
		{name: "not reading your own write is G-single-process", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(0, 20, 30, rl("x"))
			b.ok(1, 40, 50, rl("x", 1))
		}, want: []string{GSingle + "-realtime"}, opts: TxnOptions{Sessions: true},
			// With Sessions the process edge closes it under every model
			// that forbids G-single, not only the strict one.
			pass: []TxnModel{ReadCommitted}},
	})
}

func TestTxnRegisterAnomalies(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "valid", build: func(b *txb) {
			b.ok(0, 0, 10, rr("x", 0), wr("x", 1))
			b.ok(1, 20, 30, rr("x", 1), wr("x", 2), rr("x", 2))
			b.ok(2, 40, 50, rr("x", 2))
		}, pass: allModels},
		{name: "G1c", build: func(b *txb) {
			b.ok(0, 0, 10, wr("x", 1), rr("y", 1))
			b.ok(1, 0, 10, wr("y", 1), rr("x", 1))
		}, want: []string{G1c}},
		{name: "G1b", build: func(b *txb) {
			b.ok(0, 0, 10, wr("x", 1), wr("x", 2))
			b.ok(1, 0, 10, rr("x", 1))
		}, want: []string{G1b}},
		{name: "G1a", build: func(b *txb) {
			b.txn(0, 0, 10, Failed, wr("x", 1))
			b.ok(1, 20, 30, rr("x", 1))
		}, want: []string{G1a}},
		{name: "write skew", build: func(b *txb) {
			b.ok(0, 0, 10, rr("x", 0), rr("y", 0), wr("x", 1))
			b.ok(1, 0, 10, rr("x", 0), rr("y", 0), wr("y", 1))
		}, want: []string{G2Item}, pass: []TxnModel{ReadCommitted, SnapshotIsolation}},
		{name: "lost update, ordered by versions", build: func(b *txb) {
			b.ok(0, 0, 10, wv("x", 1, 1))
			b.ok(1, 20, 30, rr("x", 1), wv("x", 2, 2))
			b.ok(2, 20, 30, rr("x", 1), wv("x", 3, 3))
		}, want: []string{GSingle, LostUpdate}, pass: []TxnModel{ReadCommitted}},
		{name: "G0 by versions", build: func(b *txb) {
			b.ok(0, 0, 10, wv("x", 1, 1), wv("y", 2, 2))
			b.ok(1, 0, 10, wv("x", 3, 2), wv("y", 4, 1))
		}, want: []string{G0}},
		{name: "internal", build: func(b *txb) {
			b.ok(0, 0, 10, wr("x", 1), rr("x", 0))
		}, want: []string{Internal}},
	})
}

// The explanation names the transactions, edges, keys and values of the cycle.
func TestTxnCycleExplanation(t *testing.T) {
	var b txb
	b.ok(0, 0, 10, rl("x"), rl("y"), ap("x", 1))
	b.ok(1, 0, 10, rl("x"), rl("y"), ap("y", 1))
	b.ok(2, 20, 30, rl("x", 1), rl("y", 1))
	v := CheckTxns(b.h, TxnOptions{Model: Serializable})
	if v.OK {
		t.Fatal("write skew accepted under serializable")
	}
	want := "G2-item: T0 -rw(y: read nil, next 1)-> T1 -rw(x: read nil, next 1)-> T0"
	if got := v.Violations[0].Reason; got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	if s := v.String(); !strings.Contains(s, "T1 p1 [r x [], r y [], append y 1] ok [0,10]") {
		t.Fatalf("verdict does not list the transactions:\n%s", s)
	}
}

// A saved transaction history replays to the same verdict; an empty list
// read stays a list read.
func TestTxnHistoryJSONRoundTrip(t *testing.T) {
	var b txb
	b.ok(0, 0, 10, rl("x"), rl("y"), ap("x", 1))
	b.ok(1, 0, 10, rl("x"), rl("y"), ap("y", 1))
	b.ok(2, 20, 30, rl("x", 1), rl("y", 1), wv("z", 1, 3))
	b.txn(3, 5, 0, Unknown, ap("x", 2))
	path := t.TempDir() + "/txns.json"
	if err := SaveTxnJSON(b.h, path); err != nil {
		t.Fatal(err)
	}
	h, err := LoadTxnJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, b.h) {
		t.Fatalf("round trip changed the history:\n%+v\n%+v", h, b.h)
	}
	if a, b := CheckTxns(h, TxnOptions{Model: Serializable}), CheckTxns(b.h, TxnOptions{Model: Serializable}); !reflect.DeepEqual(a, b) || a.OK {
		t.Fatalf("replayed verdict differs or passes:\n%v\n%v", a, b)
	}
}

// Two rw edges that are not adjacent: forbidden by snapshot isolation
// (Cerone and Gotsman: an SI history's cycles all have two adjacent rw
// edges), though it is neither G-single nor write skew.
func TestTxnNonadjacent(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "two reads each missing one of two appends", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 0, 10, rl("x", 1), rl("y"))
			b.ok(2, 0, 10, ap("y", 1))
			b.ok(3, 0, 10, rl("y", 1), rl("x"))
		}, want: []string{GNonadjacent}, pass: []TxnModel{ReadCommitted}},
	})
}

// An aborted append inside the version order does not hide the order of
// the committed ones around it.
func TestTxnAbortedVersionSkipped(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "G0 across an aborted append", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), ap("y", 3))
			b.txn(1, 0, 10, Failed, ap("x", 2))
			b.ok(2, 0, 10, ap("x", 3), ap("y", 1))
			b.ok(3, 20, 30, rl("x", 1, 2, 3), rl("y", 1, 3))
		}, want: []string{G0, G1a}},
	})
}

// An acknowledged append that a later transaction does not see: the
// version adding it comes after every version read, so the reader precedes
// the appender — against real time.
func TestTxnUnreadAppend(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "lost append seen in real time", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(1, 20, 30, ap("x", 2))
			b.ok(2, 40, 50, rl("x", 1))
		}, want: []string{GSingle + "-realtime"}, pass: []TxnModel{ReadCommitted, SnapshotIsolation, Serializable}},
		{name: "an append after every read is fine", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1))
			b.ok(2, 40, 50, rl("x", 1))
			b.ok(1, 60, 70, ap("x", 2))
		}, pass: allModels},
		{name: "lost append against a read-then-write", build: func(b *txb) {
			b.ok(0, 0, 10, ap("x", 1), rl("y"))
			b.ok(1, 0, 10, rl("x"), ap("y", 1))
			b.ok(2, 20, 30, rl("y", 1))
		}, want: []string{G2Item}, pass: []TxnModel{ReadCommitted, SnapshotIsolation}},
	})
}

// An unknown transaction's write carries no version (its reply was lost);
// the committed writes' versions still order the key.
func TestTxnRegisterUnknownWriteKeepsVersions(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "lost update next to an unknown write", build: func(b *txb) {
			b.ok(0, 0, 10, wv("x", 1, 1))
			b.ok(1, 20, 30, rr("x", 1), wv("x", 2, 2))
			b.ok(2, 20, 30, rr("x", 1), wv("x", 3, 4))
			b.txn(3, 20, 0, Unknown, wr("x", 4))
			b.ok(4, 40, 50, rr("x", 4))
		}, want: []string{GSingle, LostUpdate}, pass: []TxnModel{ReadCommitted}},
	})
}

// A cycle of data edges alone is named without a suffix, even when one
// through a real-time edge is shorter.
func TestTxnPureCycleNamedFirst(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "G0 of three, G0-realtime of two", build: func(b *txb) {
			b.ok(0, 20, 30, ap("x", 1), ap("z", 2))
			b.ok(1, 0, 10, ap("x", 2), ap("y", 1))
			b.ok(2, 0, 40, ap("y", 2), ap("z", 1))
			b.ok(3, 50, 60, rl("x", 1, 2), rl("y", 1, 2), rl("z", 1, 2))
		}, want: []string{G0}},
	})
}

// Two transactions that each missed the other's write and both appended to
// a key nobody read afterwards: the reads leave the order of those appends
// open, but every order makes a G-single (first committer wins), so
// snapshot isolation rejects the history, not only serializability.
func TestTxnWriteOrderFromMisses(t *testing.T) {
	runTxnCases(t, []txnCase{
		{name: "concurrent writers of an unread key", build: func(b *txb) {
			b.ok(0, 0, 10, rl("z"), ap("x", 1), ap("y", 1))
			b.ok(1, 0, 10, rl("x"), ap("z", 1), ap("y", 2))
			b.ok(2, 20, 30, rl("x", 1), rl("z", 1))
		}, want: []string{GSingle, G2Item}, pass: []TxnModel{ReadCommitted}},
	})
}

// A read of a transaction that did not commit shows no result: the client
// never saw one.
func TestTxnStringHidesUnseenReads(t *testing.T) {
	tx := Txn{ID: 3, Process: 1, Mops: []Mop{rl("x"), ap("x", 2), rr("y", 0)}, Outcome: Unknown, Invoke: 5, Return: Never}
	if got, want := tx.String(), "T3 p1 [r x _, append x 2, r y _] unknown [5,inf]"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	tx.Outcome, tx.Return = OK, 9
	if got, want := tx.String(), "T3 p1 [r x [], append x 2, r y nil] ok [5,9]"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
