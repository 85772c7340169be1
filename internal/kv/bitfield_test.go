package kv

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// BITFIELD against redis-server 7.0.15: each line's reply and the key's
// value after it (hex; None: absent), as redis-py printed them.
func TestBitFieldMatchesRedis(t *testing.T) {
	script := `
BITFIELD k INCRBY i5 100 1 GET u4 0 => [1, 0] | 0000000000000000000000000080
BITFIELD c INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1 => [1, 1] | 00000000000000000000000005
BITFIELD c INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1 => [2, 2] | 0000000000000000000000000a
BITFIELD c INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1 => [3, 3] | 0000000000000000000000000f
BITFIELD c INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1 => [0, 3] | 00000000000000000000000003
BITFIELD c OVERFLOW FAIL INCRBY u2 102 1 => [None] | 00000000000000000000000003
BITFIELD s SET i8 0 -100 GET i8 0 INCRBY i8 0 -100 GET u8 0 => [0, -100, 56, 56] | 38
BITFIELD s OVERFLOW SAT INCRBY i8 0 -100 SET i8 #1 300 GET i8 #1 OVERFLOW FAIL SET i8 #2 300 GET i8 #2 => [-44, 0, 127, None, 0] | d47f00
BITFIELD s SET u8 #3 255 SET u63 7 123456789012345 GET u63 7 GET i64 0 INCRBY i64 0 9223372036854775807 => [0, 2287898704570482688, 123456789012345, -3170532208656500867, 6052839828198274940] | 540001c12218377ce4
BITFIELD s OVERFLOW WRAP INCRBY i64 0 9223372036854775807 OVERFLOW SAT INCRBY i64 64 -9223372036854775808 INCRBY i64 64 -1 GET i3 5 SET u1 1000 1 => [-3170532208656500869, -9223372036854775808, -9223372036854775808, -4, 0] | d40001c12218377b80` + strings.Repeat("00", 116) + `80
BITFIELD e GET i8 0 GET u7 #100 => [0, 0] | None
BITFIELD f OVERFLOW FAIL SET u2 0 7 => [None] | 00
BITFIELD g SET u3 0 -1 INCRBY i4 20 -9 OVERFLOW FAIL INCRBY i4 20 -9 => [0, 7, -2] | e0000e
BITFIELD g GET i65 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET u64 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET u8 -1 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g OVERFLOW BAD => ERR Invalid OVERFLOW type specified | e0000e
BITFIELD g GET u8 => ERR syntax error | e0000e
BITFIELD g FOO u8 0 => ERR syntax error | e0000e
BITFIELD g SET u8 0 x => ERR value is not an integer or out of range | e0000e
BITFIELD g GET u8 #4294967296 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g GET I8 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET U8 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET u+8 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET u08 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is. | e0000e
BITFIELD g GET u8 +8 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g GET u8 08 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g GET u8 -0 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g GET u8 #+1 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g GET u8 #08 => ERR bit offset is not an integer or out of range | e0000e
BITFIELD g SET u8 0 +5 => ERR value is not an integer or out of range | e0000e
BITFIELD g SET u8 0 05 => ERR value is not an integer or out of range | e0000e
BITFIELD g INCRBY u8 0 -01 => ERR value is not an integer or out of range | e0000e
BITFIELD g GET u8 #0 GET i8 8 => [224, 0] | e0000e
BITFIELD_RO g GET u8 0 => [224] | e0000e
BITFIELD_RO g SET u8 0 1 => ERR BITFIELD_RO only supports the GET subcommand | e0000e`
	s := newMV()
	for _, line := range strings.Split(strings.TrimSpace(script), "\n") {
		cmd, rest, _ := strings.Cut(line, " => ")
		want, wantVal, _ := strings.Cut(rest, " | ")
		f := strings.Fields(cmd)
		args := make([][]byte, len(f)-2)
		for i := range args {
			args[i] = []byte(f[i+2])
		}
		var got string
		ops, err := ParseBitField(args, f[0] == "BITFIELD_RO")
		switch {
		case err != nil:
			got = "ERR " + err.Error()
		case BitFieldWrites(ops):
			// Through the codec and Apply, as a replica runs it.
			op, derr := DecodeOp(AppendOp(nil, &Op{Kind: KindBitField, Key: []byte(f[1]), Value: EncodeBitField(ops)}))
			if derr != nil {
				t.Fatal(derr)
			}
			got = showReply(s.apply(t, op).Bulk)
		default:
			d, _, _, _, _ := s.at(s.last)([]byte(f[1]))
			_, reply := RunBitField(d, ops)
			got = showReply(reply)
		}
		val := "None"
		if d, _, _, ok, _ := s.at(s.last)([]byte(f[1])); ok {
			val = hex.EncodeToString(d)
		}
		if got != want || val != wantVal {
			t.Errorf("%s => %s | %s, want %s | %s", cmd, got, val, want, wantVal)
		}
	}
}

// showReply prints a RESP2 array of integers and nulls as redis-py does.
func showReply(b []byte) string {
	lines := strings.Split(strings.TrimSuffix(string(b), "\r\n"), "\r\n")
	var parts []string
	for _, l := range lines[1:] {
		if l == "$-1" {
			parts = append(parts, "None")
		} else {
			parts = append(parts, strings.TrimPrefix(l, ":"))
		}
	}
	return fmt.Sprintf("[%s]", strings.Join(parts, ", "))
}

// Two transactions' BITFIELD writes of different fields of one key both
// commit; of overlapping fields the second aborts.
func TestTxBitFieldRanges(t *testing.T) {
	for _, overlap := range []bool{false, true} {
		s := newMV()
		s.set(t, "k", "\x00\x00\x00\x00")
		t1, t2 := s.begin(TxSI), s.begin(TxSI)
		o2 := uint64(16)
		if overlap {
			o2 = 4
		}
		for i, x := range []*txn{t1, t2} {
			off := []uint64{0, o2}[i]
			ops := []BitFieldOp{{Code: 'I', Bits: 8, Offset: off, Value: 5, Overflow: 'W'}}
			x.write(t, Op{Kind: KindBitField, Key: []byte("k"), Value: EncodeBitField(ops)})
		}
		r1 := t1.commitRanged(t, map[string][]TxRange{"k": {{0, 8}}})
		r2 := t2.commitRanged(t, map[string][]TxRange{"k": {{o2, o2 + 8}}})
		if !committed(r1) || committed(r2) == overlap {
			t.Fatalf("overlap=%v: %q, %q", overlap, r1, r2)
		}
		if !overlap && s.get("k") != "\x05\x00\x05\x00" {
			t.Fatalf("value %x", s.get("k"))
		}
	}
}
