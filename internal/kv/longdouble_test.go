package kv

import (
	"strings"
	"testing"
)

// ParseLongDouble accepts what Redis 7.0's string2ld does (strtold over the
// whole string, checked against redis-server 7.0.15's INCRBYFLOAT): hex
// floats, inf and infinity in any case, nothing strtold calls out of range,
// a string of at most 5,119 bytes, and only what comes before a NUL byte.
func TestParseLongDoubleIsRedisString2ld(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" = refused
	}{
		{"10.5", "10.5"}, {".5", "0.5"}, {"5.", "5"}, {"+3", "3"}, {"-0.0", "0"},
		{"0x10", "16"}, {"0X1P-2", "0.25"}, {"0x.8", "0.5"}, {"-0x1.8p1", "-3"},
		{"1e-5000", ""}, {"-1e-5000", ""}, {"1e5000", ""}, {"1.19e4932", ""},
		{"0e-99999999999", "0"}, {"1e-99999999999", ""}, {"1e4932", "1000000000000000000006018949387963891323837774254533114773785041352533019486608722"},
		{"1p3", ""}, {"0x", ""}, {"0x1p", ""}, {"1e", ""}, {"1e+", ""}, {".", ""}, {"-", ""},
		{"0b1", ""}, {"0o7", ""}, {"0x_1", ""}, {"1_0", ""}, {"nan", ""}, {"nan(1)", ""},
		{" 1", ""}, {"1 ", ""}, {"infinit", ""},
		{"1\x00abc", "1"}, {"\x00", "0"}, {"-\x00", ""},
		{"1." + strings.Repeat("0", 5117), "1"}, {"1." + strings.Repeat("0", 5118), ""},
	} {
		f, ok := ParseLongDouble([]byte(tc.in))
		got := ""
		if ok {
			got = string(FormatLongDouble(f))
		}
		if len(got) > len(tc.want) && len(tc.want) > 80 {
			got = got[:len(tc.want)] // the leading digits of a long one
		}
		if got != tc.want {
			t.Errorf("ParseLongDouble(%.20q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, s := range []string{"inf", "INF", "-Infinity", "+iNfInItY"} {
		if f, ok := ParseLongDouble([]byte(s)); !ok || !f.IsInf() || f.Signbit() != (s[0] == '-') {
			t.Errorf("ParseLongDouble(%q) = %v, %v; want an infinity", s, f, ok)
		}
	}
}
