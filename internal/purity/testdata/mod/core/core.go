// Package core breaks every rule purity checks, for purity_test.go.
package core

import (
	"math/rand"
	clock "time"

	"example.com/m/dep"
)

func Step() int {
	go func() {}()
	ch := make(chan int)
	select {
	case <-ch:
	default:
	}
	_ = clock.Now()
	return rand.Int() + dep.N()
}
