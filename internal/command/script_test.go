package command

import (
	"fmt"
	"testing"
)

// A script command's declared keys are the numkeys arguments after numkeys;
// none when numkeys is not a count in range.
func TestScriptKeys(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		want string
	}{
		{"EVAL s 0", "[]"},
		{"EVAL s 2 a b c", "[a b]"},
		{"EVALSHA x 1 a", "[a]"},
		{"EVAL s 3 a b", "[]"},
		{"EVAL s -1 a", "[]"},
		{"EVAL s x a", "[]"},
		{"EVAL s 99999999999999999999999 a", "[]"},
		{"EVAL s", "[]"},
	} {
		if got := fmt.Sprintf("%s", ScriptKeys(argv(c.cmd))); got != c.want {
			t.Errorf("ScriptKeys(%q) = %s, want %s", c.cmd, got, c.want)
		}
	}
}
