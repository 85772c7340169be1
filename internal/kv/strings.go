package kv

import (
	"bytes"
	"math/big"
	"math/bits"
	"strings"
)

// The string long tail (issue 27): the writes (SETRANGE, INCRBYFLOAT,
// MSETNX, SETBIT) are evaluated here like every other write; the reads
// (GETRANGE, GETBIT, BITCOUNT, BITPOS) are functions of one value, which the
// front door applies to what a GET of the key read (so a read of them is
// served, routed and checked exactly as a GET at every consistency level).

// MaxBitOffset bounds SETBIT/GETBIT offsets as Redis does (512 MiB of bits).
const MaxBitOffset = 512<<20*8 - 1

func applySetRange(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if err := CheckKey(op.Key); err != nil {
		return Result{}, err
	}
	if op.Delta < 0 {
		return Result{}, ErrInvalidOp
	}
	old, meta, ver, ok, err := getLive(get, op.Key, op.Now)
	if err == nil {
		err = notString(meta) // a missing key has none: a string
	}
	if err != nil {
		return Result{}, err
	}
	// As Redis: setting nothing writes nothing and answers the length.
	if len(op.Value) == 0 {
		return Result{Kind: ResInt, Int: int64(len(old)), Version: ver}, nil
	}
	if tooBig(op.Delta, int64(len(op.Value)), maxValue) {
		return Result{}, ErrTooBig
	}
	_ = ok // a missing key is an empty value
	n := max(int64(len(old)), op.Delta+int64(len(op.Value)))
	nv := make([]byte, n)
	copy(nv, old)
	copy(nv[op.Delta:], op.Value)
	put(emit, op.Key, nv, meta) // keeps the TTL, as Redis
	return Result{Kind: ResInt, Int: n, Version: version}, nil
}

// tooBig reports whether a value of off+n bytes exceeds the store's limit
// (maxValue; 0: none) or Redis's 512 MiB.
func tooBig(off, n int64, maxValue int) bool {
	total := off + n
	limit := int64(512 << 20)
	if maxValue > 0 {
		limit = min(limit, int64(maxValue))
	}
	return total > limit || total < off
}

// Long double (x87, 64-bit mantissa) is what Redis computes INCRBYFLOAT in
// on the usual platforms; big.Float at that precision, rounding to nearest
// even, computes the same sums, and Text('f', 17) prints them as glibc's
// "%.17Lf" does, so replies and stored values agree with Redis's bit for
// bit. It is also exact and platform-independent, so every replica that
// evaluates the op (the log carries the increment) stores the same bytes.
const longDoublePrec = 64

// longDoubleMaxExp: a result at or above 2^16384 is infinite in long double.
const longDoubleMaxExp = 16384

// ParseLongDouble parses s as Redis's string2ld does: glibc's strtold over
// the whole string (up to a NUL byte, as strtold stops there), which takes a
// decimal or a hexadecimal (0x, with an optional binary exponent p) number,
// inf or infinity in any case, with an optional sign; no leading space, no
// NaN, nothing after the number, and no number strtold reports as out of
// range (one that overflows long double, or a nonzero one that rounds to
// zero). At long double precision; ok false otherwise.
func ParseLongDouble(s []byte) (*big.Float, bool) {
	if len(s) == 0 || len(s) >= 5*1024 || isSpace(s[0]) {
		return nil, false
	}
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i] // Redis passes a C string to strtold
	}
	if len(s) == 0 {
		// strtold reads no number and ends where it began, at the NUL:
		// Redis takes that as 0.
		return new(big.Float).SetPrec(longDoublePrec), true
	}
	body := s
	neg := false
	if len(body) > 0 && (body[0] == '+' || body[0] == '-') {
		neg, body = body[0] == '-', body[1:]
	}
	if len(body) > 0 && (body[0] == 'i' || body[0] == 'I') {
		if !strings.EqualFold(string(body), "inf") && !strings.EqualFold(string(body), "infinity") {
			return nil, false
		}
		return new(big.Float).SetPrec(longDoublePrec).SetInf(neg), true
	}
	hex := len(body) >= 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'X')
	var nonzero, ok bool
	if hex {
		nonzero, ok = scanFloatLiteral(body[2:], true)
	} else {
		nonzero, ok = scanFloatLiteral(body, false)
	}
	switch {
	case !ok:
		return nil, false
	case !nonzero:
		f := new(big.Float).SetPrec(longDoublePrec)
		if neg {
			f.Neg(f)
		}
		return f, true
	}
	base := 10
	if hex {
		base = 0 // big.ParseFloat reads the 0x prefix and a p exponent
	}
	f, _, err := big.ParseFloat(string(s), base, longDoublePrec, big.ToNearestEven)
	if err != nil || !finite(f) { // exponent overflow either way: ERANGE
		return nil, false
	}
	var m big.Float
	e := f.MantExp(&m)
	if e < longDoubleMinExp || e == longDoubleMinExp && m.Abs(&m).Cmp(big.NewFloat(0.5)) == 0 {
		return nil, false // rounds to zero: ERANGE
	}
	return f, true
}

