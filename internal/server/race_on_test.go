//go:build race

package server

// raceOn: the race detector is on (it makes sync.Pool drop a share of
// what is put back, so allocation counts through a pool mean nothing).
const raceOn = true
