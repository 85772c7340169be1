package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand"
	"testing"
)

// RAM keeps what a reference byte slice keeps through random appends, overwrites,
// holes and truncations across its chunk boundaries, and refuses writes through a
// read-only handle and any use of a closed one.
func TestRAMMatchesAByteSlice(t *testing.T) {
	r := NewRAM()
	f, err := r.Create("/f")
	if err != nil {
		t.Fatal(err)
	}
	var ref []byte
	rng := rand.New(rand.NewSource(1))
	for i := range 2000 {
		p := make([]byte, rng.Intn(3*ramChunk/2))
		rng.Read(p)
		switch rng.Intn(4) {
		case 0, 1:
			mustWrite(t, f, string(p))
			ref = append(ref, p...)
		case 2:
			off := rng.Int63n(int64(len(ref)) + ramChunk)
			mustWriteAt(t, f, p, off)
			if end := off + int64(len(p)); end > int64(len(ref)) {
				ref = append(ref, make([]byte, end-int64(len(ref)))...)
			}
			copy(ref[off:], p)
		case 3:
			size := rng.Int63n(int64(len(ref)) + 1)
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			ref = ref[:size]
		}
		if n, _ := f.Size(); n != int64(len(ref)) {
			t.Fatalf("step %d: size %d, want %d", i, n, len(ref))
		}
		off := rng.Int63n(int64(len(ref)) + 1)
		buf := make([]byte, rng.Intn(2*ramChunk))
		n, err := f.ReadAt(buf, off)
		want := ref[off:min(int64(len(ref)), off+int64(len(buf)))]
		if !bytes.Equal(buf[:n], want) || (n < len(buf)) != errors.Is(err, io.EOF) {
			t.Fatalf("step %d: ReadAt(%d bytes, %d) = %d, %v; want %d bytes", i, len(buf), off, n, err, len(want))
		}
	}
	if got := readAll(t, r, "/f"); got != string(ref) {
		t.Fatalf("final contents differ (%d bytes, want %d)", len(got), len(ref))
	}
	if r.Used() != int64(len(ref)) {
		t.Fatalf("Used = %d, want %d", r.Used(), len(ref))
	}
	ro, err := r.Open("/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.Write([]byte("x")); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("write through a read-only handle: %v", err)
	}
	ro.Close()
	if _, err := ro.ReadAt(make([]byte, 1), 0); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("read through a closed handle: %v", err)
	}
	if _, err := r.Create("/nodir/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("create in a missing directory: %v", err)
	}
}
