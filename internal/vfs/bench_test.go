package vfs

import (
	"os"
	"testing"
)

// BenchmarkOSWrite2800 times an unsynced 2,800-byte append (about 50 SETs of the storage
// WAL) to a real file: the cost of Write itself, which WriteAt support must not raise.
// BENCHDIR picks the directory (default: a temp dir); the file is cut back every 1,000
// writes so it stays small.
func BenchmarkOSWrite2800(b *testing.B) {
	dir := os.Getenv("BENCHDIR")
	if dir == "" {
		dir = b.TempDir()
	}
	f, err := Default.Create(Join(dir, "bench-write"))
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(Join(dir, "bench-write"))
	defer f.Close()
	p := make([]byte, 2800)
	b.SetBytes(int64(len(p)))
	for i := 0; i < b.N; i++ {
		if i%1000 == 999 {
			if err := f.Truncate(0); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := f.Write(p); err != nil {
			b.Fatal(err)
		}
	}
}
