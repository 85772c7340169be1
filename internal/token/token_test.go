package token

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// v3 tokens round-trip: every part (the top-level one as group 0), views
// known or not, parts by increasing group; a session with no group part is
// still written as v1 or v2, byte for byte as before.
func TestSessionTokenV3RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		tok  string
		want Session
	}{
		{"v1.12.7", Session{LastWrite: 12, MaxRead: 7}},
		{"v2.7.3.9.-", Session{LastWrite: 7, WriteView: 3, WriteViewKnown: true, MaxRead: 9}},
		{"v3.1:5.2.7.-,2:0.-.9.4", Session{Groups: []GroupPos{
			{Group: 1, LastWrite: 5, WriteView: 2, WriteViewKnown: true, MaxRead: 7},
			{Group: 2, MaxRead: 9, ReadView: 4, ReadViewKnown: true},
		}}},
		{"v3.0:3.-.4.-,4294967295:1.1.1.1", Session{LastWrite: 3, MaxRead: 4, Groups: []GroupPos{
			{Group: 4294967295, LastWrite: 1, WriteView: 1, WriteViewKnown: true, MaxRead: 1, ReadView: 1, ReadViewKnown: true},
		}}},
	} {
		s, err := Parse(tc.tok)
		if err != nil {
			t.Fatalf("%q: %v", tc.tok, err)
		}
		if fmt.Sprint(s) != fmt.Sprint(tc.want) {
			t.Fatalf("%q parsed as %+v, want %+v", tc.tok, s, tc.want)
		}
		if got := s.String(); got != tc.tok {
			t.Fatalf("%q written back as %q", tc.tok, got)
		}
	}
	// A part of zeros is left out; group 0 alone is the one-log token.
	for tok, want := range map[string]string{"v3.0:4.-.5.-": "v1.4.5", "v3.3:0.-.0.-": "", "v3.0:4.2.5.-,6:0.-.0.-": "v2.4.2.5.-"} {
		s, err := Parse(tok)
		if err != nil || s.String() != want {
			t.Fatalf("%q: %v, written back as %q, want %q", tok, err, s.String(), want)
		}
	}
}

func TestSessionTokenV3Refusals(t *testing.T) {
	many := make([]string, MaxGroups+1)
	for i := range many {
		many[i] = fmt.Sprintf("%d:1.-.1.-", i+1)
	}
	for _, bad := range []string{
		"v3.", "v3.1", "v3.1:1.1.1", "v3.1:1.1.1.1.1", "v3.x:1.-.1.-", "v3.-1:1.-.1.-",
		"v3.4294967296:1.-.1.-",        // above 32 bits
		"v3.2:1.-.1.-,1:1.-.1.-",       // not increasing
		"v3.1:1.-.1.-,1:2.-.2.-",       // twice
		"v3.1:1.-.1.-,",                // an empty part
		"v3.1:a.-.1.-", "v3.1:1.x.1.-", // not decimal
		"v3." + strings.Join(many, ","),                     // too many groups
		"v3.1:1.-.1.-" + strings.Repeat("0", maxTokenV3Len), // too long
	} {
		if _, err := Parse(bad); !errors.Is(err, ErrBad) {
			t.Errorf("%.60q accepted (%v)", bad, err)
		}
	}
	// The bound names the limit rather than cutting the token short.
	_, err := Parse("v3." + strings.Join(many, ","))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", MaxGroups)) {
		t.Fatalf("too many groups: %v", err)
	}
	// Exactly MaxGroups parts of the longest numbers fit the length bound.
	long := make([]string, MaxGroups)
	for i := range long {
		long[i] = fmt.Sprintf("%d:18446744073709551615.18446744073709551615.18446744073709551615.18446744073709551615", 4294967295-MaxGroups+1+i)
	}
	if _, err := Parse("v3." + strings.Join(long, ",")); err != nil {
		t.Fatalf("%d longest parts: %v", MaxGroups, err)
	}
}

