package client_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/kefirdb/kefir/internal/server"
)

// The package documentation's example (`go doc ./client`) and ExampleDial dial
// the address a node listens on by default, so they work against `kefir up`
// or `kefir server` as pasted (issue 25 item 13: they dialed 7379, which no
// default uses).
func TestExampleDialsTheDefaultAddress(t *testing.T) {
	dial := regexp.MustCompile(`client\.Dial\(ctx, \[\]string\{"([^"]+)"\}`)
	for _, f := range []string{"doc.go", "example_test.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := dial.FindAllSubmatch(src, -1)
		if len(m) == 0 {
			t.Fatalf("%s: no client.Dial example found", f)
		}
		for _, a := range m {
			if string(a[1]) != server.DefaultClientAddr {
				t.Errorf("%s: the example dials %s; nodes listen on %s by default", f, a[1], server.DefaultClientAddr)
			}
		}
	}
}
