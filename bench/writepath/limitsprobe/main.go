// Command limitsprobe prints this machine's floors for the write path
// (bench/writepath/run.sh): the loopback round trip and a 4 KiB
// write+fdatasync in DIR, alone and with 2 and 3 writers at once on
// separate files (three replicas share one disk on a test box).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kefirdb/kefir/bench/limits"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: limitsprobe DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	r, err := limits.Measure(dir, 1000)
	if err != nil {
		fmt.Fprintln(os.Stderr, "limitsprobe:", err)
		os.Exit(1)
	}
	fmt.Println(r)
	for _, k := range []int{2, 3} {
		var mu sync.Mutex
		var all []time.Duration
		var wg sync.WaitGroup
		for i := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := filepath.Join(dir, fmt.Sprintf("probe%d", i))
				if err := os.MkdirAll(d, 0o755); err != nil {
					fmt.Fprintln(os.Stderr, "limitsprobe:", err)
					os.Exit(1)
				}
				ds, err := limits.FsyncLatency(d, 1000)
				if err != nil {
					fmt.Fprintln(os.Stderr, "limitsprobe:", err)
					os.Exit(1)
				}
				mu.Lock()
				all = append(all, ds...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		slices.Sort(all)
		fmt.Printf("4 KiB write+fdatasync, %d writers at once on this disk: p50 %.0f µs (p90 %.0f)\n",
			k, float64(all[len(all)/2])/1e3, float64(all[len(all)*9/10])/1e3)
	}
}
