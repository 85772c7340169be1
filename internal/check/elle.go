package check

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// CheckTxns judges a transaction history (txn.go) against an isolation
// model the way Elle does (Kingsbury & Alvaro, VLDB 2020; Adya's thesis
// for the anomalies): it infers, from what the transactions read, the
// dependency graph between them —
//
//	Ti -ww-> Tj  Tj wrote the version of a key right after Ti's;
//	Ti -wr-> Tj  Tj read the version Ti wrote;
//	Ti -rw-> Tj  Ti read a version and Tj wrote the next one (anti-dependency);
//
// plus, as the model asks, real-time edges (Ti returned before Tj was
// invoked: strict serializability) and process edges (session order) —
// and finds its cycles (Tarjan's strongly connected components, then the
// shortest cycle of each kind inside each component). A cycle is named by
// its edges: G0 (ww only), G1c (ww and wr), G-single (exactly one rw),
// G-nonadjacent (two or more rw, no two of them adjacent), G2-item (two or
// more rw, some adjacent); "-realtime" or "-process" is appended when it
// needs such an edge. Anomalies visible without a cycle are reported too:
// G1a (a read saw an aborted write), G1b (a read saw a transaction's
// intermediate write), lost-update, internal (a transaction's read
// disagrees with its own earlier reads and writes), and the data-integrity
// ones (incompatible-order, duplicate-elements, garbage-read,
// duplicate-write). docs/design/txn-checker.md has the details.

// TxnModel is an isolation model: the set of anomalies it forbids.
type TxnModel uint8

const (
	// ReadCommitted (Adya PL-2) forbids G0, G1a, G1b, G1c.
	ReadCommitted TxnModel = iota + 1
	// SnapshotIsolation also forbids G-single, G-nonadjacent and
	// lost-update; it allows G2-item (write skew: two adjacent rw edges).
	SnapshotIsolation
	// Serializable (Adya PL-3) forbids every cycle, G2-item included.
	Serializable
	// StrictSerializable is Serializable with real-time edges: a
	// transaction that returned before another was invoked precedes it.
	StrictSerializable
)

func (m TxnModel) String() string {
	switch m {
	case ReadCommitted:
		return "read-committed"
	case SnapshotIsolation:
		return "snapshot-isolation"
	case Serializable:
		return "serializable"
	case StrictSerializable:
		return "strict-serializable"
	}
	return fmt.Sprintf("model(%d)", uint8(m))
}

// Anomaly names.
const (
	G0                = "G0"
	G1a               = "G1a"
	G1b               = "G1b"
	G1c               = "G1c"
	GSingle           = "G-single"
	GNonadjacent      = "G-nonadjacent"
	G2Item            = "G2-item"
	LostUpdate        = "lost-update"
	Internal          = "internal"
	IncompatibleOrder = "incompatible-order"
	DuplicateElements = "duplicate-elements"
	GarbageRead       = "garbage-read"
	DuplicateWrite    = "duplicate-write"
)

// Forbids reports whether m forbids the anomaly name (a base name, or one
// with a -realtime or -process suffix, which the graph only contains when
// the model or the options asked for those edges).
func (m TxnModel) Forbids(name string) bool {
	name = strings.TrimSuffix(strings.TrimSuffix(name, "-realtime"), "-process")
	switch name {
	case Internal, IncompatibleOrder, DuplicateElements, GarbageRead, DuplicateWrite, G0, G1a, G1b, G1c:
		return true
	case GSingle, GNonadjacent, LostUpdate:
		return m >= SnapshotIsolation
	case G2Item:
		return m >= Serializable
	}
	return true // an anomaly this table does not know is not allowed by default
}

// TxnOptions configures AnalyzeTxns and CheckTxns.
type TxnOptions struct {
	Model TxnModel // 0 = StrictSerializable
	// Sessions adds process edges (each process's transactions in order):
	// the "strong session" variant of the model, in which a process sees
	// its own earlier transactions. StrictSerializable implies it.
	Sessions bool
	// SearchBudget bounds the nodes visited while looking for G-single
	// cycles across components (0 = 2,000,000); when it runs out the
	// verdict's note says so.
	SearchBudget int
}

