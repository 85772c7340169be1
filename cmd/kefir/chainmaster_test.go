package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// TestLearnWithoutFlag (review36c): --learn-without takes member ids,
// comma-separated, including one outside --members (a member that joined
// since, which the restarted master waits for once a learnt configuration
// names it: before, refused, so such a member dead for good kept the master
// waiting), and refuses what cannot be a member with an error naming it.
func TestLearnWithoutFlag(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []uint64
		err  string
	}{
		{"", nil, ""},
		{" ", nil, ""},
		{"2", []uint64{2}, ""},
		{"2, 5", []uint64{2, 5}, ""},
		{"2,,5", nil, "an empty id"},
		{",", nil, "an empty id"},
		{"2,2", nil, "2 named twice"},
		{"0", nil, `"0" is not a node id`},
		{"x", nil, `"x" is not a node id`},
		{"-1", nil, `"-1" is not a node id`},
		{"9", nil, "this master's --id"},
	} {
		got, err := parseLearnWithout(c.in, 9)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("--learn-without %q: %v, want an error saying %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("--learn-without %q: %v, %v, want %v", c.in, got, err, c.want)
		}
	}
	// The command refuses it before it listens.
	err := runChainMaster([]string{"--id", "9", "--peer-addr", "127.0.0.1:0", "--members", "1@127.0.0.1:1/127.0.0.1:2", "--cluster-secret", "s",
		"--learn-without", "1,1"}, io.Discard)
	if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "named twice") {
		t.Fatalf("kefir chain-master --learn-without 1,1: %v, want a usage error", err)
	}
}
