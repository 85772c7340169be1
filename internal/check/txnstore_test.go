package check

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// refStore is a reference in-memory multiversion store with optimistic
// transactions, as issue 29 builds into the state machine: reads come from
// a snapshot at the transaction's start, writes are buffered as whole new
// values, and commit validates against the commits in the window since the
// start — for snapshot isolation, no write-write conflict; for
// serializability, also no read-write one. refNoWindow skips the window
// check (the deliberately broken validator the checker must catch).
type refStore struct {
	mode    refMode
	ts      int
	vers    map[string][]refVersion
	commits []refCommit
	// unsafe counts the commits refNoWindow let through that snapshot
	// isolation would have aborted.
	unsafe int
}

type refMode int

const (
	refSI refMode = iota
	refSerializable
	refNoWindow
)

func (m refMode) String() string {
	return [...]string{"si", "serializable", "no-window-check"}[m]
}

type refVersion struct {
	ts  int
	val []int // a list; a register holds one element
}

type refCommit struct {
	ts     int
	writes map[string]bool
}

type refTxn struct {
	start  int
	reads  map[string]bool
	writes map[string][]int
}

func newRefStore(m refMode) *refStore { return &refStore{mode: m, vers: map[string][]refVersion{}} }

func (s *refStore) begin() *refTxn {
	return &refTxn{start: s.ts, reads: map[string]bool{}, writes: map[string][]int{}}
}

// snapshot is k's value as of ts.
func (s *refStore) snapshot(k string, ts int) []int {
	vs := s.vers[k]
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].ts <= ts {
			return vs[i].val
		}
	}
	return nil
}

func (s *refStore) current(tx *refTxn, k string) []int {
	if v, ok := tx.writes[k]; ok {
		return v
	}
	tx.reads[k] = true
	return s.snapshot(k, tx.start)
}

// exec runs one micro-op of tx, filling in a read's result.
func (s *refStore) exec(tx *refTxn, m *Mop) {
	cur := s.current(tx, m.Key)
	switch m.Kind {
	case MopRead:
		if m.List != nil {
			m.List = append([]int{}, cur...)
		} else if len(cur) > 0 {
			m.Value = cur[0]
		}
	case MopAppend:
		tx.writes[m.Key] = append(slices.Clip(cur), m.Value)
	case MopWrite:
		tx.writes[m.Key] = []int{m.Value}
	}
}

var errConflict = fmt.Errorf("conflict in the window: %w", ErrTxnAborted)

// commit validates tx against the commits after its start, installs its
// writes at a new timestamp and reports it on the register writes that
// made a version (the last of each key), as Kefir reports versions.
func (s *refStore) commit(tx *refTxn, mops []Mop) error {
	if s.conflict(tx) {
		if s.mode != refNoWindow {
			return errConflict
		}
		s.unsafe++
	}
	if len(tx.writes) == 0 {
		return nil
	}
	s.ts++
	c := refCommit{ts: s.ts, writes: map[string]bool{}}
	for k, v := range tx.writes {
		s.vers[k] = append(s.vers[k], refVersion{s.ts, v})
		c.writes[k] = true
	}
	s.commits = append(s.commits, c)
	seen := map[string]bool{}
	for i := len(mops) - 1; i >= 0; i-- {
		if m := &mops[i]; m.Kind == MopWrite && !seen[m.Key] {
			seen[m.Key] = true
			m.Version = uint64(s.ts)
		}
	}
	return nil
}

// conflict is the window check: a commit since tx started wrote a key tx
// writes (or, for serializability, reads).
func (s *refStore) conflict(tx *refTxn) bool {
	for i := len(s.commits) - 1; i >= 0 && s.commits[i].ts > tx.start; i-- {
		for k := range s.commits[i].writes {
			if _, w := tx.writes[k]; w || s.mode == refSerializable && tx.reads[k] {
				return true
			}
		}
	}
	return false
}

