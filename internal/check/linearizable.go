package check

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/kefirdb/kefir/internal/level"
)

// LinOptions tunes Linearizable.
type LinOptions struct {
	// Timeout bounds porcupine's search per key (0 = 10 s). A key whose search
	// times out is reported in the verdict's note, not as a violation.
	Timeout time.Duration
	// VisualizationDir receives the porcupine HTML visualization of the
	// first failing key, lin-<key>.html. Empty means a fresh file under
	// os.TempDir()/kefir-check, so a failure always leaves one behind (the
	// verdict names it); NoVisualization turns that off.
	VisualizationDir string
	NoVisualization  bool
	// AllReads includes reads made at weaker consistency levels. By default only
	// reads asking for linearizable (or the default level, which is
	// linearizable) are judged: stale reads are what the weaker levels allow.
	AllReads bool
	// ShrinkLimit: keys with at most this many operations get their
	// counter-example shrunk to a 1-minimal one (0 = 200).
	ShrinkLimit int
	// ShrinkBudget bounds the time spent shrinking one key (0 = 5 s); when it
	// runs out the counter-example is as small as it got.
	ShrinkBudget time.Duration
	// Strict turns a search timeout into a failed verdict instead of a note:
	// "could not decide" is then never mistaken for "linearizable".
	Strict bool
}

// regState is the per-key model state. It is comparable, so porcupine's default
// equality works and states hash cheaply.
type regState struct {
	exists bool
	val    string
}

func linStep(state, input, _ interface{}) (bool, interface{}) {
	s := state.(regState)
	op := input.(*Op)
	known := op.Outcome == OK
	switch op.Kind {
	case Get:
		if !known {
			return true, s
		}
		if op.Found != s.exists || (op.Found && op.Result != s.val) {
			return false, s
		}
		return true, s
	case Put:
		return true, regState{true, op.Value}
	case Delete:
		return true, regState{}
	case CAS:
		match := s.exists && s.val == op.Expect
		if known && op.Found != match {
			return false, s
		}
		if match {
			return true, regState{true, op.Value}
		}
		return true, s
	case Incr:
		var cur int64
		if s.exists {
			n, err := strconv.ParseInt(s.val, 10, 64)
			if err != nil {
				// Incr of a non-integer fails without effect; a known success
				// here cannot be explained.
				return !known, s
			}
			cur = n
		}
		next := strconv.FormatInt(cur+op.Delta, 10)
		if known && op.Result != next {
			return false, s
		}
		return true, regState{true, next}
	}
	panic(fmt.Sprintf("check: unknown op kind %v", op.Kind))
}

// LinModel is the porcupine model of one key under get/put/delete/cas/incr.
// Inputs are *Op; outputs are unused (the result lives in the Op).
var LinModel = porcupine.Model{
	Init: func() interface{} { return regState{} },
	Step: linStep,
	DescribeOperation: func(input, _ interface{}) string {
		op := input.(*Op)
		s := op.String()
		if i := strings.Index(s, " ["); i >= 0 {
			s = s[:i]
		}
		return s
	},
	DescribeState: func(state interface{}) string {
		s := state.(regState)
		if !s.exists {
			return "nil"
		}
		return strconv.Quote(s.val)
	},
}

func linRelevant(op *Op, all bool) bool {
	switch op.Outcome {
	case Failed:
		return false
	case OK:
	default:
		// An unknown write may have taken effect at any time after its
		// invocation; an unknown read constrains nothing.
		return op.Kind.IsWrite()
	}
	if !op.Kind.IsWrite() && !all {
		return op.Cons.IsZero() || op.Cons.Kind == level.Linearizable
	}
	return true
}

func toPorcupine(ops []*Op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		ret := op.Return
		if op.Outcome != OK {
			ret = Never
		}
		out[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Invoke, Return: ret}
	}
	return out
}

// Linearizable checks per-key linearizability of h with porcupine. Keys are
// independent (P-compositionality), so each key is checked on its own and a
// failing key's operations are shrunk to a 1-minimal counter-example: removing
// any one of the reported operations makes the rest linearizable.
func Linearizable(h History, o LinOptions) Verdict {
	return linearizable(h, o, LinModel, "linearizable")
}

func linearizable(h History, o LinOptions, model porcupine.Model, name string) Verdict {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.ShrinkLimit == 0 {
		o.ShrinkLimit = 200
	}
	if o.ShrinkBudget == 0 {
		o.ShrinkBudget = 5 * time.Second
	}
	v := Verdict{Checker: name, OK: true}
	keys, byKey := h.byKey()
	var timedOut []string
	for _, key := range keys {
		var ops []*Op
		for _, i := range byKey[key] {
			if op := &h.Ops[i]; linRelevant(op, o.AllReads) {
				ops = append(ops, op)
			}
		}
		ops = dropUnobservedPuts(ops)
		v.Checked += len(ops)
		res, info := porcupine.CheckOperationsVerbose(model, toPorcupine(ops), o.Timeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			timedOut = append(timedOut, key)
			continue
		}
		culprit := ops
		if len(ops) <= o.ShrinkLimit {
			culprit = shrinkLin(model, ops, o.ShrinkBudget)
		}
		if !o.NoVisualization && v.Visualization == "" {
			path, err := vizPath(o.VisualizationDir, key)
			if err == nil {
				err = writeViz(model, path, info)
			}
			if err != nil {
				v.Note = fmt.Sprintf("writing visualization: %v", err)
			} else {
				v.Visualization = path
			}
		}
		v.add(Violation{Key: key, Reason: fmt.Sprintf("no linearization of these %d operations (of %d on the key)", len(culprit), len(ops)), Ops: derefSorted(culprit)})
	}
	if len(timedOut) > 0 {
		v.Note = strings.TrimPrefix(v.Note+fmt.Sprintf("; search timed out on keys %q", timedOut), "; ")
		if o.Strict {
			for _, key := range timedOut {
				v.add(Violation{Key: key, Reason: fmt.Sprintf("undecided: porcupine search exceeded %v (Strict)", o.Timeout)})
			}
		}
	}
	return v
}

