package check

import (
	"fmt"
	"sort"
	"strings"
)

// The dependency graph of a transaction history and its cycles: edges
// inferred by elle.go, strongly connected components (Tarjan), and the
// searches for each kind of cycle inside them.

// edgeKind is a dependency edge's kind.
type edgeKind uint8

const (
	ekWW edgeKind = 1 << iota
	ekWR
	ekRW
	ekRT   // real time
	ekProc // process order
	// ekWWI: a ww edge inferred from an rw one (writeOrderFromMisses), so
	// only sound for the models it assumes; it never makes a G0 or G1c on
	// its own, only closes cycles that have an rw edge.
	ekWWI
	ekAll = ekWW | ekWR | ekRW | ekRT | ekProc | ekWWI
)

// txnEdge is an edge with what explains it: on key, the values a and b
// (ww: a then b; wr: b read, a = b; rw: a read, b the next version).
type txnEdge struct {
	to   int32
	kind edgeKind
	key  string
	a, b int
	// later: b is a later version than a, not necessarily the next (an
	// append nobody read, or a register order known only partially).
	later bool
	// missed (ekWWI): the key of the rw edge it was inferred from.
	missed string
}

type edgeID struct {
	from, to int32
	kind     edgeKind
}

type txnGraph struct {
	adj   [][]txnEdge
	seen  map[edgeID]struct{}
	edges int
	// hasExtra: there are real-time or process edges
	hasExtra bool
	// scratch for sccs and bfs, sized to the node count
	index, low, prev []int32
	prevEdge         []txnEdge
	onStack          []bool
	visit            []int32 // bfs stamp
	stamp            int32
	compOf, subOf    []int32
	// findNonadjacent's, per (transaction, state) pair; allocated on first use
	nvisit, nprev []int32
	nprevEdge     []txnEdge
}

func newTxnGraph(n int) *txnGraph {
	g := &txnGraph{adj: make([][]txnEdge, n), seen: make(map[edgeID]struct{}),
		index: make([]int32, n), low: make([]int32, n), prev: make([]int32, n),
		prevEdge: make([]txnEdge, n), onStack: make([]bool, n), visit: make([]int32, n),
		compOf: make([]int32, n), subOf: make([]int32, n)}
	return g
}

// add adds from -> to unless it is a self edge or one of the same kind
// between the same transactions is there already (the first explains it).
func (g *txnGraph) add(from, to int, e txnEdge) {
	if from == to {
		return
	}
	e.to = int32(to)
	id := edgeID{int32(from), int32(to), e.kind}
	if _, ok := g.seen[id]; ok {
		return
	}
	g.seen[id] = struct{}{}
	g.adj[from] = append(g.adj[from], e)
	g.edges++
	g.hasExtra = g.hasExtra || e.kind&(ekRT|ekProc) != 0
}

// cycleClass is one kind of cycle searched for: a first edge of kind seed,
// closed by a path of edges in rest.
type cycleClass struct {
	seed, rest edgeKind
}

