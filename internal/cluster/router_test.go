package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// Slot is Redis Cluster's: the values are the ones CLUSTER KEYSLOT answers,
// and a hash tag routes keys together.
func TestSlotIsRedisClusters(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want uint16
	}{
		{"123456789", 0x31C3 % Slots}, // CRC-16/XMODEM's check value
		{"foo", 12182},
		{"bar", 5061},
		{"", 0},
		{"{user1000}.following", 3443}, // = Slot("user1000")
		{"user1000", 3443},
		{"foo{}{bar}", 8363},    // an empty first tag: the whole key
		{"foo{{bar}}zap", 4015}, // the tag is "{bar"
		{"{bar", 4015},
		{"foo{bar}{zap}", 5061}, // the first tag only
	} {
		if got := Slot([]byte(tc.key)); got != tc.want {
			t.Errorf("Slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

// stateGroup is a Group whose state a test sets.
type stateGroup struct{ st State }

func (g *stateGroup) State() State                  { return g.st }
func (g *stateGroup) Stats() Stats                  { return Stats{} }
func (g *stateGroup) ViewEvents() []ViewEvent       { return nil }
func (g *stateGroup) NilextOn() bool                { return false }
func (g *stateGroup) NilextEligible(op *kv.Op) bool { return false }
func (g *stateGroup) NilextApply(context.Context, []shard.WriteReq) ([]int, error) {
	return nil, errors.New("off")
}
func (g *stateGroup) NilextTake(context.Context, shard.ReqID, kv.Op, level.Durability) (NilextAck, error) {
	return NilextAck{}, errors.New("off")
}
func (g *stateGroup) NilextTakeBatch(context.Context, []NilextDirect) ([]NilextAck, []error) {
	return nil, nil
}

// The router names the leader its replica follows, in a normal view only,
// and turns a not-leader error into -MOVED or "no leader".
func TestRouterLeaderAndRedirect(t *testing.T) {
	g := &stateGroup{}
	r := NewRouter(RouterConfig{Local: g, Members: []Member{
		{ID: 1, ClientAddr: "a:1"}, {ID: 2, ClientAddr: "b:2"}, {ID: 3},
	}})
	defer r.Close()
	for _, tc := range []struct {
		st   State
		want string
	}{
		{State{Normal: true, Leader: 2}, "b:2"},
		{State{Normal: false, Leader: 2}, ""}, // a view change: none yet
		{State{Normal: true, Leader: 0}, ""},
		{State{Normal: true, Leader: 3}, ""}, // no client address known
		{State{Normal: true, Leader: 9}, ""}, // not a member
	} {
		g.st = tc.st
		if got, ok := r.Leader(); got != tc.want || ok != (tc.want != "") {
			t.Errorf("state %+v: Leader() = %q, %v; want %q", tc.st, got, ok, tc.want)
		}
	}
	if _, ok := NewRouter(RouterConfig{}).Leader(); ok {
		t.Error("a single node's router named a leader")
	}

	moved := &NotLeaderError{Leader: 2, Addr: "b:2"}
	if got := r.Redirect(moved).Error(); got != "MOVED b:2" {
		t.Errorf("Redirect = %q", got)
	}
	if got := r.Redirect(&NotLeaderError{}).Error(); got != "UNAVAILABLE no leader" {
		t.Errorf("Redirect(no leader) = %q", got)
	}
	if addr, ok := r.LeaderFor(moved); !ok || addr != "b:2" {
		t.Errorf("LeaderFor = %q, %v", addr, ok)
	}
	if _, ok := r.LeaderFor(shard.ErrUnavailable); ok {
		t.Error("LeaderFor named a leader for an error that is no redirect")
	}
	if !errors.Is(moved, shard.ErrUnavailable) || !errors.Is(moved, ErrNotLeader) {
		t.Error("a NotLeaderError does not unwrap to ErrNotLeader and shard.ErrUnavailable")
	}
	if r.GroupOf([]byte("k")) != r.GroupOf([]byte("other")) {
		t.Error("one group: every key maps to it")
	}
}
