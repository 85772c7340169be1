package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// nodeProcAttr puts a node in its own process group (Ctrl-C reaches only
// `up`, which then stops the nodes in order) and asks the kernel to send it
// SIGTERM if `up` itself dies (e.g. SIGKILL), so no node outlives its
// launcher.
func nodeProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// portHolder names the process listening on addr's port ("pid 123 (kefir
// server --node-id n1 …)"), or "" when it cannot tell: the listening socket's
// inode comes from /proc/net/tcp{,6}, its owner from the /proc/PID/fd links
// this user may read (another user's process stays anonymous).
func portHolder(addr string) string {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return ""
	}
	want := fmt.Sprintf(":%04X", port)
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// fs[1] is the local address, fs[3] the state (0A: listen),
			// fs[9] the socket's inode.
			if len(fs) > 9 && strings.HasSuffix(fs[1], want) && fs[3] == "0A" && fs[9] != "0" {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		fds, _ := os.ReadDir(filepath.Join(p, "fd"))
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join(p, "fd", fd.Name()))
			if err != nil || !inodes[l] {
				continue
			}
			pid := filepath.Base(p)
			cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
			c := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
			if len(c) > 120 {
				c = c[:120] + "…"
			}
			if c == "" {
				return "pid " + pid
			}
			return "pid " + pid + " (" + c + ")"
		}
	}
	return "another user's process"
}
