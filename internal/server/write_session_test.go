package server

import (
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
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

// TestTransactionCarriesTheSession: a transaction (EXEC, KEFIR.EXEC), a
// script and a KEFIR.TXAPPLY advance the connection's session with their
// result (AfterWrite) like any write, so they must carry it for the
// replica's check too: one that carries none is never judged, and a session
// whose cad or async write a view change dropped (or a chain's head lost)
// writes past the loss by MULTI / SET / EXEC, its token rises over the lost
// version, and its next read of the lost key is served without it — what
// writeSessionCheck and chainSessionCheck refuse for a plain write.
func TestTransactionCarriesTheSession(t *testing.T) {
	connTok := shard.Session{LastWrite: 7, WriteView: 2, WriteViewKnown: true}
	c := &conn{cons: level.ConsSession, sess: connTok, srv: &Server{}}
	tx := kv.EncodeTx(nil, [][][]byte{{[]byte("SET"), []byte("k"), []byte("v")}}, nil)
	c.queueWrite(kefirExecSpec, [][]byte{[]byte("KEFIR.EXEC"), tx, []byte("k")}, callOpts{})
	if len(c.writes) != 1 {
		t.Fatalf("KEFIR.EXEC was not queued (%d writes)", len(c.writes))
	}
	if got := c.writes[0].Session; got.String() != connTok.String() {
		t.Fatalf("a transaction at the session level carries session %q, want the connection's %q", got, connTok)
	}
}

// TestInteractiveCommitCarriesTheSession: a KEFIR.TX commit is queued as a
// KEFIR.TXAPPLY (queueTxCommit) and advances the writer's session as any
// write does, so it carries the session for the replica's check; a
// coordinator's KEFIR.TXAPPLY from a peer carries none (its connection's
// session is not a writer's).
func TestInteractiveCommitCarriesTheSession(t *testing.T) {
	connTok := shard.Session{LastWrite: 7, WriteView: 2, WriteViewKnown: true}
	op, err := kv.NewTxCommit(5, kv.TxSerializable, kv.TxOrigin{}, nil, []kv.Op{{Kind: kv.KindSet, Key: []byte("k"), Value: []byte("v")}})
	if err != nil {
		t.Fatal(err)
	}
	enc := kv.AppendOp(nil, &op)
	c := &conn{cons: level.ConsSession, sess: connTok, srv: &Server{}}
	c.queueTxCommit(enc)
	if len(c.writes) != 1 {
		t.Fatalf("the commit was not queued (%d writes)", len(c.writes))
	}
	if got := c.writes[0].Session; got.String() != connTok.String() {
		t.Fatalf("an interactive commit at the session level carries session %q, want the connection's %q", got, connTok)
	}
	c.queueWrite(txApplySpec, [][]byte{[]byte("KEFIR.TXAPPLY"), enc}, callOpts{})
	if len(c.writes) != 2 || !c.writes[1].Session.IsZero() {
		t.Fatalf("a coordinator's KEFIR.TXAPPLY carries a session: %+v", c.writes)
	}
}
