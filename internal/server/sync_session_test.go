package server

import (
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/transport"
)

// A session read waits until the replica has applied the session's last
// write — any key's — and at the leader gives up after FollowerWait (50 ms)
// with "session token is ahead". Since docs/design/cad.md §12 a sync SET is
// answered at its ordered point and the connection runs on before its
// commit, so a session-level GET of another key pipelined behind it found
// the token (which carries the SET's op) ahead of the leader whenever the
// commit took longer than that, and failed; before §12 it could not (the SET
// was applied before the GET ran). Here every message from the leader to its
// followers is delayed 150 ms, so no commit comes sooner. The read must wait
// for the connection's sync writes first, as a read of their own keys does.
func TestSessionReadBehindAnUncommittedSyncWrite(t *testing.T) {
	if got := sessionReadBehindSyncWrite(t); got != "(nil)" {
		t.Fatalf("session GET y behind SET x (sync, commit delayed): %s; want (nil)", got)
	}
}

// With syncBarrierSkipped the read runs at once and fails.
func TestSyncBarrierSkippedFailsASessionRead(t *testing.T) {
	syncBarrierSkipped.Store(true)
	defer syncBarrierSkipped.Store(false)
	got := sessionReadBehindSyncWrite(t)
	if got == "(nil)" {
		t.Fatal("syncBarrierSkipped: the session read still succeeded")
	}
	t.Logf("mutation caught: %s", got)
}

func sessionReadBehindSyncWrite(t *testing.T) string {
	g := startGroupWith(t, func(c *Config) { c.Durability = level.Sync })
	l := g.leader(t)
	c := dial(t, g.nodes[l])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET w 1 => OK`)
	for _, m := range g.cfgs[l].Members {
		if m.ID != g.cfgs[l].ReplicaID {
			if err := g.nodes[l].vr.Transport().SetLinkFault(m.ID, transport.Fault{Delay: 150 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One write: the server must see both commands in one batch.
	var buf []byte
	buf = resp.AppendCommand(buf, []byte("SET"), []byte("x"), []byte("v"))
	buf = resp.AppendCommand(buf, []byte("GET"), []byte("y"))
	if _, err := c.nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	if got := c.reply(); got != "OK" {
		t.Fatalf("SET x: %s", got)
	}
	return c.reply()
}