// Anomaly is one anomaly found in a history.
type Anomaly struct {
	Name        string // e.g. "G-single", "G2-item-realtime", "G1a"
	Key         string // the key involved (the first, for a cycle)
	Explanation string // e.g. "T1 -ww(x: 1 then 2)-> T2 -rw(y: read nil, next 3)-> T1"
	Txns        []Txn  // the transactions, in cycle order for a cycle
}

// TxnAnalysis is what AnalyzeTxns found.
type TxnAnalysis struct {
	Txns      int // transactions looked at
	Edges     int // dependency edges inferred
	Anomalies []Anomaly
	Note      string
}

// Names returns the distinct anomaly names found, sorted.
func (a TxnAnalysis) Names() []string {
	set := map[string]bool{}
	for _, an := range a.Anomalies {
		set[an.Name] = true
	}
	return sortedKeys(set)
}

// CheckTxns judges h against o.Model: the verdict fails on any anomaly the
// model forbids, each reported with the transactions that show it.
func CheckTxns(h TxnHistory, o TxnOptions) Verdict {
	if o.Model == 0 {
		o.Model = StrictSerializable
	}
	a := AnalyzeTxns(h, o)
	v := Verdict{Checker: "txn-" + o.Model.String(), OK: true, Checked: a.Txns, Note: a.Note}
	for _, an := range a.Anomalies {
		if !o.Model.Forbids(an.Name) {
			continue
		}
		v.add(Violation{Key: an.Key, Reason: an.Name + ": " + an.Explanation, Txns: an.Txns})
	}
	return v
}

// AnalyzeTxns finds every anomaly in h, whatever the model forbids; o.Model
// only decides which extra edges the graph has (real-time for
// StrictSerializable; process with o.Sessions; from SnapshotIsolation up,
// the write orders writeOrderFromMisses infers).
func AnalyzeTxns(h TxnHistory, o TxnOptions) TxnAnalysis {
	if o.Model == 0 {
		o.Model = StrictSerializable
	}
	if o.SearchBudget == 0 {
		o.SearchBudget = 2_000_000
	}
	x := &txnAnalyzer{h: &h, g: newTxnGraph(len(h.Txns))}
	x.inferKeys()
	if o.Model >= SnapshotIsolation {
		x.writeOrderFromMisses()
	}
	if o.Model == StrictSerializable {
		x.realtimeEdges()
	}
	if o.Sessions {
		x.processEdges()
	}
	x.cycles(o.SearchBudget)
	return TxnAnalysis{Txns: len(h.Txns), Edges: x.g.edges, Anomalies: x.anoms, Note: strings.Join(x.notes, "; ")}
}

type txnAnalyzer struct {
	h     *TxnHistory
	g     *txnGraph
	anoms []Anomaly
	notes []string
	vers  map[keyVal]uint64 // rw-register write versions, built on first use
	// writers: the transaction (and whether its last to the key) of each
	// value written
	writers map[keyVal]writeRef
}

func (x *txnAnalyzer) anomaly(name, key, expl string, txns ...int) {
	a := Anomaly{Name: name, Key: key, Explanation: expl}
	for _, t := range txns {
		a.Txns = append(a.Txns, x.h.Txns[t])
	}
	x.anoms = append(x.anoms, a)
}

// writeRef locates a write: its transaction, and whether it is that
// transaction's last write to the key (the version it installs; an earlier
// one is intermediate).
type writeRef struct {
	txn   int
	final bool
}

type keyVal struct {
	key string
	val int
}

// extRead is a committed transaction's external read of a key: the first
// read of it, made before the transaction wrote it.
type extRead struct {
	txn   int
	list  []int // list-append
	val   int   // rw-register
	write bool  // the transaction also wrote the key afterwards
}

