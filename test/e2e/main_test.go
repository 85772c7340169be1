package e2e

import (
	"os"
	"testing"

	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// TestMain removes the kefir binary the tests built (cluster.Binary) once
// they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	cluster.RemoveBinary()
	os.Exit(code)
}
