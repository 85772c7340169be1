package command

import (
	"math"
	"testing"
)

// An integer argument is read as Redis 7.0's string2ll reads it (checked
// with redis-server 7.0.15: INCRBY, SETBIT, SETRANGE and GETRANGE refuse
// +1, 01 and -0).
func TestParseIntIsString2ll(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"5", 5, true}, {"-5", -5, true}, {"10", 10, true},
		{"9223372036854775807", math.MaxInt64, true}, {"-9223372036854775808", math.MinInt64, true},
		{"9223372036854775808", 0, false}, {"", 0, false}, {"-", 0, false},
		{"+1", 0, false}, {"01", 0, false}, {"00", 0, false}, {"-0", 0, false}, {"-01", 0, false},
		{" 1", 0, false}, {"1 ", 0, false}, {"1.0", 0, false}, {"0x1", 0, false},
	} {
		got, err := ParseInt([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseInt(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
