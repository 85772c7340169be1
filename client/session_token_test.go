package client

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/shard"
)

// The client's token parser reads what the server writes: every token the
// server's parser accepts it accepts with the same parts (and writes back the
// same token), and every one the server refuses it refuses.
func TestTokenParserAgreesWithTheServer(t *testing.T) {
	for _, tok := range []string{
		"", "v1.0.0", "v1.7.9", "v2.7.3.9.-", "v2.7.-.9.2", "v2.7.0.9.0", "v2.18446744073709551615.1.2.3",
		"v1.1", "v1.a.2", "v1.-1.2", "v2.1.2.3", "v2.1.x.3.4", "v2.1.-.3.-.5", "v3.1.2", "garbage", "v2..-.1.-",
		// v3: parts per group (a node of several groups).
		"v3.1:5.2.7.-,2:0.-.9.4", "v3.0:3.-.4.-,4294967295:1.1.1.1", "v3.0:4.-.5.-", "v3.3:0.-.0.-",
		"v3.", "v3.1:1.1.1", "v3.2:1.-.1.-,1:1.-.1.-", "v3.1:1.-.1.-,1:2.-.2.-", "v3.4294967296:1.-.1.-",
		"v3.1:1.-.1.-,", "v3.x:1.-.1.-", "v3.1:a.-.1.-",
	} {
		s, serr := shard.ParseSession(tok)
		c, cerr := parseToken(tok)
		if (serr == nil) != (cerr == nil) {
			t.Fatalf("%q: server parse %v, client parse %v", tok, serr, cerr)
		}
		if serr != nil {
			if !errors.Is(cerr, ErrBadSessionToken) {
				t.Fatalf("%q: client error %v does not wrap ErrBadSessionToken", tok, cerr)
			}
			continue
		}
		if c.write.version != s.LastWrite || c.read.version != s.MaxRead ||
			c.write.known != s.WriteViewKnown || c.read.known != s.ReadViewKnown ||
			c.write.view != s.WriteView || c.read.view != s.ReadView || len(c.groups) != len(s.Groups) {
			t.Fatalf("%q: server %+v, client %+v", tok, s, c)
		}
		for i, g := range s.Groups {
			cg := c.groups[i]
			if cg.group != g.Group || cg.write != (tokenPart{g.LastWrite, g.WriteView, g.WriteViewKnown}) ||
				cg.read != (tokenPart{g.MaxRead, g.ReadView, g.ReadViewKnown}) {
				t.Fatalf("%q: group part %d: server %+v, client %+v", tok, i, g, cg)
			}
		}
		if !s.IsZero() && c.String() != s.String() {
			t.Fatalf("%q written back: server %q, client %q", tok, s.String(), c.String())
		}
	}
}

// Merging keeps each part's view with its version, so a token never moves
// backwards and never pairs a version with another op's view.
func TestSessionTokenMergeKeepsViewsWithTheirVersions(t *testing.T) {
	s := &Session{}
	for _, tok := range []string{"v2.5.3.3.-", "v1.4.9", "v2.5.-.8.2", "v2.2.1.2.1"} {
		s.advance(tok)
	}
	if got, want := s.Token(), "v2.5.3.9.-"; got != want {
		t.Fatalf("merged token = %q, want %q", got, want)
	}
	if err := s.Resume("v2.5.3"); !errors.Is(err, ErrBadSessionToken) {
		t.Fatalf("Resume of a malformed token: %v, want ErrBadSessionToken", err)
	}
	if s.Token() != "v2.5.3.9.-" {
		t.Fatalf("a refused token replaced the session's: %q", s.Token())
	}
	if err := s.Resume("v1.1.1"); err != nil || s.Token() != "v1.1.1" {
		t.Fatalf("Resume(v1.1.1): %v, token %q", err, s.Token())
	}
}

// The client merges v3 tokens as the server does (shard.Session.Merge): each
// group's later part, so replies of concurrent calls to different groups'
// leaders, arriving in any order, lose neither group's position.
func TestSessionTokenMergePerGroup(t *testing.T) {
	toks := []string{"v3.1:5.2.0.-", "v3.2:4.-.0.-", "v3.1:3.1.9.2", "v1.7.1", "v3.2:4.1.6.1,3:1.-.1.-"}
	s := &Session{}
	for _, tok := range toks {
		s.advance(tok)
	}
	want := "v3.0:7.-.1.-,1:5.2.9.2,2:4.1.6.1,3:1.-.1.-"
	if got := s.Token(); got != want {
		t.Fatalf("merged token = %q, want %q", got, want)
	}
	// The server's merge of the same tokens writes the same token.
	var ss shard.Session
	for _, tok := range toks {
		p, err := shard.ParseSession(tok)
		if err != nil {
			t.Fatal(err)
		}
		ss = ss.Merge(p)
	}
	if ss.String() != want {
		t.Fatalf("server merge = %q, client %q", ss.String(), want)
	}
	if err := s.Resume("v3.2:1.-.1.-,1:1.-.1.-"); !errors.Is(err, ErrBadSessionToken) {
		t.Fatalf("Resume of groups out of order: %v", err)
	}
	if err := s.Resume("v3.1:1.-.1.-"); err != nil || s.Token() != "v3.1:1.-.1.-" {
		t.Fatalf("Resume(v3): %v, token %q", err, s.Token())
	}
}
