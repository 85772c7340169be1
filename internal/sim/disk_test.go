package sim

import (
	"bytes"
	"testing"
)

// Recovery must never panic on a damaged log and must return exactly the
// intact frames of the longest valid prefix.
func FuzzParseFrames(f *testing.F) {
	var good []byte
	for _, r := range []string{"a", "", "hello world"} {
		good = appendFrame(good, []byte(r))
	}
	f.Add(good)
	f.Add(good[:len(good)-3])
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, valid := parseFrames(data)
		if valid < 0 || valid > len(data) {
			t.Fatalf("valid = %d of %d", valid, len(data))
		}
		var re []byte
		for _, r := range recs {
			re = appendFrame(re, r)
		}
		if !bytes.Equal(re, data[:valid]) {
			t.Fatal("records do not re-encode to the valid prefix")
		}
	})
}
