// Package seglogtest holds test helpers for the logs built on internal/seglog.
package seglogtest

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vfs"
)

// LoadDir unpacks the gzipped tar archive at path (flat: file names only) into dir on
// fs and syncs every file and the directory: a log directory as an older version of
// the code left it, for format-compatibility tests.
func LoadDir(t testing.TB, fs vfs.FS, dir, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := fs.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, h.Name, err)
		}
		w, err := fs.Create(vfs.Join(dir, h.Name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		names = append(names, h.Name)
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	return names
}

// ReadFile returns the contents of path on fs.
func ReadFile(t testing.TB, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if n > 0 {
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// WaitOrFail waits for ch to be closed (or receive), failing the test after ten
// seconds.
func WaitOrFail(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
