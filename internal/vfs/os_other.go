//go:build !linux

package vfs

import "os"

// reopenForWriteAt opens a second, non-append, write-only descriptor on f's file by
// name (without /proc, a rename since f was opened would point it elsewhere; Kefir does
// not rename files it is writing).
func reopenForWriteAt(f *os.File) (*os.File, error) {
	return os.OpenFile(f.Name(), os.O_WRONLY, 0)
}

// Sync is fsync.
func (f *osFile) Sync() error { return f.File.Sync() }

// Preallocate is a no-op where fallocate is not available.
func (f *osFile) Preallocate(off, n int64) error { return nil }

// Unmap releases a mapping returned by a Mapper (none exist on this platform).
func Unmap(b []byte) error { return nil }