// keyInfo gathers what the history says about one key.
type keyInfo struct {
	list      bool // list-append (else rw-register)
	reads     []extRead
	allReads  []extRead // every committed read (list-append), for the version order
	finalVals []keyVal  // rw-register: the final write of each non-aborted transaction
	committed []keyVal  // list-append: the appends of committed transactions
}

func (x *txnAnalyzer) inferKeys() {
	txns := x.h.Txns
	writers := make(map[keyVal]writeRef)
	x.writers = writers // filled below, read by the per-key inference
	keys := make(map[string]*keyInfo)
	info := func(k string) *keyInfo {
		ki := keys[k]
		if ki == nil {
			ki = &keyInfo{}
			keys[k] = ki
		}
		return ki
	}
	for i := range txns {
		last := map[string]int{} // key -> index of the transaction's last write to it
		for j, m := range txns[i].Mops {
			if m.Kind == MopAppend || m.Kind == MopWrite {
				last[m.Key] = j
			}
			if m.Kind == MopAppend || m.Kind == MopRead && m.List != nil {
				info(m.Key).list = true
			}
		}
		for j, m := range txns[i].Mops {
			if m.Kind != MopAppend && m.Kind != MopWrite {
				continue
			}
			kv := keyVal{m.Key, m.Value}
			if w, dup := writers[kv]; dup {
				x.anomaly(DuplicateWrite, m.Key, fmt.Sprintf("T%d and T%d both wrote %d to %s: values must be unique per key", w.txn, i, m.Value, m.Key), w.txn, i)
				continue
			}
			writers[kv] = writeRef{i, last[m.Key] == j}
			if m.Kind == MopAppend && txns[i].Outcome == OK {
				ki := info(m.Key)
				ki.committed = append(ki.committed, kv)
			}
			if m.Kind == MopWrite && last[m.Key] == j && txns[i].Outcome != Failed {
				ki := info(m.Key)
				ki.finalVals = append(ki.finalVals, kv)
			}
		}
	}
	// A register write of an unknown transaction is a version only if
	// someone read it: it may never have committed.
	readVals := map[keyVal]bool{}
	for _, t := range txns {
		for _, m := range t.Mops {
			if t.Outcome == OK && m.Kind == MopRead && m.List == nil {
				readVals[keyVal{m.Key, m.Value}] = true
			}
		}
	}
	for _, ki := range keys {
		kept := ki.finalVals[:0]
		for _, kv := range ki.finalVals {
			if txns[writers[kv].txn].Outcome == OK || readVals[kv] {
				kept = append(kept, kv)
			}
		}
		ki.finalVals = kept
	}
	for i := range txns {
		if txns[i].Outcome == OK {
			x.internalAndReads(i, keys, info)
		}
	}
	for _, k := range sortedKeys(keys) {
		ki := keys[k]
		if ki.list {
			x.listKey(k, ki)
		} else {
			x.registerKey(k, ki)
		}
	}
}

