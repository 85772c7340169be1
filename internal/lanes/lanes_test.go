package lanes

import "testing"

// A lane put back is handed out again with its counter; a lane not put back
// (its write's outcome unknown) never is; a closed pool hands out none.
func TestPoolHandsOutOnlySettledLanes(t *testing.T) {
	var p Pool
	a := p.Get()
	if a == nil || a.ID == 0 || a.Next() != 1 {
		t.Fatalf("first lane %+v", a)
	}
	b := p.Get() // a is in use: another id
	if b.ID == a.ID {
		t.Fatalf("two writes in flight share id %d", a.ID)
	}
	b.Next()
	p.Put(a) // settled; b is retired (never put back)
	if c := p.Get(); c != a || c.Next() != 2 {
		t.Fatalf("after a settled: got %+v, want lane %d at request 2", c, a.ID)
	}
	if d := p.Get(); d == b || d.ID == b.ID {
		t.Fatalf("a retired lane was handed out again: %+v", d)
	}
	p.Close()
	if e := p.Get(); e != nil {
		t.Fatalf("closed pool handed out %+v", e)
	}
}
