// Command limitsprobe prints this machine's floors (bench/limits): the
// loopback round trip and a 4 KiB write+fdatasync in DIR, the figures issue
// 31's write-path target is stated in (bench/writepath/run.sh).
package main

import (
	"fmt"
	"os"

	"github.com/kefirdb/kefir/bench/limits"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: limitsprobe DIR")
		os.Exit(2)
	}
	r, err := limits.Measure(os.Args[1], 1000)
	if err != nil {
		fmt.Fprintln(os.Stderr, "limitsprobe:", err)
		os.Exit(1)
	}
	fmt.Println(r)
}
