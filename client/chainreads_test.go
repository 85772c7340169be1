package client

import (
	"testing"

	"github.com/kefirdb/kefir/internal/level"
)

// TestChainReadsSpreadStrongLevels: which requests go to the next replica
// first. By default only the levels any VR replica may serve; with
// WithChainReads the strong ones too (a chain's every member serves them),
// whatever WithReplicaReads says of the weak ones; writes never.
func TestChainReadsSpreadStrongLevels(t *testing.T) {
	strong := []level.Consistency{{}, level.ConsLinearizable, {Kind: level.BoundedVersions, Versions: 3}}
	weak := []level.Consistency{{Kind: level.CrossClientMonotonic}, {Kind: level.Eventual}}
	for _, tc := range []struct {
		name                 string
		opts                 options
		wantStrong, wantWeak bool
	}{
		{"default", options{}, false, true},
		{"chain reads", options{chainReads: true}, true, true},
		{"chain reads, no replica reads", options{chainReads: true, leaderReadsOnly: true}, true, false},
		{"no replica reads", options{leaderReadsOnly: true}, false, false},
	} {
		c := &Client{opts: tc.opts}
		for _, cons := range strong {
			if got := c.spreads(&request{opts: callOptions{consistency: cons}}); got != tc.wantStrong {
				t.Errorf("%s: read at %v spread = %v, want %v", tc.name, cons, got, tc.wantStrong)
			}
		}
		for _, cons := range weak {
			if got := c.spreads(&request{opts: callOptions{consistency: cons}}); got != tc.wantWeak {
				t.Errorf("%s: read at %v spread = %v, want %v", tc.name, cons, got, tc.wantWeak)
			}
		}
		if c.spreads(&request{write: true, opts: callOptions{consistency: level.ConsLinearizable}}) {
			t.Errorf("%s: a write spread", tc.name)
		}
	}
}
