package faultproxy

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// clock waits until a release time with sub-millisecond precision.
//
// time.Sleep and time.Timer cannot: when every P is idle the Go runtime
// blocks in epoll_wait, whose timeout is in whole milliseconds, so a 250 µs
// sleep lasts about 1 ms and a 1.3 ms one about 2 ms. Through a proxy that
// sleeps once per direction, a 0.25 ms one-way link measured 2.3 ms per round
// trip instead of 0.5 ms, squeezing every latency ratio measured through it
// toward 1. A timerfd is armed with nanosecond precision and registered with
// the runtime's netpoller, so the goroutine reading it parks (no OS thread is
// held, no spinning) and is woken by epoll the moment the timer expires.
//
// One clock per forwarding direction of a connection, re-armed per wait: the
// timerfd's one slot is the only timer, not one per message.
type clock struct {
	f   *os.File
	fd  uintptr // f's descriptor, kept so that f.Fd() (which may switch f to blocking mode) is never needed
	buf [8]byte
}

const (
	clockMonotonic = 1 // CLOCK_MONOTONIC, which package syscall does not name
	tfdNonblock    = syscall.O_NONBLOCK
	tfdCloexec     = syscall.O_CLOEXEC
)

func newClock() (*clock, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, uintptr(tfdNonblock|tfdCloexec), 0)
	if errno != 0 {
		return nil, fmt.Errorf("faultproxy: timerfd_create: %w", errno)
	}
	return &clock{f: os.NewFile(fd, "faultproxy-timerfd"), fd: fd}, nil
}

// itimerspec is struct itimerspec: interval then value.
type itimerspec struct {
	interval, value syscall.Timespec
}

// sleepUntil returns once t has passed (at once if it already has). An error
// means the clock is closed or broken; the caller falls back to time.Sleep.
func (c *clock) sleepUntil(t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	spec := itimerspec{value: syscall.NsecToTimespec(int64(d))}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, c.fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("faultproxy: timerfd_settime: %w", errno)
	}
	// The read parks this goroutine in the netpoller until the expiration
	// count is readable.
	if _, err := c.f.Read(c.buf[:]); err != nil {
		return fmt.Errorf("faultproxy: timerfd read: %w", err)
	}
	return nil
}

func (c *clock) close() { c.f.Close() }
