//go:build !linux

package vfs

// Sync is fsync.
func (f *osFile) Sync() error { return f.File.Sync() }

// Preallocate is a no-op where fallocate is not available.
func (f *osFile) Preallocate(off, n int64) error { return nil }

// Unmap releases a mapping returned by a Mapper (none exist on this platform).
func Unmap(b []byte) error { return nil }
