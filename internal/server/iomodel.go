package server

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/kefirdb/kefir/internal/storage"
)

// IOModel says how plain-TCP client connections are served.
//
// IOEpoll serves them from a few epoll event loops (Linux only): one epoll_wait
// reports every ready socket, each is read once, all of its complete commands run,
// and its replies leave in one write — the shape of Redis's event loop. Compared
// with a goroutine per connection it saves, per pipelined batch, the read that
// returns EAGAIN and the netpoller's park and wake-up, which were 40–47 % of the
// server's CPU under redis-benchmark. Work that blocks (waiting for an fsync, the
// VR driver, forwarding) is handed to one of the loop's long-lived workers, so the
// loop never waits on it.
//
// IOGoroutine is Go's model: one goroutine per connection. TLS connections and
// non-Linux systems always use it.
type IOModel string

const (
	IOEpoll     IOModel = "epoll"
	IOGoroutine IOModel = "goroutine"
)

// ParseIOModel parses an --io-model value.
func ParseIOModel(s string) (IOModel, error) {
	switch m := IOModel(s); m {
	case IOEpoll, IOGoroutine:
		return m, nil
	case "":
		return DefaultIOModel(), nil
	}
	return "", fmt.Errorf("server: unknown I/O model %q (want epoll or goroutine)", s)
}

// DefaultIOModel is the model used unless Config.IOModel (kefir server:
// --io-model, KEFIR_IO_MODEL) says otherwise: the event loop where it exists.
func DefaultIOModel() IOModel {
	if epollSupported {
		return IOEpoll
	}
	return IOGoroutine
}

// ioModel is the process's I/O model for client connections. It is process-wide,
// like the event loops (and Go's own netpoller). Config.IOModel sets it in New:
// kefir server resolves --io-model, KEFIR_IO_MODEL and the config file into
// it; this package reads no environment (TestServerReadsNoEnvironment), so an
// in-process server built without a Config value (tests, embedders) gets
// DefaultIOModel, or what SetIOModel or an earlier server set.
var ioModel atomicIOModel

func init() { ioModel.Store(DefaultIOModel()) }

// atomicIOModel is an IOModel tests may change while earlier servers still accept.
type atomicIOModel struct{ v atomic.Value }

func (a *atomicIOModel) Load() IOModel   { return a.v.Load().(IOModel) }
func (a *atomicIOModel) Store(m IOModel) { a.v.Store(m) }

// ioLoops is the number of event loops Config.IOLoops asked for (kefir server
// reads KEFIR_IO_LOOPS into it), 0 for the default. Process-wide like the loops
// themselves: New sets it, and it counts only until the first epoll connection
// starts them.
var ioLoops atomic.Int64

// defaultIOLoops is one loop per two processors (as the process started): a
// loop keeps one processor busy, and the other half is left for the goroutines
// that wait for fsyncs, the storage engine's background work and, on a
// benchmark box, the load generator.
var defaultIOLoops = max(1, runtime.GOMAXPROCS(0)/2)

// setIOLoops records Config.IOLoops; n <= 0 leaves the count as it is.
func setIOLoops(n int) {
	if n > 0 {
		ioLoops.Store(int64(n))
	}
}

// loopCount is how many event loops the process starts.
func loopCount() int {
	if n := ioLoops.Load(); n > 0 {
		return int(n)
	}
	return defaultIOLoops
}

// syncFronts maps an engine to the highest position its connections wait to make
// durable. The key is weak so that the servers a test process opens and closes
// are not kept alive by it; an entry is a few bytes.
var syncFronts sync.Map // weak.Pointer[storage.DB] -> *atomic.Uint64

// syncFrontOf returns db's sync front. The shard's read check (a read waits until
// what it reports is durable) can only wait while a sync or cad write is not yet
// durable; every such write comes from a connection, which raises the front before
// it waits. A loop compares the front with the engine's durable position to know,
// without asking the shard, that a read cannot wait.
func syncFrontOf(db *storage.DB) *atomic.Uint64 {
	k := weak.Make(db)
	if v, ok := syncFronts.Load(k); ok {
		return v.(*atomic.Uint64)
	}
	v, _ := syncFronts.LoadOrStore(k, new(atomic.Uint64))
	return v.(*atomic.Uint64)
}

// SetIOModel sets the I/O model of the connections accepted from now on (what
// New does with a non-empty Config.IOModel). IOEpoll where there is no epoll
// falls back to IOGoroutine.
func SetIOModel(m IOModel) {
	if m == IOEpoll && !epollSupported {
		m = IOGoroutine
	}
	ioModel.Store(m)
}

// CurrentIOModel is the I/O model new connections get.
func CurrentIOModel() IOModel { return ioModel.Load() }