// A result that names a group advances that group's part only, and a
// group's replica is given only its part: a write in group 1 makes no read
// in group 2 wait for it, and a read in group 2 does not lower group 1's.
func TestSessionAdvancesPerGroup(t *testing.T) {
	var s Session
	s = s.AfterWrite(Pos{Group: 1, Version: 50, View: 3, ViewKnown: true})
	s = s.AfterRead(Pos{Group: 2, Version: 7, View: 1, ViewKnown: true})
	s = s.AfterWrite(Pos{Group: 2, Version: 9, View: 1, ViewKnown: true})
	s = s.AfterRead(Pos{Group: 1, Version: 20})
	s = s.AfterRead(Pos{Group: 1, Version: 10}) // lower: no change
	if got, want := s.String(), "v3.1:50.3.20.-,2:9.1.7.1"; got != want {
		t.Fatalf("token %q, want %q", got, want)
	}
	if p := s.For(1); p.Need() != 50 || p.WriteView != 3 || !p.WriteViewKnown || len(p.Groups) != 0 {
		t.Fatalf("group 1's part %+v", p)
	}
	if p := s.For(2); p.Need() != 9 || p.LastWrite != 9 || p.MaxRead != 7 {
		t.Fatalf("group 2's part %+v", p)
	}
	if p := s.For(3); !p.IsZero() {
		t.Fatalf("an untouched group's part %+v, want fresh", p)
	}
	if s.For(0).Need() != 0 {
		t.Fatalf("the top-level part advanced: %+v", s.For(0))
	}
	// A result of no group (a single node, a single group) is the top-level
	// part, as before.
	one := Session{}.AfterWrite(Pos{Version: 4}).AfterRead(Pos{Version: 6, View: 2, ViewKnown: true})
	if got := one.String(); got != "v2.4.-.6.2" {
		t.Fatalf("one-log token %q", got)
	}
}

// Copies of a session share its group parts: advancing one never changes
// another (a pipelined request keeps the token it was sent with).
func TestSessionCopiesAreIndependent(t *testing.T) {
	a := Session{}.AfterWrite(Pos{Group: 1, Version: 5}).AfterWrite(Pos{Group: 3, Version: 5})
	b := a
	b = b.AfterWrite(Pos{Group: 1, Version: 8})
	b = b.AfterWrite(Pos{Group: 2, Version: 8})
	if a.String() != "v3.1:5.-.0.-,3:5.-.0.-" {
		t.Fatalf("advancing a copy changed the original: %q", a.String())
	}
	if b.String() != "v3.1:8.-.0.-,2:8.-.0.-,3:5.-.0.-" {
		t.Fatalf("copy %q", b.String())
	}
}

// Merge takes each group's later part: a forwarded call's token (group 2
// advanced remotely) merged into the connection's (group 1 advanced locally
// meanwhile) loses neither.
func TestSessionMergePerGroup(t *testing.T) {
	sent := Session{}.AfterWrite(Pos{Group: 1, Version: 5})
	local := sent.AfterWrite(Pos{Group: 1, Version: 9, View: 2, ViewKnown: true})
	remote := sent.AfterWrite(Pos{Group: 2, Version: 4})
	got := local.Merge(remote)
	if want := "v3.1:9.2.0.-,2:4.-.0.-"; got.String() != want {
		t.Fatalf("merged %q, want %q", got.String(), want)
	}
	if got2 := remote.Merge(local); got2.String() != got.String() {
		t.Fatalf("merge is not symmetric: %q vs %q", got2.String(), got.String())
	}
	// One-log tokens merge as the client merges them.
	a, _ := Parse("v2.5.3.3.-")
	b, _ := Parse("v2.5.-.8.2")
	if m := a.Merge(b).String(); m != "v2.5.3.8.2" {
		t.Fatalf("one-log merge %q", m)
	}
}

// The cost of advancing a session per result: one log (a single node, a
// single group: no copy) and a part of one of 3 groups (a node of several
// groups: Groups is copied on change).
func BenchmarkSessionAfterWrite(b *testing.B) {
	for _, tc := range []struct {
		name  string
		group uint32
	}{{"one-log", 0}, {"group-of-3", 2}} {
		b.Run(tc.name, func(b *testing.B) {
			s := Session{}.AfterWrite(Pos{Group: 1, Version: 1}).AfterWrite(Pos{Group: 3, Version: 1})
			if tc.group == 0 {
				s = Session{}
			}
			b.ReportAllocs()
			for i := range b.N {
				s = s.AfterWrite(Pos{Group: tc.group, Version: uint64(i + 1), View: 1, ViewKnown: true})
			}
		})
	}
}
