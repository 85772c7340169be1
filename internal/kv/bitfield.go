package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// BITFIELD (Redis's bitfieldCommand): GET, SET and INCRBY of signed (i1…
// i64) and unsigned (u1…u63) integers at bit offsets of a string, with
// OVERFLOW WRAP|SAT|FAIL for the SETs and INCRBYs after it. A BITFIELD with
// a SET or INCRBY is one op, KindBitField, evaluated here on every replica;
// one of GETs only (and BITFIELD_RO) is a function of the value, which the
// front door applies to a GET's read (BitFieldRead).

// KindBitField is BITFIELD with writes: Key, and Value the subcommands
// (EncodeBitField). Kind 177, of the block 177–183 given to fine-grained
// transactions.
const KindBitField Kind = 177

// BitFieldOp is one subcommand.
type BitFieldOp struct {
	Code     byte // 'G' GET, 'S' SET, 'I' INCRBY
	Signed   bool
	Bits     uint8
	Offset   uint64 // in bits (a '#' offset already multiplied)
	Value    int64  // SET's value, INCRBY's increment
	Overflow byte   // 'W' WRAP (the default), 'S' SAT, 'F' FAIL
}

// redisText is an error whose text is Redis's, capitals and all.
type redisText string

func (e redisText) Error() string { return string(e) }

// Errors of BITFIELD's arguments (Redis's texts, without "ERR ").
var (
	ErrBitFieldType     error = redisText("Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.")
	ErrBitFieldOverflow error = redisText("Invalid OVERFLOW type specified")
	ErrBitOffset              = errors.New("bit offset is not an integer or out of range")
	errBitFieldSyntax         = errors.New("syntax error")
	errBitFieldValue          = errors.New("value is not an integer or out of range")
	errBitFieldReadOnly       = errors.New("BITFIELD_RO only supports the GET subcommand")
)

// ParseBitField parses BITFIELD's arguments after the key; readOnly
// (BITFIELD_RO) allows GET only. Errors are the RESP error text's body.
func ParseBitField(args [][]byte, readOnly bool) ([]BitFieldOp, error) {
	var ops []BitFieldOp
	ow := byte('W')
	for i := 0; i < len(args); i++ {
		sub := strings.ToUpper(string(args[i]))
		need := map[string]int{"GET": 2, "SET": 3, "INCRBY": 3, "OVERFLOW": 1}[sub]
		if need == 0 || i+need > len(args)-1 {
			return nil, errBitFieldSyntax
		}
		if readOnly && sub != "GET" {
			return nil, errBitFieldReadOnly
		}
		if sub == "OVERFLOW" {
			switch strings.ToUpper(string(args[i+1])) {
			case "WRAP":
				ow = 'W'
			case "SAT":
				ow = 'S'
			case "FAIL":
				ow = 'F'
			default:
				return nil, ErrBitFieldOverflow
			}
			i++
			continue
		}
		op := BitFieldOp{Code: sub[0], Overflow: ow}
		t := string(args[i+1])
		// Redis's getBitfieldTypeFromArgument: a lower-case i or u, then
		// the width as string2ll reads it (no '+', no leading zero), as
		// the offset and the value below (ParseInt).
		if len(t) < 2 || (t[0] != 'i' && t[0] != 'u') {
			return nil, ErrBitFieldType
		}
		n, err := ParseInt([]byte(t[1:]))
		op.Signed = t[0] == 'i'
		if err != nil || n < 1 || (op.Signed && n > 64) || (!op.Signed && n > 63) {
			return nil, ErrBitFieldType
		}
		op.Bits = uint8(n)
		o := string(args[i+2])
		mul := uint64(1)
		if strings.HasPrefix(o, "#") {
			o, mul = o[1:], uint64(n)
		}
		off, err := ParseInt([]byte(o))
		if err != nil || off < 0 || uint64(off) > MaxBitOffset/mul || uint64(off)*mul > MaxBitOffset {
			return nil, ErrBitOffset
		}
		op.Offset = uint64(off) * mul
		if sub != "GET" {
			v, err := ParseInt(args[i+3])
			if err != nil {
				return nil, errBitFieldValue
			}
			op.Value = v
		}
		ops = append(ops, op)
		i += need
	}
	return ops, nil
}

