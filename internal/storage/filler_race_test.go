package storage

import (
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog/seglogtest"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// gateFS wraps a vfs.Mem so a test can hold the filler's zero-fill writes and run code
// right after a ReadDir: the interleavings between a filler goroutine and recovery are
// forced, not waited for.
type gateFS struct {
	*vfs.Mem

	mu          sync.Mutex
	gate        chan struct{} // when non-nil, the filler's writes wait until it is closed
	entered     chan struct{} // closed by the first write that waits on gate
	afterList   func()        // run once after the next ReadDir's listing, before it returns
	zeroRemoved chan error    // receives the result of each Remove of a zero-filled file
}

func newGateFS() *gateFS {
	return &gateFS{Mem: vfs.NewMem(), zeroRemoved: make(chan error, 16)}
}

// holdFills makes the filler's next writes wait until the returned release is called.
func (g *gateFS) holdFills() (entered <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.entered = make(chan struct{}), make(chan struct{})
	gate := g.gate
	var once sync.Once
	return g.entered, func() { once.Do(func() { close(gate) }) }
}

func (g *gateFS) Create(name string) (vfs.File, error) {
	f, err := g.Mem.Create(name)
	if err != nil || !strings.HasSuffix(name, zeroName) {
		return f, err
	}
	return &gatedFile{File: f, g: g}, nil
}

func (g *gateFS) Remove(name string) error {
	err := g.Mem.Remove(name)
	if strings.HasSuffix(name, zeroName) {
		g.zeroRemoved <- err
	}
	return err
}

func (g *gateFS) ReadDir(dir string) ([]string, error) {
	names, err := g.Mem.ReadDir(dir)
	g.mu.Lock()
	hook := g.afterList
	g.afterList = nil
	g.mu.Unlock()
	if hook != nil {
		hook()
	}
	return names, err
}

type gatedFile struct {
	vfs.File
	g *gateFS
}

func (f *gatedFile) wait() {
	f.g.mu.Lock()
	gate, entered := f.g.gate, f.g.entered
	if gate != nil {
		select {
		case <-entered:
		default:
			close(entered)
		}
	}
	f.g.mu.Unlock()
	if gate != nil {
		<-gate
	}
}

func (f *gatedFile) Write(p []byte) (int, error) {
	f.wait()
	return f.File.Write(p)
}

func (f *gatedFile) WriteAt(p []byte, off int64) (int, error) {
	f.wait()
	return f.File.(vfs.WriterAt).WriteAt(p, off)
}

// TestRecoveryWhileAnOldFillerRemovesItsFile forces the interleaving that made
// TestCrashRecoveryAsyncRoll fail under load ("remove leftover /db/zero-segment.tmp: file
// does not exist"): an engine's filler is part way through zero-filling the next
// segment's file, whose name a directory sync made durable, when the power goes; the
// engine was never closed (the crash tests drop it), so its filler goroutine lives on.
// The new engine's recovery lists the directory and sees the leftover; the old filler's
// next write fails on its stale handle and it removes its file by name — the same name,
// in the new incarnation's directory; then recovery's own Remove finds nothing. A leftover
// that is already gone is what recovery wanted: it must open, with every synced record.
func TestRecoveryWhileAnOldFillerRemovesItsFile(t *testing.T) {
	g := newGateFS()
	o := memOpts(g)
	o.Inline = false // the filler runs on its goroutine
	db := mustOpen(t, o)
	entered, release := g.holdFills()
	defer release()
	// A quarter of the first segment (4 KiB) makes the engine ask for the next file.
	var last Pos
	for i := 0; i < 20; i++ {
		last = put(t, db, "k"+strings.Repeat("x", i), uint64(i+1), strings.Repeat("v", 100))
	}
	if _, err := db.Sync(last); err != nil {
		t.Fatal(err)
	}
	seglogtest.WaitOrFail(t, entered, "the filler's first write")
	// Any roll or checkpoint syncs the directory; the filler's file is then durable.
	if err := g.SyncDir("/db"); err != nil {
		t.Fatal(err)
	}
	g.Crash(nil)
	// db is not closed: a power cut gives it no chance to stop its filler.
	g.mu.Lock()
	g.afterList = func() {
		release()
		select {
		case err := <-g.zeroRemoved:
			if err != nil {
				t.Errorf("the old filler's remove: %v (the interleaving was not forced)", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the old filler did not remove its file")
		}
	}
	g.mu.Unlock()
	db2, err := Open(o)
	if err != nil {
		t.Fatalf("reopen while the old filler removed its leftover file: %v", err)
	}
	defer db2.Close()
	if db2.LastPos() < last {
		t.Fatalf("recovered to %d, but %d was synced", db2.LastPos(), last)
	}
	for i := 0; i < 20; i++ {
		if v, err := db2.Get([]byte("k" + strings.Repeat("x", i))); err != nil || string(v.Data) != strings.Repeat("v", 100) {
			t.Fatalf("key %d after recovery: %q, %v", i, v.Data, err)
		}
	}
	// Recovery asks its own filler for the next file; once it is done, a file of that
	// name must be that one, ready, or none.
	if !testgroup.Until(10*time.Second, time.Millisecond, db2.fill.Idle) {
		t.Fatal("the new engine's filler did not finish")
	}
	if _, err := g.Stat("/db/" + zeroName); (err == nil) != db2.fill.ReadyIn("/db") {
		t.Fatalf("zero-filled file after recovery: %v, but the new filler's file ready: %v", err, db2.fill.ReadyIn("/db"))
	}
	db.fill.Close() // the old filler is done; do not leak its goroutine
}

// A leftover temporary file that vanished between the listing and its removal is not
// an error, whoever removed it; any other failure to remove one still is.
func TestRecoveryRemovesLeftoversStrictly(t *testing.T) {
	g := newGateFS()
	o := memOpts(g)
	db := mustOpen(t, o)
	put(t, db, "a", 1, "1")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{zeroName, segName(0) + ".hint.tmp"} {
		f, err := g.Create("/db/" + name)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	g.mu.Lock()
	g.afterList = func() { _ = g.Mem.Remove("/db/" + zeroName) } // someone else got there first
	g.mu.Unlock()
	db2 := mustOpen(t, o)
	for _, name := range []string{zeroName, segName(0) + ".hint.tmp"} {
		if _, err := g.Stat("/db/" + name); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s after recovery: %v, want it removed", name, err)
		}
	}
	if v, err := db2.Get([]byte("a")); err != nil || string(v.Data) != "1" {
		t.Fatalf("Get(a) = %q, %v", v.Data, err)
	}
	db2.Close()
	// A removal that fails for another reason (here: the power is off) fails Open.
	f, err := g.Create("/db/" + zeroName)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	g.mu.Lock()
	g.afterList = func() { g.CrashAfter(0) }
	g.mu.Unlock()
	if db3, err := Open(o); err == nil {
		db3.Close()
		t.Fatal("Open succeeded although a leftover could not be removed")
	}
}