// cycles finds the strongly connected components of the whole graph and,
// in each, the shortest cycle of each class it can: G0 (ww), G1c (a wr,
// then ww/wr), G-single (one rw, then ww/wr), G2-item (an rw, then
// anything). Real-time and process edges, when present, may close any of
// them. Each cycle is named by the edges it actually has.
func (x *txnAnalyzer) cycles(budget int) {
	g := x.g
	n := len(g.adj)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	extra := ekRT | ekProc
	classes := []cycleClass{
		{ekWW, ekWW | extra},
		{ekWR, ekWW | ekWR | extra},
		{ekRW, ekWW | ekWWI | ekWR | extra},
		{ekRW, ekAll},
	}
	for i := range g.compOf {
		g.compOf[i] = -1
	}
	comps := g.sccs(all, func(int) bool { return true }, ekAll)
	for c, comp := range comps {
		for _, v := range comp {
			g.compOf[v] = int32(c)
		}
	}
	exhausted := 0
	for c, comp := range comps {
		if len(comp) < 2 {
			continue
		}
		sort.Ints(comp)
		inComp := func(v int) bool { return g.compOf[v] == int32(c) }
		named := map[string]bool{}
		report := func(cyc []cycEdge) {
			name, expl := x.explain(cyc)
			if named[name] {
				return
			}
			named[name] = true
			txns := make([]int, len(cyc))
			key := ""
			for i, e := range cyc {
				txns[i] = e.from
				if key == "" {
					key = e.key
				}
			}
			x.anomaly(name, key, expl, txns...)
		}
		out := false
		for _, cl := range classes {
			// Data edges alone first: a cycle that needs no real-time or
			// process edge is named without the suffix.
			cyc, ok := g.findCycle(comp, inComp, cycleClass{cl.seed, cl.rest &^ extra}, &budget)
			out = out || !ok
			if cyc == nil && g.hasExtra {
				cyc, ok = g.findCycle(comp, inComp, cl, &budget)
				out = out || !ok
			}
			if cyc != nil {
				report(cyc)
			}
		}
		// Snapshot isolation allows a cycle only if two of its rw edges are
		// adjacent: look for one that has none adjacent, unless G-single
		// already refuted it.
		if !named[GSingle] && !named[GSingle+"-realtime"] && !named[GSingle+"-process"] && hasEdge(g, comp, inComp, ekRW) {
			cyc, ok := g.findNonadjacent(comp, inComp, &budget)
			out = out || !ok
			if cyc != nil {
				report(cyc)
			}
		}
		if out {
			exhausted++
		}
	}
	if exhausted > 0 {
		x.notes = append(x.notes, fmt.Sprintf("cycle search budget ran out in %d component(s): a G-single or G-nonadjacent there may be unreported", exhausted))
	}
}

// hasEdge reports whether an edge of kind k joins two nodes of comp.
func hasEdge(g *txnGraph, comp []int, inComp func(int) bool, k edgeKind) bool {
	for _, a := range comp {
		for _, e := range g.adj[a] {
			if e.kind == k && inComp(int(e.to)) {
				return true
			}
		}
	}
	return false
}

// cycEdge is one edge of a found cycle.
type cycEdge struct {
	from int
	txnEdge
}

// findCycle looks, inside the component comp, for a cycle of class cl: an
// edge a -seed-> b and a shortest path b -> a over rest edges. When seed is
// among rest, such a path exists iff a and b share a strongly connected
// component of the rest-only subgraph, and is found inside it; otherwise
// (G-single: an rw edge closed by ww/wr) reachability across those
// components is searched breadth-first, within *budget visited nodes. Of
// the first few cycles found it returns the shortest. ok is false when the
// budget ran out before a cycle was found.
func (g *txnGraph) findCycle(comp []int, inComp func(int) bool, cl cycleClass, budget *int) (best []cycEdge, ok bool) {
	subs := g.sccs(comp, inComp, cl.rest)
	for s, sub := range subs {
		for _, v := range sub {
			g.subOf[v] = int32(s)
		}
	}
	const tries = 8
	found := 0
	consider := func(cyc []cycEdge) {
		if cyc != nil {
			found++
			if best == nil || len(cyc) < len(best) {
				best = cyc
			}
		}
	}
	// Seeds whose ends share a rest component: a closing path surely exists.
	for _, a := range comp {
		for _, e := range g.adj[a] {
			b := int(e.to)
			if e.kind&cl.seed == 0 || !inComp(b) || g.subOf[a] != g.subOf[b] {
				continue
			}
			sa := g.subOf[a]
			path := g.bfs(b, a, cl.rest, func(v int) bool { return inComp(v) && g.subOf[v] == sa }, nil)
			consider(append([]cycEdge{{a, e}}, path...))
			if found >= tries {
				return best, true
			}
		}
	}
	if best != nil || cl.seed&cl.rest != 0 {
		return best, true
	}
	for _, a := range comp {
		for _, e := range g.adj[a] {
			b := int(e.to)
			if e.kind&cl.seed == 0 || !inComp(b) || g.subOf[a] == g.subOf[b] {
				continue
			}
			if *budget <= 0 {
				return best, best != nil
			}
			path := g.bfs(b, a, cl.rest, inComp, budget)
			if path != nil {
				consider(append([]cycEdge{{a, e}}, path...))
				return best, true
			}
		}
	}
	return best, true
}