// internalAndReads checks that transaction i's reads agree with its own
// earlier reads and writes, and collects its reads.
func (x *txnAnalyzer) internalAndReads(i int, keys map[string]*keyInfo, info func(string) *keyInfo) {
	type state struct {
		read     bool  // the key was read before
		prev     []int // list: what the last read returned
		val      int   // register: the value known (read or written)
		known    bool  // register: val is known
		appended []int // list: appended since the last read
		wrote    bool
		ext      int // index in keys[k].reads of the external read, -1 if none
	}
	st := map[string]*state{}
	for _, m := range x.h.Txns[i].Mops {
		s := st[m.Key]
		if s == nil {
			s = &state{ext: -1}
			st[m.Key] = s
		}
		ki := info(m.Key)
		switch m.Kind {
		case MopAppend:
			s.appended = append(s.appended, m.Value)
			s.wrote = true
		case MopWrite:
			s.val, s.known, s.wrote = m.Value, true, true
		case MopRead:
			if ki.list {
				got := m.List
				switch {
				case s.read && !equalInts(got, append(append([]int{}, s.prev...), s.appended...)):
					x.anomaly(Internal, m.Key, fmt.Sprintf("T%d read %s of %s after reading %s and appending %s", i, fmtList(got), m.Key, fmtList(s.prev), fmtList(s.appended)), i)
				case !s.read && !hasSuffix(got, s.appended):
					x.anomaly(Internal, m.Key, fmt.Sprintf("T%d read %s of %s after appending %s", i, fmtList(got), m.Key, fmtList(s.appended)), i)
				}
				s.prev, s.appended = got, nil
				ki.allReads = append(ki.allReads, extRead{txn: i, list: got})
			} else if s.known && m.Value != s.val {
				x.anomaly(Internal, m.Key, fmt.Sprintf("T%d read %s of %s after it read or wrote %s", i, fmtReg(m.Value), m.Key, fmtReg(s.val)), i)
			}
			if !s.read && !s.wrote {
				s.ext = len(ki.reads)
				ki.reads = append(ki.reads, extRead{txn: i, list: m.List, val: m.Value})
			}
			s.read = true
			if !ki.list {
				s.val, s.known = m.Value, true
			}
		}
	}
	for k, s := range st {
		if s.ext >= 0 && s.wrote {
			keys[k].reads[s.ext].write = true
		}
	}
}

// observed reports, for a value read on key by reader, the anomalies that
// need no graph: garbage (nobody wrote it), G1a (an aborted transaction
// did), G1b when last (an intermediate write of another transaction).
func (x *txnAnalyzer) observed(key string, reader, v int, last bool, seenG1a map[[2]int]bool) (writeRef, bool) {
	w, ok := x.writers[keyVal{key, v}]
	if !ok {
		x.anomaly(GarbageRead, key, fmt.Sprintf("T%d read %d from %s, which no transaction wrote", reader, v, key), reader)
		return w, false
	}
	if w.txn == reader {
		return w, true
	}
	if x.h.Txns[w.txn].Outcome == Failed {
		if !seenG1a[[2]int{reader, w.txn}] {
			seenG1a[[2]int{reader, w.txn}] = true
			x.anomaly(G1a, key, fmt.Sprintf("T%d read %d from %s, written by T%d, which aborted", reader, v, key, w.txn), w.txn, reader)
		}
		return w, false
	}
	if last && !w.final {
		x.anomaly(G1b, key, fmt.Sprintf("T%d read %d from %s, an intermediate write of T%d (which wrote %s again later)", reader, v, key, w.txn, key), w.txn, reader)
	}
	return w, true
}

// graphNode reports whether transaction t belongs in the graph: aborted
// transactions do not (reading from one is G1a).
func (x *txnAnalyzer) graphNode(t int) bool { return x.h.Txns[t].Outcome != Failed }

