//go:build !cadtrace

package vrshard

// The default build's CAD timeline (cadtrace.go holds the real one, built
// with -tags cadtrace for bench/cadbench): every hook is an empty method on
// an empty struct, which the compiler inlines to nothing, and cadtraceOn is
// a constant false, so the guarded measuring blocks at the hook sites are
// dropped at compile time. Production pays nothing for the instrument.

const cadtraceOn = false

type tracer struct{}

func newTracer(string) *tracer { return nil }

func (*tracer) appended(first, last, seq uint64, leader bool)                        {}
func (*tracer) synced(seq uint64, d traceDur)                                        {}
func (*tracer) followerPersisted(p uint64)                                           {}
func (*tracer) committed(c uint64)                                                   {}
func (*tracer) appliedTo(a uint64)                                                   {}
func (*tracer) readable(R uint64)                                                    {}
func (*tracer) sample(name string, d int64)                                          {}
func (*tracer) readyAt(first, last uint64, props func(op uint64) (traceStamp, bool)) {}
func (*tracer) received(first, last uint64)                                          {}
func (*tracer) okSent(p uint64)                                                      {}
func (*tracer) replied(op uint64)                                                    {}

func traceTimeline(*Replica, ...*Replica) string { return "" }

// traceStamp and traceDur time an fsync for the tracer; here they are
// zero-size and their methods empty, so the timed call costs no clock read.
type (
	traceStamp struct{}
	traceDur   struct{}
)

func traceNow() traceStamp         { return traceStamp{} }
func (traceStamp) since() traceDur { return traceDur{} }
func (traceStamp) ago() int64      { return 0 }
