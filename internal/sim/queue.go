package sim

// item is a scheduled event. Items are ordered by (at, seq); seq makes the
// order total, so equal times resolve the same way on every replay.
type item struct {
	at   int64
	seq  uint64
	kind itemKind
	node Addr
	from Addr
	inc  uint32 // incarnation of node when scheduled; stale items are ignored
	n    int
	msg  any
	fn   func()
}

type itemKind uint8

const (
	itDeliver itemKind = iota
	itTick
	itSync
	itInvoke
	itCall
	itFault
)

// queue is a binary min-heap of items, by value to keep the hot path free of
// per-event allocations (container/heap would box every push).
type queue struct{ items []item }

func (q *queue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	return a.at < b.at || a.at == b.at && a.seq < b.seq
}

func (q *queue) push(it item) {
	q.items = append(q.items, it)
	i := len(q.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.items[i], q.items[p] = q.items[p], q.items[i]
		i = p
	}
}

func (q *queue) pop() item {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items[last] = item{} // drop references for the GC
	q.items = q.items[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		m := l
		if r := l + 1; r < last && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q.items[i], q.items[m] = q.items[m], q.items[i]
		i = m
	}
	return top
}

func (q *queue) len() int { return len(q.items) }
