package client

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/shard"
)

// The client reads tokens with the server's own parser (internal/token), so
// it accepts exactly what the server does; what it adds is its error: a token
// it refuses (Resume) wraps ErrBadSessionToken, names the token and says
// why, once.
func TestTokenParserRefusesAsTheServerDoes(t *testing.T) {
	for _, tok := range []string{
		"", "v1.0.0", "v1.7.9", "v2.7.3.9.-", "v2.7.-.9.2", "v2.7.0.9.0", "v2.18446744073709551615.1.2.3",
		"v1.1", "v1.a.2", "v1.-1.2", "v2.1.2.3", "v2.1.x.3.4", "v2.1.-.3.-.5", "v3.1.2", "garbage", "v2..-.1.-",
		// v3: parts per group (a node of several groups).
		"v3.1:5.2.7.-,2:0.-.9.4", "v3.0:3.-.4.-,4294967295:1.1.1.1", "v3.0:4.-.5.-", "v3.3:0.-.0.-",
		"v3.", "v3.1:1.1.1", "v3.2:1.-.1.-,1:1.-.1.-", "v3.1:1.-.1.-,1:2.-.2.-", "v3.4294967296:1.-.1.-",
		"v3.1:1.-.1.-,", "v3.x:1.-.1.-", "v3.1:a.-.1.-",
	} {
		_, serr := shard.ParseSession(tok)
		cerr := (&Session{}).Resume(tok)
		if (serr == nil) != (cerr == nil) {
			t.Fatalf("%q: server parse %v, client %v", tok, serr, cerr)
		}
		if serr == nil {
			continue
		}
		if !errors.Is(cerr, ErrBadSessionToken) {
			t.Fatalf("%q: client error %v does not wrap ErrBadSessionToken", tok, cerr)
		}
		msg := cerr.Error()
		if !strings.Contains(msg, strconv.Quote(tok)) || strings.Count(msg, "session token") != 1 {
			t.Fatalf("%q: client error %q: want the token quoted and the reason once", tok, msg)
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
