//go:build linux && !race

package server

import (
	"syscall"
	"unsafe"
)

// sockRead and sockWrite are read(2) and write(2) on a non-blocking socket, made
// without telling the scheduler (RawSyscall): they never block, so the P need not
// be released for them. Through syscall.Read/Write each one entered the runtime's
// syscall state, and one that outlasted a sysmon tick (a loopback write does the
// receiver's TCP work, 15–30 µs) could have its P retaken and handed to another
// thread; sysmon, kept busy, then polled every 20 µs — about a third of a nanosleep
// per durable SET at -P 1 (strace), and context switches Redis does not make.
// The price: a goroutine in a raw call cannot be stopped, so a stop-the-world (GC) waits
// for it — at most one copy into the socket buffer (a few hundred µs for a large reply).
// Race builds use the syscall package for its happens-before annotations
// (sockio_race_linux.go).
func sockRead(fd int, p []byte) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func sockWrite(fd int, b []byte) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