// longDoubleMinExp: a nonzero value at or below 2^(longDoubleMinExp-1) =
// 2^-16446, half the smallest subnormal long double, rounds to zero.
const longDoubleMinExp = -16445

// scanFloatLiteral reports whether s is a whole mantissa (digits with at most
// one point, at least one digit) and optional exponent (e or, in hex, p,
// an optional sign, digits), as strtold would read to its end, and whether
// the mantissa has a nonzero digit.
func scanFloatLiteral(s []byte, hex bool) (nonzero, ok bool) {
	digit := func(c byte) bool {
		return c >= '0' && c <= '9' || hex && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F')
	}
	i, digits, point := 0, 0, false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case digit(c):
			digits++
			nonzero = nonzero || c != '0'
			continue
		case c == '.' && !point:
			point = true
			continue
		}
		break
	}
	if digits == 0 {
		return false, false
	}
	if i == len(s) {
		return nonzero, true
	}
	if e := s[i]; (!hex && (e == 'e' || e == 'E')) || (hex && (e == 'p' || e == 'P')) {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		n := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			n++
		}
		return nonzero, n > 0 && i == len(s)
	}
	return false, false
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// FormatLongDouble prints f as Redis's ld2string(LD_STR_HUMAN): "%.17Lf"
// with trailing zeros (and a bare point) removed, "-0" as "0".
func FormatLongDouble(f *big.Float) []byte {
	s := f.Text('f', 17)
	if strings.IndexByte(s, '.') >= 0 {
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	if s == "-0" {
		s = "0"
	}
	return []byte(s)
}

func finite(f *big.Float) bool {
	return !f.IsInf() && f.MantExp(nil) <= longDoubleMaxExp
}

func applyIncrByFloat(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if err := CheckKey(op.Key); err != nil {
		return Result{}, err
	}
	if _, ok := ParseLongDouble(op.Value); !ok {
		return Result{}, ErrNotFloat
	}
	old, meta, _, exists, err := getLive(get, op.Key, op.Now)
	if err == nil {
		err = notString(meta) // a missing key has none: a string
	}
	if err != nil {
		return Result{}, err
	}
	nv, err := addLongDouble(old, exists, op.Value, ErrNotFloat)
	if err != nil {
		return Result{}, err
	}
	put(emit, op.Key, nv, meta)
	return Result{Kind: ResBulk, Bulk: nv, Version: version}, nil
}

// addLongDouble is INCRBYFLOAT's (and HINCRBYFLOAT's) arithmetic: old (0 if
// !exists) plus the decimal incr, formatted as Redis does. An old value that
// is no float is notFloat (each command has its text); an increment that is
// none is ErrNotFloat.
func addLongDouble(old []byte, exists bool, incr []byte, notFloat error) ([]byte, error) {
	inc, ok := ParseLongDouble(incr)
	if !ok {
		return nil, ErrNotFloat
	}
	cur := new(big.Float).SetPrec(longDoublePrec)
	if exists {
		if cur, ok = ParseLongDouble(old); !ok {
			return nil, notFloat
		}
	}
	if !finite(inc) || !finite(cur) {
		return nil, ErrNaN
	}
	sum := new(big.Float).SetPrec(longDoublePrec).SetMode(big.ToNearestEven).Add(cur, inc)
	if !finite(sum) {
		return nil, ErrNaN
	}
	return FormatLongDouble(sum), nil
}

func applyMSetNX(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	if len(op.Keys) == 0 || len(op.Keys)%2 != 0 {
		return Result{}, ErrInvalidOp
	}
	var seen uint64
	for i := 0; i < len(op.Keys); i += 2 {
		if err := CheckKey(op.Keys[i]); err != nil {
			return Result{}, err
		}
	}
	for i := 0; i < len(op.Keys); i += 2 {
		_, _, v, ok, err := getLive(get, op.Keys[i], op.Now)
		if err != nil {
			return Result{}, err
		}
		seen = max(seen, v)
		if ok {
			return Result{Kind: ResInt, Int: 0, Version: seen}, nil
		}
	}
	for i := 0; i < len(op.Keys); i += 2 {
		if !dupAfter(op.Keys, i) {
			put(emit, op.Keys[i], op.Keys[i+1], nil)
		}
	}
	return Result{Kind: ResInt, Int: 1, Version: version}, nil
}

func applySetBit(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if err := CheckKey(op.Key); err != nil {
		return Result{}, err
	}
	if op.Delta < 0 || op.Delta > MaxBitOffset || len(op.Value) != 1 || (op.Value[0] != '0' && op.Value[0] != '1') {
		return Result{}, ErrInvalidOp
	}
	byteIdx := op.Delta >> 3
	if tooBig(byteIdx, 1, maxValue) {
		return Result{}, ErrTooBig
	}
	old, meta, _, _, err := getLive(get, op.Key, op.Now)
	if err == nil {
		err = notString(meta) // a missing key has none: a string
	}
	if err != nil {
		return Result{}, err
	}
	nv := make([]byte, max(int64(len(old)), byteIdx+1))
	copy(nv, old)
	mask := byte(1) << (7 - uint(op.Delta&7))
	prev := int64(0)
	if nv[byteIdx]&mask != 0 {
		prev = 1
	}
	if op.Value[0] == '1' {
		nv[byteIdx] |= mask
	} else {
		nv[byteIdx] &^= mask
	}
	// Redis writes (and bumps the key) even when the bit already had the value.
	put(emit, op.Key, nv, meta)
	return Result{Kind: ResInt, Int: prev, Version: version}, nil
}

// GetRange is GETRANGE's answer for value v (Redis's getrangeCommand:
// negative indexes from the end, clamped, inclusive end).
func GetRange(v []byte, start, end int64) []byte {
	n := int64(len(v))
	if start < 0 && end < 0 && start > end {
		return []byte{}
	}
	if start < 0 {
		start += n
	}
	if end < 0 {
		end += n
	}
	start, end = max(start, 0), max(end, 0)
	if end >= n {
		end = n - 1
	}
	if start > end || n == 0 {
		return []byte{}
	}
	return v[start : end+1]
}

// GetBit is GETBIT's answer: bit off of v (0 past its end).
func GetBit(v []byte, off int64) int64 {
	i := off >> 3
	if i >= int64(len(v)) {
		return 0
	}
	return int64(v[i]>>(7-uint(off&7))) & 1
}

// bitRange turns BITCOUNT/BITPOS's start and end (bytes, or bits with
// isBit; negative from the end) into an inclusive range of bit indexes of a
// value of n bytes; empty if lo > hi.
func bitRange(n, start, end int64, isBit bool) (lo, hi int64) {
	total := n
	if isBit {
		total <<= 3
	}
	if start < 0 {
		start += total
	}
	if end < 0 {
		end += total
	}
	start, end = max(start, 0), max(end, 0)
	if end >= total {
		end = total - 1
	}
	if start > end {
		return 1, 0
	}
	if isBit {
		return start, end
	}
	return start << 3, end<<3 + 7
}

// BitCount is BITCOUNT's answer for v; ranged false: the whole value.
func BitCount(v []byte, ranged bool, start, end int64, isBit bool) int64 {
	if !ranged {
		start, end, isBit = 0, -1, false
	} else if start < 0 && end < 0 && start > end {
		return 0
	}
	lo, hi := bitRange(int64(len(v)), start, end, isBit)
	var c int64
	for i := lo; i <= hi; {
		if i&7 == 0 && i+7 <= hi {
			c += int64(bits.OnesCount8(v[i>>3]))
			i += 8
			continue
		}
		c += GetBit(v, i)
		i++
	}
	return c
}

// BitPos is BITPOS's answer for v (exists false: a missing key, all zeros):
// the first bit equal to bit in the range; -1 if none, except that looking
// for a 0 with no end given finds the first bit past the value (Redis
// treats the value as zero-padded on the right then).
func BitPos(v []byte, exists bool, bit int64, hasStart bool, start int64, hasEnd bool, end int64, isBit bool) int64 {
	if !exists {
		if bit == 1 {
			return -1
		}
		return 0
	}
	if !hasStart {
		start, end, isBit = 0, -1, false
	} else if !hasEnd {
		end = -1
	}
	lo, hi := bitRange(int64(len(v)), start, end, isBit)
	if lo > hi {
		return -1
	}
	want := byte(0)
	if bit == 1 {
		want = 0xff
	}
	for i := lo; i <= hi; {
		if i&7 == 0 && i+7 <= hi && v[i>>3] != ^want {
			// A byte with the bit somewhere: find it.
			for j := int64(0); j < 8; j++ {
				if GetBit(v, i+j) == bit {
					return i + j
				}
			}
		}
		if i&7 == 0 && i+7 <= hi {
			i += 8
			continue
		}
		if GetBit(v, i) == bit {
			return i
		}
		i++
	}
	if bit == 0 && !hasEnd {
		return hi + 1
	}
	return -1
}

// LCSMatch is one range LCS IDX reports: the matched bytes A[0]..A[1] of the
// first value and B[0]..B[1] of the second (inclusive).
type LCSMatch struct {
	A, B [2]int64
	Len  int64
}

// MaxLCSCells bounds LCS's table ((len(a)+1)·(len(b)+1) cells of 4 bytes),
// as Redis bounds its transient memory.
const MaxLCSCells = 512 << 20 / 4

// LCS is LCS's answer for values a and b (Redis 7.0's lcsCommand, step for
// step, so ties pick the same subsequence and IDX the same ranges): the
// longest common subsequence (when withString), its length, and with
// withIdx the matching ranges from the end, those shorter than minMatch
// left out. ok false: the table would exceed MaxLCSCells.
func LCS(a, b []byte, withString, withIdx bool, minMatch int64) (lcs []byte, n int64, matches []LCSMatch, ok bool) {
	alen, blen := len(a), len(b)
	if int64(alen+1)*int64(blen+1) > MaxLCSCells {
		return nil, 0, nil, false
	}
	w := blen + 1
	t := make([]uint32, (alen+1)*w)
	at := func(i, j int) uint32 { return t[i*w+j] }
	for i := 1; i <= alen; i++ {
		for j := 1; j <= blen; j++ {
			if a[i-1] == b[j-1] {
				t[i*w+j] = at(i-1, j-1) + 1
			} else {
				t[i*w+j] = max(at(i-1, j), at(i, j-1))
			}
		}
	}
	idx := int(at(alen, blen))
	n = int64(idx)
	if !withString && !withIdx {
		return nil, n, nil, true
	}
	lcs = make([]byte, idx)
	i, j := alen, blen
	aStart, aEnd, bStart, bEnd := alen, 0, 0, 0 // aStart == alen: no range open
	for i > 0 && j > 0 {
		emit := false
		if a[i-1] == b[j-1] {
			lcs[idx-1] = a[i-1]
			if aStart == alen {
				aStart, aEnd, bStart, bEnd = i-1, i-1, j-1, j-1
			} else if aStart == i && bStart == j {
				aStart--
				bStart--
			} else {
				emit = true
			}
			if aStart == 0 || bStart == 0 {
				emit = true
			}
			idx--
			i--
			j--
		} else {
			if at(i-1, j) > at(i, j-1) {
				i--
			} else {
				j--
			}
			if aStart != alen {
				emit = true
			}
		}
		if emit {
			l := int64(aEnd - aStart + 1)
			if withIdx && (minMatch == 0 || l >= minMatch) {
				matches = append(matches, LCSMatch{A: [2]int64{int64(aStart), int64(aEnd)}, B: [2]int64{int64(bStart), int64(bEnd)}, Len: l})
			}
			aStart = alen
		}
	}
	return lcs, n, matches, true
}
