//go:build !linux

package main

import "syscall"

// nodeProcAttr puts a node in its own process group, so Ctrl-C reaches only
// `up`, which then stops the nodes in order.
func nodeProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// portHolder names the process listening on addr; this system does not say.
func portHolder(string) string { return "" }
