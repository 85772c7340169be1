package e2e

import (
	"testing"

	"github.com/kefirdb/kefir/test/e2e/cluster"
)

// TestMain removes the kefir binary the tests built once they are done.
func TestMain(m *testing.M) { cluster.Main(m) }