// runInterleaved runs n transactions of w against s from w.Processes
// processes whose steps (begin, each micro-op, commit) are interleaved at
// random from seed: a deterministic concurrent history, with logical time.
// A few commits (1 in 30) end unknown to the client, applied or not.
func runInterleaved(s *refStore, w TxnWorkload, n int, seed int64) TxnHistory {
	w = w.withDefaults()
	rng := rand.New(rand.NewSource(seed))
	gen := NewTxnGen(w)
	clock := int64(0)
	rec := NewTxnRecorder(func() int64 { clock++; return clock })
	type open struct {
		id   int
		mops []Mop
		next int
		tx   *refTxn
	}
	procs := make([]*open, w.Processes)
	started, running := 0, 0
	for started < n || running > 0 {
		p := rng.Intn(len(procs))
		o := procs[p]
		switch {
		case o == nil:
			if started == n {
				continue
			}
			mops := gen.Next()
			id := rec.Invoke(Txn{Process: p, Mops: mops})
			procs[p] = &open{id: id, mops: mops, tx: s.begin()}
			started++
			running++
		case o.next < len(o.mops):
			s.exec(o.tx, &o.mops[o.next])
			o.next++
		default:
			procs[p] = nil
			running--
			if rng.Intn(30) == 0 {
				if rng.Intn(2) == 0 {
					_ = s.commit(o.tx, o.mops)
				}
				rec.Unknown(o.id)
				continue
			}
			if err := s.commit(o.tx, o.mops); err != nil {
				rec.Fail(o.id)
				continue
			}
			rec.Complete(o.id, o.mops)
		}
	}
	return rec.History()
}

var refWorkload = TxnWorkload{Processes: 5, Keys: 4, MaxMops: 4}

// A correct validator passes the checker for its model at every seed; the
// store's snapshot isolation shows write skew (G2-item) at some seeds,
// which the serializable check reports.
func TestTxnReferenceStoreCorrectValidators(t *testing.T) {
	const n = 400
	skews := 0
	for seed := int64(1); seed <= 10; seed++ {
		for _, reg := range []bool{false, true} {
			w := refWorkload
			w.Seed, w.Register = seed, reg
			h := runInterleaved(newRefStore(refSerializable), w, n, seed)
			if v := CheckTxns(h, TxnOptions{Model: StrictSerializable, Sessions: true}); !v.OK {
				t.Fatalf("seed %d register=%t: serializable store fails strict serializability:\n%v", seed, reg, v)
			}
			h = runInterleaved(newRefStore(refSI), w, n, seed)
			if v := CheckTxns(h, TxnOptions{Model: SnapshotIsolation, Sessions: true}); !v.OK {
				t.Fatalf("seed %d register=%t: SI store fails snapshot isolation:\n%v", seed, reg, v)
			}
			if v := CheckTxns(h, TxnOptions{Model: Serializable}); !v.OK {
				skews++
				if !slices.Contains(AnalyzeTxns(h, TxnOptions{Model: Serializable}).Names(), G2Item) {
					t.Fatalf("seed %d: SI store not serializable, but without G2-item:\n%v", seed, v)
				}
			}
			if ok, failed, _ := h.Outcomes(); ok < n/2 || failed == 0 {
				t.Fatalf("seed %d: %d committed, %d aborted of %d: the workload barely conflicts or barely commits", seed, ok, failed, n)
			}
		}
	}
	if skews == 0 {
		t.Fatal("the SI store never showed write skew: the serializable check is untested")
	}
	t.Logf("write skew (G2-item) under SI at %d of 20 runs", skews)
}

// The broken validator (no window check) is caught at every seed.
func TestTxnReferenceStoreBrokenValidatorCaught(t *testing.T) {
	for seed := int64(1); seed <= 10; seed++ {
		for _, reg := range []bool{false, true} {
			w := refWorkload
			w.Seed, w.Register = seed, reg
			h := runInterleaved(newRefStore(refNoWindow), w, 200, seed)
			v := CheckTxns(h, TxnOptions{Model: SnapshotIsolation})
			if v.OK {
				t.Fatalf("seed %d register=%t: a store without the window check passes snapshot isolation", seed, reg)
			}
			if seed == 1 {
				t.Logf("register=%t: %s", reg, v.Violations[0].Reason)
			}
		}
	}
}