// bfs returns a shortest path from -> to over edges of the kinds in mask
// and nodes allowed by in (nil if none). A non-nil budget is charged a unit
// per node visited and stops the search at zero.
func (g *txnGraph) bfs(from, to int, mask edgeKind, in func(int) bool, budget *int) []cycEdge {
	g.stamp++
	st := g.stamp
	g.visit[from] = st
	queue := []int{from}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		if budget != nil {
			if *budget <= 0 {
				return nil
			}
			*budget--
		}
		for _, e := range g.adj[v] {
			w := int(e.to)
			if e.kind&mask == 0 || g.visit[w] == st || !in(w) {
				continue
			}
			g.visit[w] = st
			g.prev[w] = int32(v)
			g.prevEdge[w] = e
			if w == to {
				var path []cycEdge
				for u := to; u != from; u = int(g.prev[u]) {
					path = append(path, cycEdge{int(g.prev[u]), g.prevEdge[u]})
				}
				for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
					path[i], path[j] = path[j], path[i]
				}
				return path
			}
			queue = append(queue, w)
		}
	}
	return nil
}

// sccs returns the strongly connected components of the subgraph of the
// nodes for which in holds, over edges of the kinds in mask (Tarjan's
// algorithm, iterative: histories are long and the graph may be a chain).
func (g *txnGraph) sccs(nodes []int, in func(int) bool, mask edgeKind) [][]int {
	for _, v := range nodes {
		g.index[v] = -1
	}
	var out [][]int
	var stack []int
	next := int32(0)
	type frame struct{ v, ei int }
	var call []frame
	push := func(v int) {
		g.index[v], g.low[v] = next, next
		next++
		stack = append(stack, v)
		g.onStack[v] = true
		call = append(call, frame{v, 0})
	}
	for _, root := range nodes {
		if g.index[root] != -1 {
			continue
		}
		push(root)
		for len(call) > 0 {
			f := &call[len(call)-1]
			v := f.v
			if f.ei < len(g.adj[v]) {
				e := g.adj[v][f.ei]
				f.ei++
				w := int(e.to)
				if e.kind&mask == 0 || !in(w) {
					continue
				}
				if g.index[w] == -1 {
					push(w)
				} else if g.onStack[w] && g.index[w] < g.low[v] {
					g.low[v] = g.index[w]
				}
				continue
			}
			call = call[:len(call)-1]
			if len(call) > 0 {
				if p := call[len(call)-1].v; g.low[v] < g.low[p] {
					g.low[p] = g.low[v]
				}
			}
			if g.low[v] == g.index[v] {
				var comp []int
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					g.onStack[w] = false
					comp = append(comp, w)
					if w == v {
						break
					}
				}
				out = append(out, comp)
			}
		}
	}
	return out
}

// explain names a cycle by its edges and writes it out, e.g.
// "T1 -rw(x: read 1, next 2)-> T2 -ww(y: 3 then 4)-> T1".
func (x *txnAnalyzer) explain(cyc []cycEdge) (name, expl string) {
	rw, wr := 0, 0
	rt, proc := false, false
	var b strings.Builder
	for _, e := range cyc {
		fmt.Fprintf(&b, "T%d ", e.from)
		switch e.kind {
		case ekWWI:
			fmt.Fprintf(&b, "-ww(%s: first, as T%d missed a write on %s)->", e.key, e.from, e.missed)
		case ekWW:
			fmt.Fprintf(&b, "-ww(%s: %s %s %s)->", e.key, fmtReg(e.a), pick(e.later, "then", "before"), fmtReg(e.b))
		case ekWR:
			wr++
			fmt.Fprintf(&b, "-wr(%s: read %s)->", e.key, fmtReg(e.a))
		case ekRW:
			rw++
			fmt.Fprintf(&b, "-rw(%s: read %s, %s %s)->", e.key, fmtReg(e.a), pick(e.later, "next", "later"), fmtReg(e.b))
		case ekRT:
			rt = true
			b.WriteString("-rt(returned before invoked)->")
		case ekProc:
			proc = true
			fmt.Fprintf(&b, "-process(p%d)->", e.a)
		}
		b.WriteByte(' ')
	}
	fmt.Fprintf(&b, "T%d", cyc[0].from)
	switch {
	case rw == 0 && wr == 0:
		name = G0
	case rw == 0:
		name = G1c
	case rw == 1:
		name = GSingle
	case nonadjacent(cyc):
		name = GNonadjacent
	default:
		name = G2Item
	}
	switch {
	case rt:
		name += "-realtime"
	case proc:
		name += "-process"
	}
	return name, b.String()
}

