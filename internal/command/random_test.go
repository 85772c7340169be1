package command

import (
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// HRANDFIELD with a negative count repeats fields: its reply grows with the
// count, not with the hash. Inside a script or a transaction every replica
// builds it at apply (and again at replay), so it is bounded: a count of
// -2^40 over a one-field hash answers an error rather than exhausting the
// group's memory on every replica.
func TestHRandFieldRepeatsAreBounded(t *testing.T) {
	defer func(m int) { MaxRandReply = m }(MaxRandReply)
	MaxRandReply = 1 << 16
	run := func(kv.Op) (kv.Result, error) {
		return kv.Result{Array: [][]byte{[]byte("f"), []byte("v")}}, nil
	}
	intN := func(int) int { return 0 }
	for _, c := range []struct {
		args   string
		tooBig bool
	}{
		{"HRANDFIELD h -3", false},
		{"HRANDFIELD h -3 WITHVALUES", false},
		{"HRANDFIELD h 1099511627776", false}, // distinct: at most the hash
		{"HRANDFIELD h -1048576", true},
		{"HRANDFIELD h -1099511627776 WITHVALUES", true},
	} {
		var args [][]byte
		for _, a := range strings.Fields(c.args) {
			args = append(args, []byte(a))
		}
		_, err := HRandField(args, run, intN)
		if got := err != nil && strings.Contains(err.Error(), "proto-max-bulk-len"); got != c.tooBig {
			t.Errorf("%s: error %v, want too big %v", c.args, err, c.tooBig)
		}
	}
}
