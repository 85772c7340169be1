package testgroup

import (
	"bytes"
	"sync"
)

// Buffer is text a test reads while other goroutines write it: a server's
// or replica's log (slog handlers write from the goroutines that log) or a
// child process's output (os/exec copies into it from its own goroutine).
// The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String is everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
