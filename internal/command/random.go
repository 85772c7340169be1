package command

import (
	"math"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// IntN picks a number in [0, n), n > 0: the front door's math/rand, or
// inside a script or a transaction the op's random source (kv.OpRand), so
// that every replica and every replay of the op picks the same.
type IntN func(n int) int

// RandomKey is RANDOMKEY: one of the (up to) RandomWindow keys at or after
// a random point of the key space, wrapping to the first keys, picked
// uniformly. The engine orders keys and has no rank, so a point alone
// picks the key after the widest gaps: keys that share a prefix ("k1" ..
// "k30") sit in one narrow gap of the printable range, and every point
// outside it landed on the first one. The window spreads the pick over
// the keys there: a key space of up to RandomWindow keys is sampled
// uniformly; a larger one still favours keys after wide gaps (Redis's is
// not exactly uniform either). run's ordered scan (KindScan) is the front
// door's read path or an op's merged scan of its overlay.
func RandomKey(run Run, intN IntN) (Reply, error) {
	// Printable bytes: keys mostly are, and a point above them all would
	// wrap to the first keys every time.
	var from [8]byte
	for i := range from {
		from[i] = byte(' ' + intN('~'-' '+1))
	}
	var keys [][]byte
	res, err := run(kv.Op{Kind: kv.KindScan, Key: from[:], Limit: RandomWindow})
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(res.Array); i += 2 {
		keys = append(keys, res.Array[i])
	}
	if len(keys) < RandomWindow {
		// Wrapped: the first keys, before the point, fill the window.
		end := from[:]
		if len(keys) == 0 {
			end = nil
		}
		res, err := run(kv.Op{Kind: kv.KindScan, End: end, Limit: RandomWindow - len(keys)})
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(res.Array); i += 2 {
			keys = append(keys, res.Array[i])
		}
	}
	if len(keys) == 0 {
		return func(w *resp.Writer) { _ = w.WriteNull() }, nil
	}
	k := keys[intN(len(keys))]
	return func(w *resp.Writer) { _ = w.WriteBulk(k) }, nil
}

// RandomWindow is how many keys RANDOMKEY picks among.
const RandomWindow = 64

// MaxRandReply bounds the bytes of HRANDFIELD's reply with a negative
// count (repeats), Redis's proto-max-bulk-len; a variable for tests.
var MaxRandReply = 512 << 20

// randReplyOverhead is a pick's cost besides its bytes: its RESP header
// and its index in the picks.
const randReplyOverhead = 16

// HRandField is HRANDFIELD key [count [WITHVALUES]], with Redis's rules: no
// count, one field (nil for a missing key); a positive count, that many
// distinct fields at most; a negative one, that many with repeats. With
// WITHVALUES a RESP3 writer gets an array of [field, value] pairs, a RESP2
// one a flat array (as Redis 7).
func HRandField(args [][]byte, run Run, intN IntN) (Reply, error) {
	var count int64
	withCount, withValues := len(args) >= 3, false
	if withCount {
		n, err := ParseInt(args[2])
		if err != nil {
			return nil, err
		}
		count = n
		if count == math.MinInt64 { // Redis reads it in [-LONG_MAX, LONG_MAX]
			return nil, ReplyError("ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807")
		}
		switch {
		case len(args) == 4 && Eq(args[3], "WITHVALUES"):
			withValues = true
		case len(args) > 3:
			return nil, ErrSyntax
		}
		// Redis's bound with WITHVALUES (twice the count's replies), and
		// Kefir's on a count of repeats (a positive count picks at most
		// the hash's fields, so it needs none).
		if withValues && (count < -math.MaxInt64/2 || count > math.MaxInt64/2) || count < -(1<<40) {
			return nil, ReplyError("ERR value is out of range")
		}
	}
	res, err := run(kv.Op{Kind: kv.KindHGetAll, Key: args[1]})
	if err != nil {
		return nil, err
	}
	a := res.Array
	n := len(a) / 2
	if !withCount {
		if n == 0 {
			return func(w *resp.Writer) { _ = w.WriteNull() }, nil
		}
		f := a[2*intN(n)]
		return func(w *resp.Writer) { _ = w.WriteBulk(f) }, nil
	}
	var picks []int
	switch {
	case n == 0 || count == 0:
	case count > 0:
		// The first count of a random permutation (a partial Fisher-Yates).
		picks = make([]int, n)
		for i := range picks {
			picks[i] = i
		}
		k := min(int(count), n)
		for i := range k {
			j := i + intN(n-i)
			picks[i], picks[j] = picks[j], picks[i]
		}
		picks = picks[:k]
	default:
		// Repeats: the reply grows with the count, not with the hash, so
		// it is bounded (as Redis bounds LCS's transient memory): inside
		// a script or a transaction it is built on every replica at apply,
		// and a count of -2^40 over a one-field hash would exhaust them all,
		// and again at every replay of the op.
		size := 0
		for range -count {
			p := intN(n)
			size += randReplyOverhead + len(a[2*p])
			if withValues {
				size += randReplyOverhead + len(a[2*p+1])
			}
			if size > MaxRandReply {
				return nil, ReplyError("ERR HRANDFIELD's reply would exceed proto-max-bulk-len: ask for fewer fields")
			}
			picks = append(picks, p)
		}
	}
	return func(w *resp.Writer) {
		if withValues && w.Protocol() == 3 {
			_ = w.WriteArrayHeader(len(picks))
			for _, p := range picks {
				_ = w.WriteArrayHeader(2)
				_ = w.WriteBulk(a[2*p])
				_ = w.WriteBulk(a[2*p+1])
			}
			return
		}
		if withValues {
			_ = w.WriteArrayHeader(2 * len(picks))
		} else {
			_ = w.WriteArrayHeader(len(picks))
		}
		for _, p := range picks {
			_ = w.WriteBulk(a[2*p])
			if withValues {
				_ = w.WriteBulk(a[2*p+1])
			}
		}
	}, nil
}