// nonadjacent reports whether the cycle has at least two rw edges and no
// two of them next to each other (cyclically).
func nonadjacent(cyc []cycEdge) bool {
	rw := 0
	for i, e := range cyc {
		if e.kind == ekRW {
			rw++
			if cyc[(i+1)%len(cyc)].kind == ekRW {
				return false
			}
		}
	}
	return rw >= 2
}

// findNonadjacent looks, inside comp, for a G-nonadjacent cycle: an edge
// a -rw-> b closed by a path b -> a that takes at least one more rw edge,
// never two rw edges in a row, and neither starts nor ends with one. It
// searches breadth-first over states (transaction, last edge was rw, took
// an rw), within *budget visited states; ok is false when it ran out. The
// shortest such walk from a seed may pass a transaction twice and is then
// not evidence (see below), so the search is a heuristic, like Elle's: it
// reports only cycles it can show, and may miss one.
func (g *txnGraph) findNonadjacent(comp []int, inComp func(int) bool, budget *int) (cyc []cycEdge, ok bool) {
	n := len(g.adj)
	if g.nvisit == nil {
		g.nvisit = make([]int32, 4*n)
		g.nprev = make([]int32, 4*n)
		g.nprevEdge = make([]txnEdge, 4*n)
	}
	state := func(v int, lastRW, tookRW bool) int {
		s := v * 4
		if lastRW {
			s += 2
		}
		if tookRW {
			s++
		}
		return s
	}
	for _, a := range comp {
		for _, seed := range g.adj[a] {
			b := int(seed.to)
			if seed.kind != ekRW || !inComp(b) {
				continue
			}
			g.stamp++
			st := g.stamp
			from := state(b, true, false)
			target := state(a, false, true)
			g.nvisit[from] = st
			queue := []int{from}
		search:
			for len(queue) > 0 {
				if *budget <= 0 {
					return nil, false
				}
				*budget--
				cur := queue[0]
				queue = queue[1:]
				v, lastRW := cur/4, cur&2 != 0
				for _, e := range g.adj[v] {
					w := int(e.to)
					rw := e.kind == ekRW
					if rw && lastRW || !inComp(w) {
						continue
					}
					next := state(w, rw, cur&1 != 0 || rw)
					if g.nvisit[next] == st {
						continue
					}
					g.nvisit[next] = st
					g.nprev[next] = int32(cur)
					g.nprevEdge[next] = e
					if next != target {
						queue = append(queue, next)
						continue
					}
					path := []cycEdge{}
					for s := target; s != from; s = int(g.nprev[s]) {
						path = append(path, cycEdge{int(g.nprev[s]) / 4, g.nprevEdge[s]})
					}
					path = append(path, cycEdge{a, seed})
					if !simple(path) {
						// A walk that passes a transaction twice may pair
						// rw edges differently than any cycle in it: no
						// verdict from it; try the next seed.
						break search
					}
					for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
						path[i], path[j] = path[j], path[i]
					}
					return path, true
				}
			}
		}
	}
	return nil, true
}

// simple reports whether the walk passes each transaction once.
func simple(walk []cycEdge) bool {
	seen := map[int]bool{}
	for _, e := range walk {
		if seen[e.from] {
			return false
		}
		seen[e.from] = true
	}
	return true
}

// pick words an edge: exact when it joins consecutive versions, else loose.
func pick(later bool, exact, loose string) string {
	if later {
		return loose
	}
	return exact
}
