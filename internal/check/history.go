package check

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

// Kind is an operation kind. Reads and the nilext updates (put, delete) are the
// bread and butter; CAS and Incr are the non-nilext updates whose result depends
// on the state they find.
type Kind uint8

const (
	Get Kind = iota + 1
	Put
	Delete
	CAS  // compare-and-swap: Expect -> Value; result Found reports whether it swapped
	Incr // add Delta to an integer value (absent = 0); result Value is the new value

	// The hash kinds (hash.go, judged by LinearizableHashes, whose model
	// also reads Delete's Found: whether DEL deleted a key).
	HSet    // set Fields (field, value, ...); result Value: how many were new
	HDel    // delete the fields Fields; result Value: how many existed
	HGet    // read the field Fields[0]; result Found and Value
	HGetAll // read the whole hash; result Value: EncodeHash of it
	HLen    // result Value: the field count
	HExpire // EXPIRE far in the future; result Found: the key existed

	// The expiry kinds of string keys (expiry.go, judged by Expiry only:
	// SplitExpiring sends every key they touch there).
	Expire  // PEXPIREAT ExpireAt; result Found: it was set (the key was live)
	Persist // PERSIST; result Found: the key had an expiry and lost it
	TTL     // PEXPIRETIME, a read; result Found: the key is live, ExpireAt its expiry (0: none)
)