// EncodeBitField is KindBitField's Value.
func EncodeBitField(ops []BitFieldOp) []byte {
	b := binary.AppendUvarint(nil, uint64(len(ops)))
	for _, o := range ops {
		s := byte(0)
		if o.Signed {
			s = 1
		}
		b = append(b, o.Code, s, o.Bits, o.Overflow)
		b = binary.AppendUvarint(b, o.Offset)
		b = binary.AppendVarint(b, o.Value)
	}
	return b
}

// DecodeBitField reads EncodeBitField's bytes, refusing what ParseBitField
// would not produce.
func DecodeBitField(v []byte) ([]BitFieldOp, error) {
	d := Decoder{B: v}
	n := d.Uvarint()
	if n > uint64(len(v)) {
		return nil, fmt.Errorf("%w: BITFIELD of %d subcommands in %d bytes", ErrInvalidOp, n, len(v))
	}
	ops := make([]BitFieldOp, 0, n)
	for i := uint64(0); i < n && d.Err == nil; i++ {
		o := BitFieldOp{Code: d.Byte(), Signed: d.Byte() == 1, Bits: d.Byte(), Overflow: d.Byte()}
		o.Offset, o.Value = d.Uvarint(), d.Varint()
		max := uint8(63)
		if o.Signed {
			max = 64
		}
		if d.Err == nil && (!strings.ContainsRune("GSI", rune(o.Code)) || !strings.ContainsRune("WSF", rune(o.Overflow)) ||
			o.Bits < 1 || o.Bits > max || o.Offset > MaxBitOffset) {
			return nil, fmt.Errorf("%w: BITFIELD subcommand %d", ErrInvalidOp, i)
		}
		ops = append(ops, o)
	}
	if d.Err != nil || len(d.B) != 0 {
		return nil, fmt.Errorf("%w: BITFIELD subcommands: corrupt", ErrInvalidOp)
	}
	return ops, nil
}

// BitFieldWrites reports whether ops hold a SET or INCRBY.
func BitFieldWrites(ops []BitFieldOp) bool {
	for _, o := range ops {
		if o.Code != 'G' {
			return true
		}
	}
	return false
}

func getBits(v []byte, off uint64, bits uint8) uint64 {
	var x uint64
	for j := uint64(0); j < uint64(bits); j++ {
		x = x<<1 | uint64(GetBit(v, int64(off+j)))
	}
	return x
}

func setBits(v []byte, off uint64, bits uint8, x uint64) {
	for j := uint64(0); j < uint64(bits); j++ {
		p := off + j
		mask := byte(1) << (7 - p&7)
		if x>>(uint64(bits)-1-j)&1 == 1 {
			v[p>>3] |= mask
		} else {
			v[p>>3] &^= mask
		}
	}
}

func signExtend(x uint64, bits uint8) int64 {
	if bits == 64 {
		return int64(x)
	}
	if x&(1<<(bits-1)) != 0 {
		x |= math.MaxUint64 << bits
	}
	return int64(x)
}

