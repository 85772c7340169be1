package drivers

import (
	"context"

	"github.com/kefirdb/kefir/internal/ycsb"
)

// Null is a DB that does nothing and answers at once: driven by the harness it measures
// the harness alone (key choice, operation choice, timing, histograms), without a client
// library, a network or a server. Reads of keys never written are answered as found,
// so a run reports no misses.
type Null struct{}

// NewDB implements ycsb.NewDB.
func (Null) NewDB(int) (ycsb.DB, error) { return nullDB{}, nil }

type nullDB struct{}

var nullValue = make([]byte, 1)

func (nullDB) Read(context.Context, string) ([]byte, error)         { return nullValue, nil }
func (nullDB) Update(context.Context, string, []byte) error         { return nil }
func (nullDB) Insert(context.Context, string, []byte) error         { return nil }
func (nullDB) Scan(_ context.Context, _ string, n int) (int, error) { return n, nil }
func (nullDB) Close() error                                         { return nil }