// Many more seeds and shapes than the tests above, for false positives
// (a correct validator reported) and misses (the broken one passing):
//
//	KEFIR_SOAK=1 go test -count=1 -run TestTxnReferenceStoreSoak -v ./internal/check/
func TestTxnReferenceStoreSoak(t *testing.T) {
	if os.Getenv("KEFIR_SOAK") != "1" {
		t.Skip("KEFIR_SOAK=1 runs it")
	}
	missed := 0
	for seed := int64(1); seed <= 300; seed++ {
		for _, reg := range []bool{false, true} {
			w := TxnWorkload{Seed: seed, Register: reg, Processes: 2 + int(seed%7), Keys: 1 + int(seed%9), MaxMops: 1 + int(seed%6)}
			if h := runInterleaved(newRefStore(refSerializable), w, 500, seed); !CheckTxns(h, TxnOptions{Model: StrictSerializable, Sessions: true}).OK {
				t.Fatalf("seed %d %+v: serializable store rejected:\n%v", seed, w, CheckTxns(h, TxnOptions{Model: StrictSerializable, Sessions: true}))
			}
			if h := runInterleaved(newRefStore(refSI), w, 500, seed); !CheckTxns(h, TxnOptions{Model: SnapshotIsolation, Sessions: true}).OK {
				t.Fatalf("seed %d %+v: SI store rejected:\n%v", seed, w, CheckTxns(h, TxnOptions{Model: SnapshotIsolation, Sessions: true}))
			}
			s := newRefStore(refNoWindow)
			if h := runInterleaved(s, w, 500, seed); CheckTxns(h, TxnOptions{Model: SnapshotIsolation}).OK && s.unsafe > 0 {
				missed++
				t.Logf("seed %d %+v: %d unsafe commits unseen", seed, w, s.unsafe)
			}
		}
	}
	t.Logf("broken validator passed SI in %d of 600 runs despite unsafe commits", missed)
}

// refRunner is a TxnRunner over a refStore for RunTxns: each step (begin,
// a micro-op, commit) holds the store's lock, and the goroutine yields
// between steps, so concurrent transactions interleave for real. Every
// fifth transaction is reported unknown (and committed or not).
type refRunner struct {
	mu sync.Mutex
	s  *refStore
	n  int
}

func (r *refRunner) step(f func()) {
	r.mu.Lock()
	f()
	r.mu.Unlock()
	runtime.Gosched()
}

func (r *refRunner) Run(_ context.Context, t Txn) ([]Mop, error) {
	var tx *refTxn
	n := 0
	r.step(func() { r.n++; n = r.n; tx = r.s.begin() })
	mops := cloneMops(t.Mops)
	for i := range mops {
		r.step(func() { r.s.exec(tx, &mops[i]) })
	}
	var err error
	r.step(func() {
		if n%5 != 0 || n%10 == 0 {
			err = r.s.commit(tx, mops)
		}
	})
	switch {
	case n%5 == 0:
		return nil, errors.New("connection lost")
	case err != nil:
		return nil, err
	}
	return mops, nil
}

func TestRunTxnsRecordsACheckableHistory(t *testing.T) {
	r := &refRunner{s: newRefStore(refSerializable)}
	h, err := RunTxns(context.Background(), r, TxnWorkload{Seed: 7, Processes: 4}, 400)
	if err != nil {
		t.Fatal(err)
	}
	ok, failed, unknown := h.Outcomes()
	if len(h.Txns) != 400 || ok < 200 || unknown < 50 {
		t.Fatalf("%d transactions, %d ok, %d unknown", len(h.Txns), ok, unknown)
	}
	if v := CheckTxns(h, TxnOptions{Model: StrictSerializable, Sessions: true}); !v.OK {
		t.Fatal(v)
	}
	t.Logf("%d committed, %d aborted, %d unknown", ok, failed, unknown)
}

// Through RunTxns too, with goroutines interleaving for real, the
// validator without the window check is caught.
func TestRunTxnsBrokenValidatorCaught(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		r := &refRunner{s: newRefStore(refNoWindow)}
		h, err := RunTxns(context.Background(), r, TxnWorkload{Seed: seed, Processes: 4}, 400)
		if err != nil {
			t.Fatal(err)
		}
		if r.s.unsafe < 20 {
			t.Logf("seed %d: only %d unsafe commits: the goroutines barely overlapped", seed, r.s.unsafe)
			continue
		}
		if v := CheckTxns(h, TxnOptions{Model: SnapshotIsolation}); v.OK {
			t.Fatalf("seed %d: %d unsafe commits, and the history passes snapshot isolation", seed, r.s.unsafe)
		}
	}
}

