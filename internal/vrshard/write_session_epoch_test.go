package vrshard

import (
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vr"
)

// TestWriteSessionCheckAcrossAReconfiguration: views start again at 0 in
// each epoch (vr switchConfig), so a token's view is not ordered against the
// leader's once a reconfiguration came between them. A session's cad write
// acknowledged at op 50 in view 2 of epoch 1 and dropped by the view change
// to view 3 (op 50 went to another write, committed), then a
// reconfiguration (epoch 2 starts at op 60, view 0): the session's next
// write at epoch 2's leader must still be refused. Skipped as "a later view
// than this leader's", it was accepted, its token rose past the loss
// (LastWrite 61 of view 0), and the session's next read of the lost key was
// served without it — what writeSessionCheck is for. Op 50 is committed
// here (and applied): its view there is final whatever the views' order.
func TestWriteSessionCheckAcrossAReconfiguration(t *testing.T) {
	r := &Replica{}
	r.isLeader.Store(true)
	r.status.Store(uint32(core.Normal))
	r.lastHS = vr.HardState{View: 0, LastNormalView: 0, Commit: 60}
	r.lastOp.Store(60)
	r.commit.Store(60)
	// Applied up to 55: ops 1-49 of view 2, 50-59 of view 3 (epoch 1),
	// op 60 the reconfiguration (view 3); the tail holds 56-60.
	r.views.Store(&viewHist{starts: []viewStart{{Op: 1, View: 2}, {Op: 50, View: 3}}, top: 55})
	for op := uint64(56); op <= 60; op++ {
		r.tail = append(r.tail, vr.Entry{View: 3, Op: op})
	}
	for _, tc := range []struct {
		name string
		sess shard.Session
		lost bool
	}{
		{"lost write, applied op", shard.Session{LastWrite: 50, WriteView: 2, WriteViewKnown: true}, true},
		{"lost write, op in the tail, committed", shard.Session{LastWrite: 57, WriteView: 2, WriteViewKnown: true}, true},
		{"a write that stayed", shard.Session{LastWrite: 57, WriteView: 3, WriteViewKnown: true}, false},
		{"lost read", shard.Session{MaxRead: 52, ReadView: 2, ReadViewKnown: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.writeSessionCheck(tc.sess)
			if tc.lost && !errors.Is(err, shard.ErrSessionLost) {
				t.Fatalf("epoch 2's leader (view 0) judged a session whose version was dropped in epoch 1's view change: %v; want ErrSessionLost", err)
			}
			if !tc.lost && err != nil {
				t.Fatalf("a session that lost nothing: %v", err)
			}
		})
	}
	// Not committed and of a later view than this leader's: a stale
	// leader's uncommitted entry at that op says nothing (the token's
	// write may be the one a later view kept).
	r.commit.Store(55)
	r.lastHS.View = 3
	if err := r.writeSessionCheck(shard.Session{LastWrite: 57, WriteView: 4, WriteViewKnown: true}); err != nil {
		t.Fatalf("a token of a later view at an uncommitted op: %v", err)
	}
}