// bitFieldOverflow is Redis's check{Signed,Unsigned}BitfieldOverflow: does
// value+incr fit in bits, and if not what WRAP or SAT make of it.
func bitFieldOverflow(o *BitFieldOp, value, incr int64) (overflow bool, limit int64) {
	bits := uint64(o.Bits)
	if !o.Signed {
		uv := uint64(value)
		max := uint64(1)<<bits - 1
		maxincr := int64(max - uv)
		minincr := -int64(uv)
		wrap := func() int64 { return int64((uv + uint64(incr)) &^ (math.MaxUint64 << bits)) }
		if uv > max || (incr > 0 && incr > maxincr) {
			if o.Overflow == 'W' {
				return true, wrap()
			}
			return true, int64(max)
		} else if incr < 0 && incr < minincr {
			if o.Overflow == 'W' {
				return true, wrap()
			}
			return true, 0
		}
		return false, value + incr
	}
	max := int64(math.MaxInt64)
	if bits != 64 {
		max = int64(1)<<(bits-1) - 1
	}
	min := -max - 1
	maxincr, minincr := max-value, min-value
	wrap := func() int64 {
		c := uint64(value) + uint64(incr)
		if bits == 64 {
			return int64(c)
		}
		if c&(1<<(bits-1)) != 0 {
			c |= math.MaxUint64 << bits
		} else {
			c &^= math.MaxUint64 << bits
		}
		return int64(c)
	}
	if value > max || (bits != 64 && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr) {
		if o.Overflow == 'W' {
			return true, wrap()
		}
		return true, max
	} else if value < min || (bits != 64 && incr < minincr) || (value < 0 && incr < 0 && incr < minincr) {
		if o.Overflow == 'W' {
			return true, wrap()
		}
		return true, min
	}
	return false, value + incr
}

// RunBitField runs ops over v (grown as the writes need; v is modified in
// place when long enough) and returns the value and the reply, RESP2:
// an array of integers, nil for a write FAIL refused.
func RunBitField(v []byte, ops []BitFieldOp) ([]byte, []byte) {
	need := uint64(0)
	for _, o := range ops {
		if o.Code != 'G' {
			need = max(need, (o.Offset+uint64(o.Bits)+7)/8)
		}
	}
	if need > uint64(len(v)) {
		nv := make([]byte, need)
		copy(nv, v)
		v = nv
	}
	reply := fmt.Appendf(nil, "*%d\r\n", len(ops))
	for i := range ops {
		o := &ops[i]
		raw := getBits(v, o.Offset, o.Bits)
		old := int64(raw)
		if o.Signed {
			old = signExtend(raw, o.Bits)
		}
		if o.Code == 'G' {
			reply = fmt.Appendf(reply, ":%d\r\n", old)
			continue
		}
		var overflow bool
		var nv, ret int64
		if o.Code == 'I' {
			var lim int64
			overflow, lim = bitFieldOverflow(o, old, o.Value)
			nv, ret = lim, lim
		} else {
			var lim int64
			overflow, lim = bitFieldOverflow(o, o.Value, 0)
			nv, ret = lim, old
		}
		if overflow && o.Overflow == 'F' {
			reply = append(reply, "$-1\r\n"...)
			continue
		}
		reply = fmt.Appendf(reply, ":%d\r\n", ret)
		setBits(v, o.Offset, o.Bits, uint64(nv))
	}
	return v, reply
}

// applyBitField is Apply's case for KindBitField.
func applyBitField(get Getter, version uint64, op *Op, maxValue int, emit Emit) (Result, error) {
	if err := CheckKey(op.Key); err != nil {
		return Result{}, err
	}
	ops, err := DecodeBitField(op.Value)
	if err != nil {
		return Result{}, err
	}
	for _, o := range ops {
		if o.Code != 'G' && tooBig(int64(o.Offset/8), int64((o.Offset%8+uint64(o.Bits)+7)/8), maxValue) {
			return Result{}, ErrTooBig
		}
	}
	old, meta, _, _, err := getLive(get, op.Key, op.Now)
	if err == nil {
		err = notString(meta)
	}
	if err != nil {
		return Result{}, err
	}
	v, reply := RunBitField(append([]byte(nil), old...), ops)
	res := Result{Kind: ResReply, Bulk: reply}
	if BitFieldWrites(ops) {
		put(emit, op.Key, v, meta) // keeps the TTL, as Redis
		res.Version = version
	}
	return res, nil
}

// BitFieldRanges is the bits a BITFIELD's subcommands touch: (reads,
// writes).
func BitFieldRanges(ops []BitFieldOp) (reads, writes []TxRange) {
	for _, o := range ops {
		r := TxRange{Lo: o.Offset, Hi: o.Offset + uint64(o.Bits)}
		if o.Code == 'G' {
			reads = append(reads, r)
		} else {
			writes = append(writes, r)
		}
	}
	return reads, writes
}
