package faultproxy

import (
	"errors"
	"fmt"
	"time"
)

// Mesh interposes a proxy on every directed pair of n nodes, so a test can
// partition, isolate or slow individual links between real processes. Node i
// must be configured to reach node j at Addr(i, j) instead of j's real
// address. Bytes i sends over connections it opened to j travel Up on proxy
// (i, j); j's answers travel Down on it. A link "i -> j" (what i says reaching
// j) is therefore Up of (i, j) plus Down of (j, i).
type Mesh struct {
	n       int
	proxies [][]*Proxy // [from][to], nil on the diagonal
}

// NewMesh starts n*(n-1) proxies on 127.0.0.1 in front of upstreams[j].
func NewMesh(upstreams []string, seed uint64) (*Mesh, error) {
	n := len(upstreams)
	m := &Mesh{n: n, proxies: make([][]*Proxy, n)}
	for i := range m.proxies {
		m.proxies[i] = make([]*Proxy, n)
		for j := range upstreams {
			if i == j {
				continue
			}
			p, err := New(upstreams[j], seed+uint64(i*n+j))
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("faultproxy: mesh %d->%d: %w", i, j, err)
			}
			m.proxies[i][j] = p
		}
	}
	return m, nil
}

// Addr is the address node from should dial to reach node to.
func (m *Mesh) Addr(from, to int) string { return m.proxies[from][to].Addr() }

// Proxy returns the proxy in front of to for connections opened by from.
func (m *Mesh) Proxy(from, to int) *Proxy { return m.proxies[from][to] }

// Block stops what from sends from reaching to (both on connections from
// opened and on connections to opened); to -> from is untouched.
func (m *Mesh) Block(from, to int) {
	m.proxies[from][to].Blackhole(Up, true)
	m.proxies[to][from].Blackhole(Down, true)
}

// Unblock restores from -> to.
func (m *Mesh) Unblock(from, to int) {
	m.proxies[from][to].Blackhole(Up, false)
	m.proxies[to][from].Blackhole(Down, false)
}

// Partition cuts every link between different groups, both ways. Nodes in no
// group keep all their links.
func (m *Mesh) Partition(groups ...[]int) {
	for gi, g := range groups {
		for hi, h := range groups {
			if gi == hi {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					m.Block(a, b)
				}
			}
		}
	}
}

// Isolate cuts node i from every other node, both ways.
func (m *Mesh) Isolate(i int) {
	for j := 0; j < m.n; j++ {
		if j != i {
			m.Block(i, j)
			m.Block(j, i)
		}
	}
}

// Delay slows what from sends to to by fixed plus up to jitter.
func (m *Mesh) Delay(from, to int, fixed, jitter time.Duration) {
	m.proxies[from][to].Delay(Up, fixed, jitter)
	m.proxies[to][from].Delay(Down, fixed, jitter)
}

// CutAll resets every connection touching node i (as if its links flapped).
func (m *Mesh) CutAll(i int) {
	for j := 0; j < m.n; j++ {
		if j != i {
			m.proxies[i][j].CutAll()
			m.proxies[j][i].CutAll()
		}
	}
}

// Heal removes every fault on every link.
func (m *Mesh) Heal() {
	m.each(func(p *Proxy) error { p.Heal(); return nil })
}

// Close stops every proxy.
func (m *Mesh) Close() error {
	return m.each(func(p *Proxy) error { return p.Close() })
}

func (m *Mesh) each(f func(*Proxy) error) error {
	var errs []error
	for i := range m.proxies {
		for _, p := range m.proxies[i] {
			if p != nil {
				if err := f(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}
