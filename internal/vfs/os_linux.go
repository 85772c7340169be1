//go:build linux

package vfs

import (
	"os"
	"strconv"
	"syscall"
)

// reopenForWriteAt opens a second, non-append, write-only descriptor on f's file through
// /proc/self/fd, so it reaches the same inode even if the file was renamed or removed
// since f was opened.
func reopenForWriteAt(f *os.File) (*os.File, error) {
	fd, err := syscall.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// Sync uses fdatasync: it persists the data and the metadata needed to read it back
// (the file size), but not timestamps, which saves a journal commit on most fsyncs.
func (f *osFile) Sync() error {
	for {
		err := syscall.Fdatasync(int(f.File.Fd()))
		if err != syscall.EINTR {
			if err != nil {
				return &osSyncError{name: f.Name(), err: err}
			}
			return nil
		}
	}
}

// Preallocate reserves disk blocks for [off, off+n) without changing the file size, so
// later appends allocate no extents and their fdatasync has less metadata to commit.
func (f *osFile) Preallocate(off, n int64) error {
	for {
		err := syscall.Fallocate(int(f.File.Fd()), 1 /* FALLOC_FL_KEEP_SIZE */, off, n)
		if err != syscall.EINTR {
			return err
		}
	}
}

// Map maps the file's first size bytes read-only (MAP_SHARED). The file must not shrink
// while mapped. size may reach past the file's end (storage's growMap reserves a whole
// segment ahead of its appends): pages past the end fault (SIGBUS) if touched, so the
// caller reads only below what the file holds. Release the mapping with Unmap.
func (f *osFile) Map(size int64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	return syscall.Mmap(int(f.File.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

// Unmap releases a mapping returned by a Mapper.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return syscall.Munmap(b)
}
