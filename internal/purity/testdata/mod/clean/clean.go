// Package clean is pure: durations are values, not clock reads.
package clean

import (
	"fmt"
	"time"
)

func Deadline(now time.Duration, d time.Duration) string { return fmt.Sprint(now + d) }
