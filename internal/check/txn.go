package check

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Transaction histories (issue 29, Verification), judged by CheckTxns
// (elle.go). A transaction is a list of micro-operations over keys, as in
// Elle (Kingsbury & Alvaro, VLDB 2020), in one of two workloads:
//
//   - list-append: a key holds a list; `append k x` adds x to its end and
//     `r k [x y ...]` reads the whole list. Because every read returns the
//     key's full history, the version order of a key is recovered from its
//     longest read, and every dependency (ww, wr, rw) between transactions
//     can be inferred;
//   - rw-register: `w k x` sets the key, `r k x` reads it (0 = absent).
//     Reads name the write they observed (values are unique per key); the
//     order of writes is known only from server versions (Mop.Version),
//     when the store reports them, or from a transaction that read one
//     value and then wrote the next.
//
// Values are ints, unique per key among writes, and never 0. One workload
// per key: a key either appended to or written.

// MopKind is a micro-operation's kind.
type MopKind uint8

const (
	MopRead   MopKind = iota + 1 // r k: Value (register) or List (list-append)
	MopWrite                     // w k Value (rw-register)
	MopAppend                    // append k Value (list-append)
)

func (k MopKind) String() string {
	switch k {
	case MopRead:
		return "r"
	case MopWrite:
		return "w"
	case MopAppend:
		return "append"
	}
	return fmt.Sprintf("mop(%d)", uint8(k))
}

// Mop is one micro-operation of a transaction. A read's result (Value or
// List) is meaningful only in a transaction whose Outcome is OK.
type Mop struct {
	Kind MopKind
	Key  string
	// Value: the value written or appended; for a register read, the value
	// read (0: the key was absent).
	Value int
	// List: a list read's result, oldest element first; never nil for a
	// list read ([]int{}: absent or empty), since a non-nil List is what
	// marks a read as a list read.
	List []int
	// Version: the store's version of a register write, when it reports one
	// (0: unknown). Versions order the writes of one key (rw-register only).
	Version uint64
}

func (m Mop) String() string {
	switch {
	case m.Kind == MopRead && m.List != nil:
		return fmt.Sprintf("r %s %s", m.Key, fmtList(m.List))
	case m.Kind == MopRead:
		return fmt.Sprintf("r %s %s", m.Key, fmtReg(m.Value))
	}
	s := fmt.Sprintf("%v %s %d", m.Kind, m.Key, m.Value)
	if m.Version != 0 {
		s += fmt.Sprintf(" v%d", m.Version)
	}
	return s
}

func fmtList(l []int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, x := range l {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(x))
	}
	b.WriteByte(']')
	return b.String()
}

func fmtReg(v int) string {
	if v == 0 {
		return "nil"
	}
	return strconv.Itoa(v)
}

// Txn is one transaction: who ran it, when, what it did and how it ended.
// Outcome is OK (committed, reads meaningful), Failed (definitely aborted:
// none of its writes may ever be seen) or Unknown (may or may not have
// committed; its reads are not judged, its writes may be seen).
type Txn struct {
	ID      int // index in TxnHistory.Txns
	Process int // client process; one transaction in flight per process
	Mops    []Mop
	Outcome Outcome
	// Invoke and Return are times on the recorder's clock; Return is Never
	// for an Unknown transaction.
	Invoke, Return int64
}

func (t Txn) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "T%d p%d [", t.ID, t.Process)
	for i, m := range t.Mops {
		if i > 0 {
			b.WriteString(", ")
		}
		if m.Kind == MopRead && t.Outcome != OK {
			// The client never saw this read's result.
			fmt.Fprintf(&b, "r %s _", m.Key)
			continue
		}
		b.WriteString(m.String())
	}
	ret := "inf"
	if t.Return != Never {
		ret = strconv.FormatInt(t.Return, 10)
	}
	fmt.Fprintf(&b, "] %v [%d,%s]", t.Outcome, t.Invoke, ret)
	return b.String()
}

// TxnHistory is a finished recording of transactions.
type TxnHistory struct {
	Txns []Txn
}

// Outcomes counts the committed, aborted and unknown transactions.
func (h TxnHistory) Outcomes() (ok, failed, unknown int) {
	for _, t := range h.Txns {
		switch t.Outcome {
		case OK:
			ok++
		case Failed:
			failed++
		case Unknown:
			unknown++
		}
	}
	return ok, failed, unknown
}

// TxnRecorder collects a transaction history; safe for concurrent use.
type TxnRecorder struct {
	mu   sync.Mutex
	now  func() int64
	txns []Txn
	busy map[int]int // process -> id of its transaction in flight
}

// NewTxnRecorder returns a recorder timestamping with now (nil: the
// process's monotonic clock, as NewRecorder).
func NewTxnRecorder(now func() int64) *TxnRecorder {
	if now == nil {
		start := time.Now()
		now = func() int64 { return int64(time.Since(start)) }
	}
	return &TxnRecorder{now: now, busy: make(map[int]int)}
}

// Invoke records the start of t (its ID, times and outcome are overwritten;
// its mops are copied) and returns its id. A second Invoke for a process
// with a transaction in flight is a harness bug and panics.
func (r *TxnRecorder) Invoke(t Txn) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.busy[t.Process]; ok {
		panic(fmt.Sprintf("check: process %d invoked a transaction while T%d is in flight", t.Process, prev))
	}
	t.ID = len(r.txns)
	t.Invoke = r.now()
	t.Return = 0
	t.Outcome = Pending
	t.Mops = cloneMops(t.Mops)
	r.txns = append(r.txns, t)
	r.busy[t.Process] = t.ID
	return t.ID
}

// Complete records a committed transaction with its completed mops (reads
// filled in); they must be the invoked mops, in order.
func (r *TxnRecorder) Complete(id int, mops []Mop) { r.finish(id, OK, mops) }

// Fail records a transaction that definitely aborted.
func (r *TxnRecorder) Fail(id int) { r.finish(id, Failed, nil) }

// Unknown records a transaction whose commit is unknown (timeout, lost
// connection, crash).
func (r *TxnRecorder) Unknown(id int) { r.finish(id, Unknown, nil) }

func (r *TxnRecorder) finish(id int, out Outcome, mops []Mop) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id < 0 || id >= len(r.txns) {
		panic(fmt.Sprintf("check: completion of unknown transaction T%d", id))
	}
	t := &r.txns[id]
	if t.Outcome != Pending {
		panic(fmt.Sprintf("check: T%d completed twice (%v then %v)", id, t.Outcome, out))
	}
	if mops != nil {
		if len(mops) != len(t.Mops) {
			panic(fmt.Sprintf("check: T%d completed with %d mops, invoked with %d", id, len(mops), len(t.Mops)))
		}
		t.Mops = cloneMops(mops)
	}
	delete(r.busy, t.Process)
	t.Outcome = out
	if out == Unknown {
		t.Return = Never
		return
	}
	t.Return = r.now()
}

// History returns a copy of the recording; transactions still in flight
// are reported as Unknown.
func (r *TxnRecorder) History() TxnHistory {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := TxnHistory{Txns: make([]Txn, len(r.txns))}
	for i, t := range r.txns {
		t.Mops = cloneMops(t.Mops)
		if t.Outcome == Pending {
			t.Outcome, t.Return = Unknown, Never
		}
		h.Txns[i] = t
	}
	return h
}

func cloneMops(ms []Mop) []Mop {
	out := make([]Mop, len(ms))
	for i, m := range ms {
		if m.List != nil {
			m.List = append([]int{}, m.List...)
		}
		out[i] = m
	}
	return out
}