func (x *txnAnalyzer) listKey(k string, ki *keyInfo) {
	writers := x.writers
	seenG1a := map[[2]int]bool{}
	// The version order is the longest read; every read must be a prefix of
	// it, or two reads disagree on the order (no serial order explains both).
	var longest []int
	longestBy := -1
	for _, r := range ki.allReads {
		if len(r.list) > len(longest) {
			longest, longestBy = r.list, r.txn
		}
	}
	incompatible := false
	for _, r := range ki.allReads {
		if !isPrefix(r.list, longest) && !incompatible {
			incompatible = true
			x.anomaly(IncompatibleOrder, k, fmt.Sprintf("T%d read %s of %s and T%d read %s: neither is a prefix of the other", r.txn, fmtList(r.list), k, longestBy, fmtList(longest)), r.txn, longestBy)
		}
		dup := map[int]bool{}
		for j, v := range r.list {
			if dup[v] {
				x.anomaly(DuplicateElements, k, fmt.Sprintf("T%d read %s of %s: %d twice", r.txn, fmtList(r.list), k, v), r.txn)
				break
			}
			dup[v] = true
			x.observed(k, r.txn, v, j == len(r.list)-1, seenG1a)
		}
	}
	// w[j]: the writer of longest[j], the j-th version (-1: unknown or aborted).
	w := make([]int, len(longest))
	for j, v := range longest {
		w[j] = -1
		if ref, ok := writers[keyVal{k, v}]; ok && x.graphNode(ref.txn) {
			w[j] = ref.txn
		}
	}
	// ww between consecutive known versions (an aborted or unknown writer
	// in between is skipped: reading it is reported as G1a or garbage).
	prevJ := -1
	for j := range longest {
		if w[j] < 0 {
			continue
		}
		if prevJ >= 0 {
			x.g.add(w[prevJ], w[j], txnEdge{kind: ekWW, key: k, a: longest[prevJ], b: longest[j], later: j > prevJ+1})
		}
		prevJ = j
	}
	x.unreadAppends(k, ki, longest, w)
	byLen := map[int][]int{} // external read length -> transactions that read it, then appended
	for _, r := range ki.reads {
		n := len(r.list)
		if n > 0 {
			// wr: from the writer of the last element read (the version read).
			if ref, ok := writers[keyVal{k, r.list[n-1]}]; ok && x.graphNode(ref.txn) {
				x.g.add(ref.txn, r.txn, txnEdge{kind: ekWR, key: k, a: r.list[n-1], b: r.list[n-1]})
			}
		}
		if !isPrefix(r.list, longest) {
			continue // its place in the order is unknown
		}
		prev := 0
		if n > 0 {
			prev = r.list[n-1]
		}
		next := n
		for next < len(longest) && w[next] < 0 {
			next++
		}
		if next < len(longest) {
			x.g.add(r.txn, w[next], txnEdge{kind: ekRW, key: k, a: prev, b: longest[next], later: next > n})
		}
		if r.write {
			byLen[n] = append(byLen[n], r.txn)
		}
	}
	x.lostUpdates(k, byLen, func(n int) string {
		if n == 0 {
			return "nil"
		}
		return fmt.Sprintf("%s (length %d)", fmtList(longest[:n]), n)
	})
}

// unreadAppends orders the committed appends to k that no read shows after
// every version read: lists only grow, so the version that adds such an
// element comes after the longest read. Each gets a ww edge from the last
// known writer of the longest read, and an rw edge from each transaction
// that read it whole: an acknowledged append that a later transaction does
// not see closes a cycle with the real-time edge between them (a lost
// write).
func (x *txnAnalyzer) unreadAppends(k string, ki *keyInfo, longest []int, w []int) {
	var read map[int]bool
	for _, kv := range ki.committed {
		if read == nil {
			// Every element any read shows (an element some read shows
			// outside the longest one is an incompatible order already).
			read = make(map[int]bool, len(longest))
			for _, r := range ki.allReads {
				for _, v := range r.list {
					read[v] = true
				}
			}
		}
		if read[kv.val] {
			continue
		}
		t := x.writers[kv].txn
		for j := len(longest) - 1; j >= 0; j-- {
			if w[j] >= 0 {
				x.g.add(w[j], t, txnEdge{kind: ekWW, key: k, a: longest[j], b: kv.val, later: true})
				break
			}
		}
		last := 0
		if len(longest) > 0 {
			last = longest[len(longest)-1]
		}
		for _, r := range ki.reads {
			if len(r.list) == len(longest) && isPrefix(r.list, longest) {
				x.g.add(r.txn, t, txnEdge{kind: ekRW, key: k, a: last, b: kv.val, later: true})
			}
		}
	}
}

