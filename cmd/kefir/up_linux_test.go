package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// checkPorts names the node, the port and the process that holds it (here
// this test process), and portHolder says nothing of a free port.
func TestCheckPortsNamesTheHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	nodes := []*upNode{{id: "n1", client: "127.0.0.1:0", peer: "127.0.0.1:0", http: "127.0.0.1:0"},
		{id: "n2", client: "127.0.0.1:0", peer: addr, http: "127.0.0.1:0"}}
	err = checkPorts(nodes)
	want := fmt.Sprintf("n2's peer port %s is taken by pid %d (", addr, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("checkPorts = %v, want it to contain %q", err, want)
	}
	ln.Close()
	if h := portHolder(addr); h != "" {
		t.Errorf("portHolder of a closed port = %q", h)
	}
	if err := checkPorts(nodes); err != nil {
		t.Errorf("checkPorts with every port free: %v", err)
	}
}
