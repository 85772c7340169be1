package vfs

import (
	"bytes"
	"errors"
	"testing"
)

func TestZeroFillIsDurable(t *testing.T) {
	m := NewMem()
	f, _ := m.Create("/z")
	if err := ZeroFill(f, 9<<20+5, nil); err != nil {
		t.Fatal(err)
	}
	m.SyncDir("/")
	m.Crash(nil) // nothing unsynced may be needed
	f, _ = m.Open("/z")
	b := make([]byte, 9<<20+5)
	if n, _ := f.ReadAt(b, 0); n != len(b) || !bytes.Equal(b, make([]byte, len(b))) {
		t.Fatalf("after a crash: %d bytes, want %d zeros", n, len(b))
	}
	g, _ := m.Create("/y")
	if err := ZeroFill(g, 4<<20, func() bool { return true }); !errors.Is(err, ErrStopped) {
		t.Fatalf("stopped fill = %v, want ErrStopped", err)
	}
}

func TestZeroNonZeroWritesOnlyDirtyBlocks(t *testing.T) {
	m := NewMem()
	f, _ := m.Create("/f")
	f.(WriterAt).WriteAt(make([]byte, 5*4096), 0)
	f.(WriterAt).WriteAt([]byte{1}, 4096+7)   // block 1
	f.(WriterAt).WriteAt([]byte{2}, 3*4096+1) // block 3
	f.Sync()
	b := make([]byte, 5*4096)
	f.ReadAt(b, 0)
	ops := m.Ops()
	// From offset 100: block 0's part [100, 4096) is zero, block 1 and 3 are not.
	n, err := ZeroNonZero(f.(WriterAt), b[100:], 100)
	if err != nil || n != 2*4096 || m.Ops()-ops != 2 {
		t.Fatalf("ZeroNonZero = %d, %v in %d writes; want 8192 bytes in 2", n, err, m.Ops()-ops)
	}
	f.ReadAt(b, 0)
	if !bytes.Equal(b, make([]byte, len(b))) {
		t.Fatal("non-zero bytes left")
	}
	if n, _ := ZeroNonZero(f.(WriterAt), b[100:], 100); n != 0 {
		t.Fatalf("a zero range cost %d bytes of writes", n)
	}
}
