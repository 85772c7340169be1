//go:build !unix

package server

import "os"

// tryLock is a no-op where flock(2) does not exist: the data directory is not
// protected against a second process there (docs/operations.md).
func tryLock(*os.File) (held bool, err error) { return false, nil }
