package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFileName is the file in a data directory that a running node holds an
// exclusive lock on for its whole life.
//
// Two processes on one directory corrupt it: the second one recovers it as if
// the first had crashed (recording lost versions, moving the next version, or
// replaying the replication log under the first one's feet) before anything
// else, such as its ports, can stop it. So New takes the lock before it reads
// anything in the directory, and a second node fails at once, naming the
// holder. The lock is flock(2) on an open file: the kernel drops it when the
// holder exits, however it exits (kill -9 included), so a crash never leaves a
// stale lock behind; the pid in the file is only for the message.
const LockFileName = "LOCK"

// DirLockedError is returned by LockDataDir (and New) when another process
// holds the data directory.
type DirLockedError struct {
	Dir string
	// PID is the holder's process id as it wrote it into the lock file; 0 if it
	// had not written it yet (it is starting) or it could not be read.
	PID int
}

func (e *DirLockedError) Error() string {
	who := "pid unknown: it is just starting"
	if e.PID > 0 {
		who = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by another kefir process (%s; it holds %s): stop it, or give this node another --dir",
		e.Dir, who, filepath.Join(e.Dir, LockFileName))
}

// ErrDirLocked matches a DirLockedError with errors.Is.
var ErrDirLocked = errors.New("data directory in use")

// Is lets errors.Is(err, ErrDirLocked) match.
func (e *DirLockedError) Is(target error) bool { return target == ErrDirLocked }

// DirLock is a held data directory lock.
type DirLock struct{ f *os.File }

// LockDataDir takes the exclusive, non-blocking lock on dir (which must exist)
// and writes this process's pid into the lock file. It fails at once with a
// *DirLockedError if another process (or another open in this one) holds it.
func LockDataDir(dir string) (*DirLock, error) {
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("server: open lock file: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("server: lock %s: %w", path, err)
	}
	if held {
		pid := readPID(f)
		f.Close()
		return nil, &DirLockedError{Dir: dir, PID: pid}
	}
	// The pid of an earlier holder may still be there: it exited, which freed
	// the lock, but nothing removes the file (removing it would let two
	// processes lock two different files of one name).
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("server: write %s: %w", path, err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("server: write %s: %w", path, err)
	}
	return &DirLock{f: f}, nil
}

// readPID returns the pid in a lock file, 0 if there is none.
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Unlock releases the lock. The file stays: see LockDataDir.
func (l *DirLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
