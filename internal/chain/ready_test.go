package chain

import (
	"fmt"
	"reflect"
	"testing"
)

// TestReadyReuse: a head stepped with ReadyReuse sends what a twin stepped
// with Ready sends, round after round, and a batch it returned is intact
// until its next ReadyReuse however many messages the steps in between add
// (a member that collected them in the returned batch's storage at once
// would overwrite it under its caller).
func TestReadyReuse(t *testing.T) {
	const master NodeID = 9
	cfg := Config{ID: 1, Master: master, Members: []NodeID{1, 2}, Store: Memory}
	a, b := NewMember(cfg, newKV()), NewMember(cfg, newKV())
	step := func(m Msg) { a.Step(m); b.Step(m) }
	id := uint64(0)
	put := func(n int) {
		for range n {
			id++
			step(Msg{Type: MsgUpdate, From: master, To: 1, ID: id, Op: fmt.Appendf(nil, "k%d=v%d", id%3, id)})
		}
	}
	var got, want []Msg
	acked := uint64(0)
	for round := range 6 {
		put(round + 2)
		if acked > 0 {
			// The successor acknowledges the last round's updates: the
			// head answers them (update-acks to the master).
			step(Msg{Type: MsgAck, From: 2, To: 1, Seq: acked, LA: acked, Done: true})
		}
		if got != nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: the last batch changed before the next ReadyReuse:\n got %v\nwant %v", round, got, want)
		}
		want, got = a.Ready(), b.ReadyReuse()
		if len(want) == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: ReadyReuse returned\n%v\nReady\n%v", round, got, want)
		}
		for _, m := range want {
			if m.Type == MsgUpdate {
				acked = max(acked, m.Seq)
			}
		}
	}
	put(1)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the last batch changed before the next ReadyReuse:\n got %v\nwant %v", got, want)
	}
}

// TestReadyReuseKeepsNoPayloads: the storage ReadyReuse takes back for the
// next messages holds nothing of the batch it last returned (the caller is
// done with it): a batch's payloads (an op, a pre-copy chunk's entries) are
// not kept alive by an idle outbox until later messages overwrite them.
func TestReadyReuseKeepsNoPayloads(t *testing.T) {
	const master NodeID = 9
	m := NewMember(Config{ID: 1, Master: master, Members: []NodeID{1, 2}, Store: Memory}, newKV())
	for round := range 3 {
		for i := range 4 {
			m.Step(Msg{Type: MsgUpdate, From: master, To: 1, ID: uint64(round*4 + i + 1), Op: fmt.Appendf(nil, "k%d=v", i)})
		}
		if len(m.ReadyReuse()) == 0 {
			t.Fatalf("round %d: no messages", round)
		}
		for i, msg := range m.out[:cap(m.out)] {
			if !reflect.DeepEqual(msg, Msg{}) {
				t.Fatalf("round %d: the reused outbox's slot %d still holds %v", round, i, msg)
			}
		}
	}
}
