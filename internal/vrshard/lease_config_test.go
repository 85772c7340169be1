package vrshard

import (
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vr"
)

// TestViewChangeTimeoutBelowLeaseRefused (issue 24 item 4): a view-change
// timeout below the default lease is refused with an error that says so;
// the lease used to be shortened silently to fit, so such a member promised
// less than a leader running the default counted on.
func TestViewChangeTimeoutBelowLeaseRefused(t *testing.T) {
	o := Options{Dir: t.TempDir(), VR: vr.Config{Cluster: 1, Members: []uint64{1, 2, 3}, Self: 1,
		ViewChangeTimeout: 200 * time.Millisecond}}
	err := o.fill()
	if err == nil || !strings.Contains(err.Error(), "view-change timeout 200ms is below the lease 250ms") {
		t.Fatalf("a 200ms view-change timeout under the 250ms lease: %v (lease %v)", err, o.VR.LeaseDuration)
	}
	ok := Options{Dir: t.TempDir(), VR: vr.Config{Cluster: 1, Members: []uint64{1, 2, 3}, Self: 1,
		ViewChangeTimeout: 400 * time.Millisecond}, Peers: map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}}
	if err := ok.fill(); err != nil || ok.VR.LeaseDuration != DefaultLease {
		t.Fatalf("a 400ms view-change timeout: %v, lease %v", err, ok.VR.LeaseDuration)
	}
	// Members that agree on the lease timing share the configuration hash;
	// one started with another lease does not.
	a, b := ok.VR, ok.VR
	b.Self = 2
	if a.Hash() != b.Hash() {
		t.Fatal("members with the same configuration disagree on its hash")
	}
	b.LeaseDuration = 200 * time.Millisecond
	if a.Hash() == b.Hash() {
		t.Fatal("a member with a shorter lease has the group's configuration hash")
	}
}
