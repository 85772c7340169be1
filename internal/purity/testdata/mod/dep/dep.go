// Package dep is imported by core and reads a file: impure through an import.
package dep

import "os"

func N() int {
	_, err := os.Stat("x")
	if err != nil {
		return 0
	}
	return 1
}
