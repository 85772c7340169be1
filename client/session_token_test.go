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
			c.write.view != s.WriteView || c.read.view != s.ReadView {
			t.Fatalf("%q: server %+v, client %+v", tok, s, c)
		}
		if s != (shard.Session{}) && c.String() != s.String() {
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
