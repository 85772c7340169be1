package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// A node line over the limit must not stop the copy: the lines after it
// still arrive, and the reader reads to the end (a stopped reader leaves the
// node blocked on a full pipe).
func TestCopyLinesReadsPastAnOverlongLine(t *testing.T) {
	var errOut bytes.Buffer
	u := &upCluster{stderr: &errOut}
	in := "first\n" + strings.Repeat("x", 3*maxOutputLine) + "\nafter\nlast\n"
	r := strings.NewReader(in)
	u.copyLines(r, "n1")
	if rest, _ := io.ReadAll(r); len(rest) != 0 {
		t.Fatalf("%d bytes left unread", len(rest))
	}
	got := errOut.String()
	for _, want := range []string{"n1 | first\n", "n1 | last\n", "was cut"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
