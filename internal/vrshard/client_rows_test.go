package vrshard

import (
	"testing"

	"github.com/kefirdb/kefir/internal/storage"
)

// engineRows counts the client-table rows in r's engine by scanning them.
func engineRows(t testing.TB, r *Replica) int {
	t.Helper()
	n := 0
	err := r.db.Scan(clientPrefix, clientEnd, 0, 0, func([]byte, storage.Value) bool { n++; return true })
	if err != nil {
		t.Fatal(err)
	}
	return n
}