func (k Kind) String() string {
	switch k {
	case Get:
		return "get"
	case Put:
		return "put"
	case Delete:
		return "del"
	case CAS:
		return "cas"
	case Incr:
		return "incr"
	case HSet:
		return "hset"
	case HDel:
		return "hdel"
	case HGet:
		return "hget"
	case HGetAll:
		return "hgetall"
	case HLen:
		return "hlen"
	case HExpire:
		return "expire"
	case Expire:
		return "pexpireat"
	case Persist:
		return "persist"
	case TTL:
		return "pexpiretime"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// IsWrite reports whether the kind may change the key's value.
func (k Kind) IsWrite() bool {
	return k != Get && k != HGet && k != HGetAll && k != HLen && k != TTL
}

// Outcome is what the client learned about an operation.
type Outcome uint8

const (
	// Pending: invoked, not yet completed. History() reports pending operations
	// as Unknown, since a history is only read once the clients stopped.
	Pending Outcome = iota
	// OK: completed and acknowledged; the result fields are meaningful.
	OK
	// Failed: definitely not applied (e.g. rejected before reaching any replica).
	Failed
	// Unknown: may or may not have taken effect (timeout, connection lost,
	// crash). Its Return is math.MaxInt64: it may take effect at any later time.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Never is the Return time of an operation whose outcome is unknown.
const Never = int64(math.MaxInt64)

// Op is one client operation: the request, when it was invoked and returned, and
// what came back. Times are nanoseconds on the recorder's clock (virtual time in
// the simulator, the monotonic clock for real processes); only their order and
// differences matter.
type Op struct {
	ID      int    // index in History.Ops
	Client  int    // client id, >= 0; one client has at most one operation in flight
	Session string // session token; "" means the client's own session
	Kind    Kind
	Key     string
	Value   string // Put and CAS: the value written. Writers should make values unique per key.
	Expect  string // CAS: the value expected
	Delta   int64  // Incr: the amount added
	// Fields: HSet's field, value, field, value...; HDel's fields; HGet's field.
	Fields []string
	Cons   level.Consistency
	Dur    level.Durability
	// ExpireAt (Put, Expire): the absolute time the value expires at, on
	// the recorder's clock (0: never). Only the Expiry checker judges keys
	// written with one (SplitExpiring). TTL: the expiry the read returned
	// (a result, set on completion from Result.ExpireAt; 0: none).
	ExpireAt int64

	Invoke, Return int64
	Outcome        Outcome

	// Result, meaningful when Outcome == OK.
	Found   bool   // Get: the key existed; CAS: the swap happened
	Result  string // Get: the value read; Incr: the new value
	Version uint64 // server-assigned version of the value read or written (0 = none / initial)
	Node    int    // replica that served the operation, -1 if unknown
}

// expiryString shows an expiry (recorder ns) in ms after prefix ("" for none).
func expiryString(prefix string, at int64) string {
	if at == 0 {
		return ""
	}
	return fmt.Sprintf("%s%.3fms", prefix, float64(at)/float64(time.Millisecond))
}

// SessionID is the session the operation belongs to: its token, or its client.
func (o *Op) SessionID() string {
	if o.Session != "" {
		return o.Session
	}
	return "client-" + strconv.Itoa(o.Client)
}

// Precedes reports whether o returned before p was invoked (real-time order).
func (o *Op) Precedes(p *Op) bool { return o.Return < p.Invoke }

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d c%d ", o.ID, o.Client)
	if o.Session != "" {
		fmt.Fprintf(&b, "s=%s ", o.Session)
	}
	switch o.Kind {
	case Get:
		fmt.Fprintf(&b, "get(%s)", o.Key)
	case Put:
		fmt.Fprintf(&b, "put(%s,%s%s)", o.Key, o.Value, expiryString(", px@", o.ExpireAt))
	case Expire:
		fmt.Fprintf(&b, "pexpireat(%s%s)", o.Key, expiryString(", @", o.ExpireAt))
	case Delete:
		fmt.Fprintf(&b, "del(%s)", o.Key)
	case CAS:
		fmt.Fprintf(&b, "cas(%s,%s->%s)", o.Key, o.Expect, o.Value)
	case Incr:
		fmt.Fprintf(&b, "incr(%s,%d)", o.Key, o.Delta)
	case HSet, HDel, HGet, HGetAll, HLen, HExpire:
		fmt.Fprintf(&b, "%v(%s%s)", o.Kind, o.Key, strings.TrimSuffix(" "+strings.Join(o.Fields, " "), " "))
	default:
		fmt.Fprintf(&b, "%v(%s)", o.Kind, o.Key)
	}
	switch o.Outcome {
	case OK:
		switch o.Kind {
		case Get, HGet:
			if o.Found {
				fmt.Fprintf(&b, " -> %q", o.Result)
			} else {
				b.WriteString(" -> nil")
			}
		case CAS, HExpire, Expire, Persist:
			fmt.Fprintf(&b, " -> %t", o.Found)
		case TTL:
			switch {
			case !o.Found:
				b.WriteString(" -> -2 (absent)")
			case o.ExpireAt == 0:
				b.WriteString(" -> -1 (no expiry)")
			default:
				fmt.Fprintf(&b, " -> %s", expiryString("@", o.ExpireAt))
			}
		case Incr, HSet, HDel, HLen:
			fmt.Fprintf(&b, " -> %s", o.Result)
		case HGetAll:
			fmt.Fprintf(&b, " -> %q", o.Result)
		default:
			b.WriteString(" -> ok")
		}
		if o.Version != 0 {
			fmt.Fprintf(&b, " v%d", o.Version)
		}
	default:
		fmt.Fprintf(&b, " -> %s", o.Outcome)
	}
	ret := "inf"
	if o.Return != Never {
		ret = strconv.FormatInt(o.Return, 10)
	}
	fmt.Fprintf(&b, " [%d,%s]", o.Invoke, ret)
	if !o.Cons.IsZero() {
		fmt.Fprintf(&b, " %s", o.Cons)
	}
	if !o.Dur.IsZero() {
		fmt.Fprintf(&b, " %s", o.Dur)
	}
	if o.Node >= 0 {
		fmt.Fprintf(&b, " @n%d", o.Node)
	}
	return b.String()
}

// Crash records that a replica (or, with Node = AllNodes, every replica) crashed
// at time At: volatile state was lost.
type Crash struct {
	Node int
	At   int64
}

// AllNodes as a Crash.Node means the whole cluster crashed at once.
const AllNodes = -1

// History is a finished recording.
type History struct {
	Ops     []Op
	Crashes []Crash
}

// Outcomes counts h's operations that completed (OK) and those whose outcome
// is unknown: how much a test's history actually exercised.
func (h History) Outcomes() (ok, unknown int) {
	for _, op := range h.Ops {
		switch op.Outcome {
		case OK:
			ok++
		case Unknown:
			unknown++
		}
	}
	return ok, unknown
}

// Recorder collects a history. It is safe for concurrent use by real clients;
// in the simulator one goroutine drives it with virtual time.
type Recorder struct {
	mu      sync.Mutex
	now     func() int64
	ops     []Op
	crashes []Crash
	busy    map[int]int // client -> id of its operation in flight
}

// NewRecorder returns a recorder that timestamps events with now. A nil now uses
// the process's monotonic clock, which orders events across goroutines on one
// host exactly.
func NewRecorder(now func() int64) *Recorder {
	if now == nil {
		start := time.Now()
		now = func() int64 { return int64(time.Since(start)) }
	}
	return &Recorder{now: now, busy: make(map[int]int)}
}

// Invoke records the start of op (ID, Invoke, Outcome and result fields are
// overwritten) and returns its id. A client may have one operation in flight;
// a second Invoke before the first completes is a harness bug and panics.
func (r *Recorder) Invoke(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.busy[op.Client]; ok {
		panic(fmt.Sprintf("check: client %d invoked %v while #%d is in flight", op.Client, op.Kind, prev))
	}
	op.ID = len(r.ops)
	op.Invoke = r.now()
	op.Return = 0
	op.Outcome = Pending
	op.Found, op.Result, op.Version, op.Node = false, "", 0, -1
	r.ops = append(r.ops, op)
	r.busy[op.Client] = op.ID
	return op.ID
}

// Result is what a completed operation returned.
type Result struct {
	Found   bool
	Value   string
	Version uint64
	Node    int // -1 if unknown
	// ExpireAt: a TTL read's answer, the key's expiry on the recorder's
	// clock (0: none); Op.ExpireAt of the TTL op.
	ExpireAt int64
}

// Complete records an acknowledged operation.
func (r *Recorder) Complete(id int, res Result) {
	r.finish(id, OK, &res)
}

// Fail records an operation that definitely did not take effect.
func (r *Recorder) Fail(id int) { r.finish(id, Failed, nil) }

// Unknown records an operation whose effect is unknown (timeout, lost connection).
func (r *Recorder) Unknown(id int) { r.finish(id, Unknown, nil) }

func (r *Recorder) finish(id int, out Outcome, res *Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id < 0 || id >= len(r.ops) {
		panic(fmt.Sprintf("check: complete of unknown op #%d", id))
	}
	op := &r.ops[id]
	if op.Outcome != Pending {
		panic(fmt.Sprintf("check: op #%d completed twice (%v then %v)", id, op.Outcome, out))
	}
	delete(r.busy, op.Client)
	op.Outcome = out
	if out == Unknown {
		op.Return = Never
		return
	}
	op.Return = r.now()
	if res != nil {
		op.Found, op.Result, op.Version, op.Node = res.Found, res.Value, res.Version, res.Node
		if op.Kind == Incr {
			op.Found = true
		}
		if op.Kind == TTL {
			op.ExpireAt = res.ExpireAt
		}
	}
}

// Crash records that node crashed now (AllNodes for the whole cluster).
func (r *Recorder) Crash(node int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashes = append(r.crashes, Crash{Node: node, At: r.now()})
}

// History returns a copy of the recording. Operations still pending are
// reported as Unknown.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := History{Ops: append([]Op(nil), r.ops...), Crashes: append([]Crash(nil), r.crashes...)}
	for i := range h.Ops {
		if h.Ops[i].Outcome == Pending {
			h.Ops[i].Outcome = Unknown
			h.Ops[i].Return = Never
		}
	}
	return h
}

// byKey groups the operation indexes of h by key, keys sorted so that checkers
// report deterministically.
func (h *History) byKey() ([]string, map[string][]int) {
	m := make(map[string][]int)
	for i := range h.Ops {
		m[h.Ops[i].Key] = append(m[h.Ops[i].Key], i)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, m
}

// Verdict is a checker's judgement.
type Verdict struct {
	Checker    string
	OK         bool
	Checked    int         // operations the checker looked at
	Violations []Violation // the first few, each with a minimal counter-example
	// Note explains a partial check (e.g. a guarantee that needs server versions
	// the history does not carry).
	Note string
	// Visualization is the porcupine HTML file written for a linearizability failure.
	Visualization string
}

// Violation is one broken promise with the operations that show it.
type Violation struct {
	Key    string
	Reason string
	Ops    []Op
	// Txns: the transactions that show a transaction anomaly (CheckTxns),
	// in the order of the cycle when it is one.
	Txns []Txn
}

// MaxViolations bounds how many violations a verdict keeps.
const MaxViolations = 10

func (v *Verdict) add(viol Violation) {
	v.OK = false
	if len(v.Violations) < MaxViolations {
		v.Violations = append(v.Violations, viol)
	}
}

// Err returns nil for a passing verdict and a readable error otherwise.
func (v Verdict) Err() error {
	if v.OK {
		return nil
	}
	return fmt.Errorf("%s", v.String())
}

func (v Verdict) String() string {
	var b strings.Builder
	if v.OK {
		fmt.Fprintf(&b, "%s: ok (%d ops)", v.Checker, v.Checked)
	} else {
		fmt.Fprintf(&b, "%s: VIOLATED (%d ops checked)", v.Checker, v.Checked)
	}
	if v.Note != "" {
		fmt.Fprintf(&b, "; note: %s", v.Note)
	}
	for _, viol := range v.Violations {
		fmt.Fprintf(&b, "\n  key %q: %s", viol.Key, viol.Reason)
		for _, op := range viol.Ops {
			fmt.Fprintf(&b, "\n    %s", op)
		}
		for _, t := range viol.Txns {
			fmt.Fprintf(&b, "\n    %s", t)
		}
	}
	if v.Visualization != "" {
		fmt.Fprintf(&b, "\n  visualization: %s", v.Visualization)
	}
	return b.String()
}
