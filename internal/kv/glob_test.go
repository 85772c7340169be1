package kv

import (
	"bytes"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// globKeys are the keys the Redis cases below were run against.
var globKeys = []string{"a", "b", "ab", "abc", "abcd", "aXc", "a*c", "a?c", "a[c", "a]c", "a\\c", "a-c", "^", "h", "hello", "hallo", "hxllo", "hllo", "heeeello", "hbllo", "hillo", "-", "]", "[", "x*", "a^c", "abcabc", "aaab", "aaaa", "b*x"}

// TestMatchAgreesWithRedis checks Match against what redis-server answered
// to KEYS pattern over globKeys: stringmatchlen's cases, its quirks
// (unterminated classes, "[]", reversed ranges, escapes in classes) included.
func TestMatchAgreesWithRedis(t *testing.T) {
	cases := []struct {
		pattern string
		want    []string
	}{
		// Generated against redis-server 7.0.15 (KEYS pattern over these keys).
		{"*", []string{"-", "[", "]", "^", "a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd", "b", "b*x", "h", "hallo", "hbllo", "heeeello", "hello", "hillo", "hllo", "hxllo", "x*"}},
		{"a", []string{"a"}},
		{"a*", []string{"a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd"}},
		{"*c", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "abc", "abcabc"}},
		{"a?c", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "abc"}},
		{"a??", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "abc"}},
		{"h?llo", []string{"hallo", "hbllo", "hello", "hillo", "hxllo"}},
		{"h*llo", []string{"hallo", "hbllo", "heeeello", "hello", "hillo", "hllo", "hxllo"}},
		{"h[ae]llo", []string{"hallo", "hello"}},
		{"h[^e]llo", []string{"hallo", "hbllo", "hillo", "hxllo"}},
		{"h[a-b]llo", []string{"hallo", "hbllo"}},
		{"h[b-a]llo", []string{"hallo", "hbllo"}},
		{"a\\*c", []string{"a*c"}},
		{"a\\?c", []string{"a?c"}},
		{"a[\\]]c", []string{"a]c"}},
		{"a[\\\\]c", []string{"a\\c"}},
		{"a[-]c", []string{"a-c"}},
		{"a[^]c", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "abc"}},
		{"[", []string(nil)},
		{"[a", []string{"a"}},
		{"a[", []string(nil)},
		{"]", []string{"]"}},
		{"a]c", []string{"a]c"}},
		{"\\", []string(nil)},
		{"a\\", []string(nil)},
		{"**", []string{"-", "[", "]", "^", "a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd", "b", "b*x", "h", "hallo", "hbllo", "heeeello", "hello", "hillo", "hllo", "hxllo", "x*"}},
		{"*a*", []string{"a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd", "hallo"}},
		{"*b*c", []string{"abc", "abcabc"}},
		{"a*b*c", []string{"abc", "abcabc"}},
		{"[]", []string(nil)},
		{"[]]", []string(nil)},
		{"[^]", []string{"-", "[", "]", "^", "a", "b", "h"}},
		{"[^a]", []string{"-", "[", "]", "^", "b", "h"}},
		{"a[b-]", []string{"ab"}},
		{"a[-c]c", []string{"a-c"}},
		{"a[a-c-]c", []string{"a-c", "abc"}},
		{"x\\*", []string{"x*"}},
		{"*\\*", []string{"x*"}},
		{"?", []string{"-", "[", "]", "^", "a", "b", "h"}},
		{"??", []string{"ab", "x*"}},
		{"???", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "abc", "b*x"}},
		{"[ab]*", []string{"a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd", "b", "b*x"}},
		{"*[^c]", []string{"-", "[", "]", "^", "a", "aaaa", "aaab", "ab", "abcd", "b", "b*x", "h", "hallo", "hbllo", "heeeello", "hello", "hillo", "hllo", "hxllo", "x*"}},
		{"a[^a-z]c", []string{"a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c"}},
		{"a[*]c", []string{"a*c"}},
		{"a[?]c", []string{"a?c"}},
		{"a\\[c", []string{"a[c"}},
		{"a[[]c", []string{"a[c"}},
		{"\\a\\b", []string{"ab"}},
		{"[\\^]", []string{"^"}},
		{"a[\\^]c", []string{"a^c"}},
		{"a*", []string{"a", "a*c", "a-c", "a?c", "aXc", "a[c", "a\\c", "a]c", "a^c", "aaaa", "aaab", "ab", "abc", "abcabc", "abcd"}},
		{"*b", []string{"aaab", "ab", "b"}},
		{"aa*b", []string{"aaab"}},
		{"*aab", []string{"aaab"}},
		{"a*a*b", []string{"aaab"}},
		{"a*a*a*a*b", []string(nil)},
	}
	for _, c := range cases {
		var got []string
		for _, k := range globKeys {
			if Match([]byte(c.pattern), []byte(k)) {
				got = append(got, k)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("pattern %q: matched %q, Redis matches %q", c.pattern, got, c.want)
		}
	}
}

// TestMatchLongPatternsStayFast is Redis's regression for nested stars
// (keyspace.tcl "Regression for pattern matching long nested loops"): a
// backtracking matcher without the skip takes exponential time.
func TestMatchLongPatternsStayFast(t *testing.T) {
	s := []byte(strings.Repeat("a", 50))
	start := time.Now()
	if Match([]byte(strings.Repeat("a*", 30)+"b"), s) {
		t.Fatal("matched a string without b")
	}
	if !Match([]byte(strings.Repeat("*", 50000)+"a"), s) {
		t.Fatal("50000 stars then a did not match a run of a's")
	}
	if Match([]byte(strings.Repeat("*?", 5000)), []byte("x")) {
		t.Fatal("5000 ?s matched one byte")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestLiteralPrefix(t *testing.T) {
	for p, want := range map[string]string{
		"user:*": "user:", "*": "", "abc": "abc", `a\*b*`: "a*b", "a?c": "a", "a[bc]": "a", `a\`: `a\`,
	} {
		if got := LiteralPrefix([]byte(p)); string(got) != want {
			t.Errorf("LiteralPrefix(%q) = %q, want %q", p, got, want)
		}
		// Every key the pattern matches starts with the prefix.
		for _, k := range globKeys {
			if Match([]byte(p), []byte(k)) && !bytes.HasPrefix([]byte(k), []byte(want)) {
				t.Errorf("%q matches %q, outside prefix %q", p, k, want)
			}
		}
	}
	if e := PrefixEnd([]byte("a\xff")); string(e) != "b" {
		t.Errorf("PrefixEnd(a\\xff) = %q", e)
	}
	if e := PrefixEnd([]byte("\xff\xff")); e != nil {
		t.Errorf("PrefixEnd(ff ff) = %q, want nil", e)
	}
}
