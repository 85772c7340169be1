package kv

// OpRand is the random source of one script's or transaction's op:
// RANDOMKEY and HRANDFIELD inside the op pick with it. It is a function of
// the op's version and clock only (splitmix64 from a seed of the two), so
// every replica, and a replay after a crash, picks what the first run
// picked; successive picks within the op differ. A read-only op (version 0)
// is served by one node, whose picks need not match anyone's: its clock
// varies the seed from one read to the next.
type OpRand struct{ s uint64 }

// NewOpRand is the random source of the op at version with clock now.
func NewOpRand(version uint64, now int64) *OpRand {
	return &OpRand{s: version*0x9e3779b97f4a7c15 ^ uint64(now)}
}

// Uint64 is the next number (splitmix64).
func (r *OpRand) Uint64() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// IntN is a number in [0, n), n > 0 (the modulo's bias, below 2^-32 for
// the sizes an op picks among, does not matter here).
func (r *OpRand) IntN(n int) int { return int(r.Uint64() % uint64(n)) }