// BenchmarkListAppend checks 10,000-transaction list-append histories
// (5 processes, 4 keys in use at a time) from the reference store: a valid
// one under strict serializability, the SI store's under serializability
// (write skew: cycles to find) and the broken validator's under SI (many
// anomalies, large components).
func BenchmarkListAppend(b *testing.B) {
	for _, c := range []struct {
		name  string
		store refMode
		model TxnModel
		ok    bool
	}{
		{"valid-strict", refSerializable, StrictSerializable, true},
		{"si-store-serializable", refSI, Serializable, false},
		{"broken-si", refNoWindow, SnapshotIsolation, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := refWorkload
			w.Seed = 1
			h := runInterleaved(newRefStore(c.store), w, 10_000, 1)
			b.ResetTimer()
			for b.Loop() {
				if v := CheckTxns(h, TxnOptions{Model: c.model, Sessions: true}); v.OK != c.ok {
					b.Fatal(v)
				}
			}
			b.ReportMetric(float64(len(h.Txns)), "txns/op")
		})
	}
}

// replayMop applies m to cur, its key's value (a register holds one
// element), for the brute-force searches: a read must return cur (unless
// judge is false: a read nobody saw), and a versioned write must come after
// the key's last version in versions, which it advances.
func replayMop(cur []int, m Mop, judge bool, versions map[string]uint64) ([]int, bool) {
	switch {
	case m.Kind == MopAppend:
		return append(slices.Clip(cur), m.Value), true
	case m.Kind == MopWrite:
		if m.Version == 0 {
			return []int{m.Value}, true
		}
		ok := m.Version > versions[m.Key]
		versions[m.Key] = m.Version
		return []int{m.Value}, ok
	case !judge:
		return cur, true
	case m.List != nil:
		return cur, equalInts(cur, m.List)
	}
	return cur, len(cur) == 0 && m.Value == 0 || len(cur) == 1 && cur[0] == m.Value
}

// serialOrder searches the orders of h's committed transactions for one
// that explains every read (list-append: a read returns exactly what the
// transactions before it, and its own earlier micro-ops, appended; a
// register read the last value written) and installs each key's versioned
// writes in version order; with strict, the order must also respect real
// time. Small histories only.
//
// A transaction whose outcome is unknown may or may not be in the order;
// when it is, its reads are not judged (the client never saw them).
func serialOrder(h TxnHistory, strict bool) bool {
	var ok []Txn
	committed := 0
	for _, t := range h.Txns {
		switch t.Outcome {
		case OK:
			ok = append(ok, t)
			committed++
		case Unknown:
			ok = append(ok, t)
		}
	}
	used := make([]bool, len(ok))
	state := map[string][]int{} // a register holds one element
	version := map[string]uint64{}
	var try func(placed int) bool
	try = func(placed int) bool {
		if placed == committed {
			return true // the unknown transactions left did not commit
		}
		for i, t := range ok {
			if used[i] {
				continue
			}
			if strict {
				// Every unplaced transaction that returned before t was
				// invoked must come first.
				blocked := false
				for j, u := range ok {
					if !used[j] && j != i && u.Return < t.Invoke {
						blocked = true
						break
					}
				}
				if blocked {
					continue
				}
			}
			saved, savedVer := map[string][]int{}, map[string]uint64{}
			good := true
			for _, m := range t.Mops {
				if _, ok := saved[m.Key]; !ok {
					saved[m.Key], savedVer[m.Key] = state[m.Key], version[m.Key]
				}
				state[m.Key], good = replayMop(state[m.Key], m, t.Outcome == OK, version)
				if !good {
					break
				}
			}
			if good {
				used[i] = true
				next := placed
				if t.Outcome == OK {
					next++
				}
				if try(next) {
					return true
				}
				used[i] = false
			}
			for k, v := range saved {
				state[k], version[k] = v, savedVer[k]
			}
		}
		return false
	}
	return try(0)
}

// On small histories (up to 6 transactions, some of unknown outcome;
// 30,000 histories of up to 8 with KEFIR_SOAK=1), list-append and rw-register
// with versions, the checker's serializable and strict-serializable
// verdicts agree with a brute-force search for a serial order: no anomaly
// is invented, none is missed.
func TestTxnCheckerAgreesWithBruteForce(t *testing.T) {
	histories, most := 1500, 6
	if os.Getenv("KEFIR_SOAK") == "1" {
		histories, most = 30000, 8
	}
	checked, anomalous, withUnknown := 0, 0, 0
	for seed := int64(1); checked < histories; seed++ {
		w := TxnWorkload{Seed: seed, Processes: 2 + int(seed%3), Keys: 1 + int(seed%3), MaxMops: 1 + int(seed%4), Register: seed/3%2 == 1}
		n := 2 + int(seed)%(most-1)
		mode := []refMode{refNoWindow, refSI, refSerializable}[seed%3]
		h := runInterleaved(newRefStore(mode), w, n, seed)
		if _, _, unknown := h.Outcomes(); unknown > 0 {
			withUnknown++
		}
		checked++
		for _, strict := range []bool{false, true} {
			model := Serializable
			if strict {
				model = StrictSerializable
			}
			v := CheckTxns(h, TxnOptions{Model: model})
			if want := serialOrder(h, strict); v.OK != want {
				var b strings.Builder
				for _, x := range h.Txns {
					fmt.Fprintf(&b, "\n  %v", x)
				}
				t.Fatalf("seed %d %v: checker ok=%t, a serial order exists=%t:%s\n%v", seed, model, v.OK, want, b.String(), v)
			}
			if !v.OK {
				anomalous++
			}
		}
	}
	t.Logf("%d histories (%d with unknown outcomes), %d verdicts with an anomaly", checked, withUnknown, anomalous)
}