// lostUpdates reports committed transactions that read the same version of
// k and then both wrote k: one of the writes was made without seeing the
// other.
func (x *txnAnalyzer) lostUpdates(k string, byVersion map[int][]int, name func(int) string) {
	for _, ver := range sortedInts(byVersion) {
		ts := byVersion[ver]
		if len(ts) < 2 {
			continue
		}
		ids := make([]string, len(ts))
		for i, t := range ts {
			ids[i] = fmt.Sprintf("T%d", t)
		}
		x.anomaly(LostUpdate, k, fmt.Sprintf("%s all read %s of %s and wrote %s", strings.Join(ids, ", "), name(ver), k, k), ts...)
	}
}

func (x *txnAnalyzer) registerKey(k string, ki *keyInfo) {
	writers := x.writers
	seenG1a := map[[2]int]bool{}
	readersOf := map[int][]int{} // value read (0 = nil) -> external readers
	byVal := map[int][]int{}     // value read -> readers that then wrote k
	for _, r := range ki.reads {
		readersOf[r.val] = append(readersOf[r.val], r.txn)
		if r.write {
			byVal[r.val] = append(byVal[r.val], r.txn)
		}
		if r.val == 0 {
			continue
		}
		if ref, ok := x.observed(k, r.txn, r.val, true, seenG1a); ok {
			x.g.add(ref.txn, r.txn, txnEdge{kind: ekWR, key: k, a: r.val, b: r.val})
		}
	}
	writerOf := func(v int) int { return writers[keyVal{k, v}].txn }
	// The store's versions order the installed writes when every committed
	// one carries its version. An unknown transaction's write has none (its
	// reply was lost); it is left out of the order, so the edges around it
	// join a version to a later one, not necessarily the next.
	versioned := len(ki.finalVals) > 0
	var vals []int
	gap := false
	for _, kv := range ki.finalVals {
		switch {
		case x.versionOf(k, kv.val) != 0:
			vals = append(vals, kv.val)
		case x.h.Txns[writerOf(kv.val)].Outcome == OK:
			versioned = false
		default:
			gap = true
		}
	}
	if versioned {
		sort.SliceStable(vals, func(i, j int) bool { return x.versionOf(k, vals[i]) < x.versionOf(k, vals[j]) })
		prev := 0
		for _, v := range vals {
			if prev != 0 {
				x.g.add(writerOf(prev), writerOf(v), txnEdge{kind: ekWW, key: k, a: prev, b: v, later: gap})
			}
			for _, r := range readersOf[prev] {
				x.g.add(r, writerOf(v), txnEdge{kind: ekRW, key: k, a: prev, b: v, later: gap})
			}
			prev = v
		}
	} else {
		// Without versions: the initial nil precedes every write, and a
		// transaction that read v and then wrote k wrote a later version
		// (every model from snapshot isolation up implies it).
		for _, kv := range ki.finalVals {
			for _, r := range readersOf[0] {
				x.g.add(r, writerOf(kv.val), txnEdge{kind: ekRW, key: k, a: 0, b: kv.val, later: true})
			}
		}
		for _, r := range ki.reads {
			if !r.write || r.val == 0 {
				continue
			}
			own := x.finalWrite(r.txn, k)
			if own == 0 {
				continue
			}
			if ref, ok := writers[keyVal{k, r.val}]; ok && x.graphNode(ref.txn) {
				x.g.add(ref.txn, r.txn, txnEdge{kind: ekWW, key: k, a: r.val, b: own, later: true})
			}
			for _, o := range readersOf[r.val] {
				x.g.add(o, r.txn, txnEdge{kind: ekRW, key: k, a: r.val, b: own, later: true})
			}
		}
	}
	x.lostUpdates(k, byVal, fmtReg)
}

// versionOf is the store version of the write of v to k (0: unknown).
func (x *txnAnalyzer) versionOf(k string, v int) uint64 {
	if x.vers == nil {
		x.vers = map[keyVal]uint64{}
		for _, t := range x.h.Txns {
			for _, m := range t.Mops {
				if m.Kind == MopWrite && m.Version != 0 {
					x.vers[keyVal{m.Key, m.Value}] = m.Version
				}
			}
		}
	}
	return x.vers[keyVal{k, v}]
}

