package vfs

import (
	"io/fs"
	"path/filepath"
	"sort"
	"syscall"
)

// The namespace of the in-memory file systems (Mem, RAM): files by cleaned
// path, and the set of directories. One copy of what both do to it.

// listDir returns the names of the files and directories directly in dir,
// sorted (ReadDir's answer; the caller checked that dir exists).
func listDir[N any](files map[string]N, dirs map[string]bool, dir string) []string {
	var names []string
	for name := range files {
		if filepath.Dir(name) == dir {
			names = append(names, filepath.Base(name))
		}
	}
	for d := range dirs {
		if d != dir && filepath.Dir(d) == dir {
			names = append(names, filepath.Base(d))
		}
	}
	sort.Strings(names)
	return names
}

// mkdirAll adds dir and its missing parents to dirs, refusing a path that
// goes through a file (MkdirAll).
func mkdirAll[N any](files map[string]N, dirs map[string]bool, dir string) error {
	for d := dir; !dirs[d]; d = filepath.Dir(d) {
		if _, isFile := files[d]; isFile {
			return &fs.PathError{Op: "mkdir", Path: d, Err: syscall.ENOTDIR}
		}
		dirs[d] = true
	}
	return nil
}