// siOrder searches for a snapshot-isolation execution of h's committed
// transactions: a commit order and, for each transaction, a snapshot (a
// prefix of that order) such that its reads show the snapshot plus its own
// appends, and no transaction committing between its snapshot and its own
// commit wrote a key it writes (first committer wins). Small histories.
func siOrder(h TxnHistory) bool {
	var ok []Txn
	for _, t := range h.Txns {
		if t.Outcome == OK {
			ok = append(ok, t)
		}
	}
	writes := make([]map[string]bool, len(ok))
	for i, t := range ok {
		writes[i] = map[string]bool{}
		for _, m := range t.Mops {
			if m.Kind == MopAppend || m.Kind == MopWrite {
				writes[i][m.Key] = true
			}
		}
	}
	used := make([]bool, len(ok))
	order := []int{}
	states := []map[string][]int{{}} // states[p]: after the first p commits
	versions := []map[string]uint64{{}}
	var try func() bool
	try = func() bool {
		p := len(order)
		if p == len(ok) {
			return true
		}
		for i, t := range ok {
			if used[i] {
				continue
			}
		snapshots:
			for s := p; s >= 0; s-- {
				for _, j := range order[s:] {
					for k := range writes[i] {
						if writes[j][k] {
							continue snapshots
						}
					}
				}
				view := map[string][]int{}
				nextVer := maps.Clone(versions[p])
				good := true
				for _, m := range t.Mops {
					cur, seen := view[m.Key]
					if !seen {
						cur = states[s][m.Key]
					}
					// A versioned write is installed at commit: after the
					// versions so far.
					cur, good = replayMop(cur, m, true, nextVer)
					if !good {
						break
					}
					view[m.Key] = cur
				}
				if !good {
					continue
				}
				next := maps.Clone(states[p])
				for k := range writes[i] {
					next[k] = view[k]
				}
				used[i] = true
				order = append(order, i)
				states = append(states, next)
				versions = append(versions, nextVer)
				if try() {
					return true
				}
				versions = versions[:len(versions)-1]
				states = states[:len(states)-1]
				order = order[:len(order)-1]
				used[i] = false
			}
		}
		return false
	}
	return try()
}

// The snapshot-isolation verdict agrees with a brute-force search for an
// SI execution on small list-append and rw-register (with versions)
// histories.
func TestTxnSIAgreesWithBruteForce(t *testing.T) {
	histories, most := 1500, 6
	if os.Getenv("KEFIR_SOAK") == "1" {
		histories, most = 20000, 7
	}
	checked, anomalous := 0, 0
	for seed := int64(1); checked < histories; seed++ {
		w := TxnWorkload{Seed: seed, Processes: 2 + int(seed%3), Keys: 1 + int(seed%3), MaxMops: 1 + int(seed%4), Register: seed/2%2 == 1}
		n := 2 + int(seed)%(most-1)
		mode := []refMode{refNoWindow, refSI}[seed%2]
		h := runInterleaved(newRefStore(mode), w, n, seed)
		if _, _, unknown := h.Outcomes(); unknown > 0 {
			continue
		}
		checked++
		v := CheckTxns(h, TxnOptions{Model: SnapshotIsolation})
		if want := siOrder(h); v.OK != want {
			var b strings.Builder
			for _, x := range h.Txns {
				fmt.Fprintf(&b, "\n  %v", x)
			}
			t.Fatalf("seed %d: checker ok=%t, an SI execution exists=%t:%s\n%v", seed, v.OK, want, b.String(), v)
		}
		if !v.OK {
			anomalous++
		}
	}
	t.Logf("%d histories, %d not SI", checked, anomalous)
}
