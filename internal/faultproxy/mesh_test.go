package faultproxy

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

func newMesh(t *testing.T, n int) *Mesh {
	t.Helper()
	var ups []string
	for i := 0; i < n; i++ {
		ups = append(ups, newEcho(t).ln.Addr().String())
	}
	m, err := NewMesh(ups, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func meshDial(t *testing.T, m *Mesh, from, to int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", m.Addr(from, to))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func reachable(c net.Conn) bool {
	_, err := roundTrip(c, "ping", 150*time.Millisecond)
	return err == nil
}

func TestMeshPartitionIsolatesGroups(t *testing.T) {
	m := newMesh(t, 3)
	c01, c12, c20 := meshDial(t, m, 0, 1), meshDial(t, m, 1, 2), meshDial(t, m, 2, 0)
	m.Partition([]int{0}, []int{1, 2})
	if reachable(c01) || reachable(c20) {
		t.Fatal("links across the partition still work")
	}
	if !reachable(c12) {
		t.Fatal("link inside a group broke")
	}
	m.Heal()
	if !reachable(meshDial(t, m, 0, 1)) {
		t.Fatal("healed mesh does not connect 0 -> 1")
	}
}

func TestMeshBlockIsOneWay(t *testing.T) {
	m := newMesh(t, 2)
	m.Block(0, 1) // 0's bytes never reach 1; 1 still reaches 0
	c01 := meshDial(t, m, 0, 1)
	if _, err := roundTrip(c01, "x", 150*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("0 -> 1 should be blackholed, got %v", err)
	}
	// On 1's own connection to 0, 1's request arrives but 0's echo cannot
	// come back (that is 0 -> 1 again): the block covers both connections.
	c10 := meshDial(t, m, 1, 0)
	if _, err := roundTrip(c10, "y", 150*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("0's answers to 1 should be blackholed too, got %v", err)
	}
	if got := m.Proxy(1, 0).Stats().Forwarded[Up]; got != 2 {
		t.Fatalf("1 -> 0 carried %d bytes; 1's request should have got through", got)
	}
	m.Unblock(0, 1)
	if !reachable(c01) {
		t.Fatal("unblocked 0 -> 1 still broken")
	}
}