// dropUnobservedPuts removes puts with unknown outcome whose value nothing
// observed: no read returned it, no CAS expected it, no failed CAS after it
// could be explained by it, and the key has no incrs. Such a put can always be
// linearized after everything else, so the rest is linearizable iff the whole
// is; dropping it spares porcupine an operation that may float anywhere
// (which is what makes searches explode when a crash leaves many writes
// unknown).
func dropUnobservedPuts(ops []*Op) []*Op {
	seen := map[string]bool{}
	lastFailedCAS := int64(-1 << 63)
	for _, op := range ops {
		switch {
		case op.Kind == Incr:
			return ops
		case op.Kind == Get && op.Outcome == OK && op.Found:
			seen[op.Result] = true
		case op.Kind == CAS:
			seen[op.Expect] = true
			if op.Outcome == OK && !op.Found {
				// "Not the expected value" may be this put's doing.
				lastFailedCAS = max(lastFailedCAS, op.Return)
			}
		}
	}
	out := ops[:0:0]
	for _, op := range ops {
		if op.Kind == Put && op.Outcome != OK && !seen[op.Value] && op.Invoke > lastFailedCAS {
			continue
		}
		out = append(out, op)
	}
	return out
}

func vizPath(dir, key string) (string, error) {
	if dir != "" {
		return filepath.Join(dir, "lin-"+sanitize(key)+".html"), nil
	}
	dir = filepath.Join(os.TempDir(), "kefir-check")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("visualization dir: %w", err)
	}
	f, err := os.CreateTemp(dir, "lin-"+sanitize(key)+"-*.html")
	if err != nil {
		return "", fmt.Errorf("visualization file: %w", err)
	}
	f.Close()
	return f.Name(), nil
}

func writeViz(model porcupine.Model, path string, info porcupine.LinearizationInfo) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("visualization dir: %w", err)
	}
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return fmt.Errorf("visualization %s: %w", path, err)
	}
	return nil
}

// shrinkLin cuts a non-linearizable history down to a smaller one that is
// still non-linearizable and whose failure implies the original's. Two moves
// keep that implication:
//
//  1. Cut at a clean point: keep the operations invoked before some time T
//     when every one of them with a known return returned before T. Any
//     linearization of the whole orders those before everything invoked
//     after T, so the prefix alone would linearize too. Illegality is
//     monotone over clean cuts, so the shortest illegal one is found by
//     binary search.
//  2. Drop operations that change nothing (reads, CASes that failed), one at
//     a time: a linearization of the whole restricted to the rest is still a
//     linearization.
//
// Writes are never dropped one by one: a dropped write can manufacture a
// violation (a failed CAS that only that write explained) the real history
// does not have.
func shrinkLin(model porcupine.Model, ops []*Op, budget time.Duration) []*Op {
	deadline := time.Now().Add(budget)
	illegal := func(h []*Op) (bool, bool) {
		left := time.Until(deadline)
		if left <= 0 {
			return false, false
		}
		r := porcupine.CheckOperationsTimeout(model, toPorcupine(h), left)
		return r == porcupine.Illegal, r != porcupine.Unknown
	}
	cur := append([]*Op(nil), ops...)
	sort.SliceStable(cur, func(i, j int) bool { return cur[i].Invoke < cur[j].Invoke })
	var cuts []int // prefix lengths that are clean cuts
	var maxRet int64 = -1 << 63
	for k := 1; k < len(cur); k++ {
		if cur[k-1].Outcome == OK {
			maxRet = max(maxRet, cur[k-1].Return)
		}
		if maxRet < cur[k].Invoke {
			cuts = append(cuts, k)
		}
	}
	lo, hi := 0, len(cuts) // the answer is cuts[i] for the least illegal i, or the whole
	for lo < hi {
		mid := (lo + hi) / 2
		bad, ok := illegal(cur[:cuts[mid]])
		if !ok {
			return cur
		}
		if bad {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo < len(cuts) {
		cur = cur[:cuts[lo]]
	}
	for i := 0; i < len(cur); {
		op := cur[i]
		if op.Kind.IsWrite() && !(op.Kind == CAS && op.Outcome == OK && !op.Found) {
			i++
			continue
		}
		try := append(append([]*Op(nil), cur[:i]...), cur[i+1:]...)
		bad, ok := illegal(try)
		if !ok {
			return cur
		}
		if bad {
			cur = try
			continue
		}
		i++
	}
	return cur
}

func derefSorted(ops []*Op) []Op {
	out := make([]Op, len(ops))
	for i, op := range ops {
		out[i] = *op
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Invoke < out[j].Invoke })
	return out
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