// finalWrite is transaction t's last value written to k (0: none).
func (x *txnAnalyzer) finalWrite(t int, k string) int {
	v := 0
	for _, m := range x.h.Txns[t].Mops {
		if m.Kind == MopWrite && m.Key == k {
			v = m.Value
		}
	}
	return v
}

// writeOrderFromMisses orders writes the reads leave unordered (appends no
// read shows, register writes without versions), with a rule every model
// from snapshot isolation up obeys: if Tj -rw-> Ti (Tj did not see a write
// of Ti) and both wrote key k, then Tj's write of k comes first — under
// serializability Tj precedes Ti; under snapshot isolation Ti committed
// after Tj's snapshot, so, writing the same key, it cannot have been
// concurrent with Tj (first committer wins) and started after Tj
// committed. Without it, two such writers whose own writes nobody read
// look like write skew (two rw edges) when every order of their writes
// makes a G-single.
func (x *txnAnalyzer) writeOrderFromMisses() {
	written := make([][]string, len(x.h.Txns)) // keys each transaction wrote, once each
	for i, t := range x.h.Txns {
		for _, m := range t.Mops {
			if (m.Kind == MopAppend || m.Kind == MopWrite) && !slices.Contains(written[i], m.Key) {
				written[i] = append(written[i], m.Key)
			}
		}
	}
	for a := range x.g.adj {
		if written[a] == nil {
			continue
		}
		for _, e := range x.g.adj[a] {
			b := int(e.to)
			if e.kind != ekRW || written[b] == nil {
				continue
			}
			for _, k := range written[a] {
				if slices.Contains(written[b], k) {
					x.g.add(a, b, txnEdge{kind: ekWWI, key: k, missed: e.key})
				}
			}
		}
	}
}

// realtimeEdges adds Ti -rt-> Tj when Ti returned before Tj was invoked, as
// a transitive reduction: each invocation gets edges from the "frontier",
// the completed transactions no later-completed one is known to follow.
// Frontier members overlap pairwise, so it holds at most one per process.
func (x *txnAnalyzer) realtimeEdges() {
	type event struct {
		at     int64
		invoke bool
		txn    int
	}
	var evs []event
	for i, t := range x.h.Txns {
		if !x.graphNode(i) {
			continue
		}
		evs = append(evs, event{t.Invoke, true, i})
		if t.Return != Never {
			evs = append(evs, event{t.Return, false, i})
		}
	}
	// Invocations before completions at the same instant: precedence is strict.
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].invoke && !evs[j].invoke
	})
	var frontier []int
	preds := map[int][]int{}
	for _, e := range evs {
		if e.invoke {
			preds[e.txn] = append([]int(nil), frontier...)
			for _, f := range frontier {
				x.g.add(f, e.txn, txnEdge{kind: ekRT})
			}
			continue
		}
		drop := map[int]bool{}
		for _, p := range preds[e.txn] {
			drop[p] = true
		}
		delete(preds, e.txn)
		kept := frontier[:0]
		for _, f := range frontier {
			if !drop[f] {
				kept = append(kept, f)
			}
		}
		frontier = append(kept, e.txn)
	}
}

// processEdges adds each process's transactions in invocation order.
func (x *txnAnalyzer) processEdges() {
	last := map[int]int{}
	order := make([]int, 0, len(x.h.Txns))
	for i := range x.h.Txns {
		if x.graphNode(i) {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return x.h.Txns[order[a]].Invoke < x.h.Txns[order[b]].Invoke })
	for _, i := range order {
		p := x.h.Txns[i].Process
		if prev, ok := last[p]; ok {
			x.g.add(prev, i, txnEdge{kind: ekProc, a: p})
		}
		last[p] = i
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func isPrefix(p, l []int) bool { return len(p) <= len(l) && equalInts(p, l[:len(p)]) }

func hasSuffix(l, s []int) bool { return len(s) <= len(l) && equalInts(s, l[len(l)-len(s):]) }

func sortedInts[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
