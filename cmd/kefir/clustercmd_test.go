package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/cluster"
)

// Flags the planner or the mover would take silently wrong are refused as
// usage errors before anything is reached (the address is a closed port:
// a flag that passed would fail on connecting instead, after --timeout).
func TestClusterRebalanceRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--tolerance", "NaN"},
		{"--tolerance", "+Inf"},
		{"--tolerance", "-0.1"},
		{"--max-moves", "-1"},
		{"--max-moves", "65"},
		{"--by", "reads"},
		{"--by", "load", "--sample", "0s"},
		{"--page", "0"},
		{"--page", "300000000000000000"},
		{"--max-pause", "0s"},
		{"extra"},
	} {
		var stderr strings.Builder
		err := runClusterRebalance(append([]string{"--addr", "127.0.0.1:1", "--timeout", "1s"}, args...), io.Discard, &stderr)
		var u usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// A rebalance that finds the groups unbalanced and no move that helps did
// nothing: a distinct exit status, not 0 (a dry run only reports).
func TestClusterRebalanceStuckExitStatus(t *testing.T) {
	stuck := cluster.Plan{Balanced: false}
	if err := stuckStatus(stuck, false); err != exitStatus(exitStuck) {
		t.Fatalf("unbalanced, no move: %v, want exit status %d", err, exitStuck)
	}
	if err := stuckStatus(stuck, true); err != nil {
		t.Fatalf("dry run: %v, want nil", err)
	}
	if err := stuckStatus(cluster.Plan{Balanced: true}, false); err != nil {
		t.Fatalf("balanced: %v, want nil", err)
	}
}
