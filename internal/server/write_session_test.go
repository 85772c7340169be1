package server

import (
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// TestWriteSession: a write carries the writer's session for its replica to
// check (shard.WriteReq.Session; a chain's head refuses a session that saw a
// lost write, vrshard chainsession.go) only when the writer asked for
// session guarantees: KEFIR.CALL SESSION's token, or the connection's at
// the session level (set on the connection or on the call); a writer at
// another level carries none, so its write is never refused for a session.
func TestWriteSession(t *testing.T) {
	connTok := shard.Session{LastWrite: 7, WriteView: 2, WriteViewKnown: true}
	callTok := shard.Session{LastWrite: 9}
	for _, tc := range []struct {
		name     string
		connCons level.Consistency
		o        callOpts
		want     shard.Session
	}{
		{"KEFIR.CALL SESSION", level.ConsLinearizable, callOpts{session: true, sess: callTok}, callTok},
		{"connection at session", level.ConsSession, callOpts{}, connTok},
		{"call at session", level.ConsLinearizable, callOpts{cons: level.ConsSession}, connTok},
		{"connection at linearizable", level.ConsLinearizable, callOpts{}, shard.Session{}},
		{"call at eventual on a session connection", level.ConsSession, callOpts{cons: level.ConsEventual}, shard.Session{}},
	} {
		c := &conn{cons: tc.connCons, sess: connTok}
		if got := c.writeSession(tc.o); got.String() != tc.want.String() {
			t.Errorf("%s: the write carries session %q, want %q", tc.name, got, tc.want)
		}
	}
}
