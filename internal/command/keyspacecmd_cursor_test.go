package command

import (
	"math"
	"testing"
)

// A SCAN cursor is read as Redis 7.0's parseScanCursorOrReply reads it
// (strtoul over the whole argument; checked with redis-server 7.0.15, whose
// SCAN -1 and SCAN "" answer, and SCAN " 5" and 2^64 refuse).
func TestParseCursorIsStrtoul(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"", 0, true}, {"5", 5, true}, {"+5", 5, true}, {"-0", 0, true},
		{"-1", math.MaxUint64, true}, {"-18446744073709551615", 1, true},
		{"18446744073709551615", math.MaxUint64, true},
		{"18446744073709551616", 0, false}, {"-18446744073709551616", 0, false},
		{"+", 0, false}, {"-", 0, false}, {"+-1", 0, false}, {" 5", 0, false}, {"5 ", 0, false},
		{"0x5", 0, false}, {"1_0", 0, false}, {"x", 0, false},
	} {
		got, err := ParseCursor([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseCursor(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
