//go:build !linux

package faultproxy

import (
	"errors"
	"time"
)

// clock is Linux-only (a timerfd); elsewhere the proxy sleeps with
// time.Sleep, whose precision is the platform's.
type clock struct{}

func newClock() (*clock, error) { return nil, errors.New("faultproxy: no timerfd on this platform") }

func (c *clock) sleepUntil(time.Time) error { return errors.New("faultproxy: no timerfd") }

func (c *clock) close() {}
