package main

import "syscall"

// nodeProcAttr puts a node in its own process group (Ctrl-C reaches only
// `up`, which then stops the nodes in order) and asks the kernel to send it
// SIGTERM if `up` itself dies (e.g. SIGKILL), so no node outlives its
// launcher.
func nodeProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
