//go:build linux && race

package server

import "syscall"

// The race detector's build: syscall's Read and Write carry its happens-before
// annotations for file I/O, which clients in tests (net.Conn users) acquire, so a
// reply written here orders what came before it (see sockio_linux.go).
func sockRead(fd int, p []byte) (int, error)  { return syscall.Read(fd, p) }
func sockWrite(fd int, b []byte) (int, error) { return syscall.Write(fd, b) }
