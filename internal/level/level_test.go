package level

import (
	"errors"
	"testing"
	"time"
)

func TestParseConsistencyRoundTrip(t *testing.T) {
	for _, c := range []Consistency{ConsLinearizable, ConsCrossClient, ConsSession, ConsEventual,
		BoundedVersionsLevel(0), BoundedVersionsLevel(7), BoundedTimeLevel(250 * time.Millisecond)} {
		got, err := ParseConsistency(c.String())
		if err != nil || got != c {
			t.Errorf("ParseConsistency(%q) = %v, %v; want %v", c.String(), got, err, c)
		}
	}
}

func TestParseConsistencyRejects(t *testing.T) {
	for _, s := range []string{"", "linear", "bounded()", "bounded(-1s)", "bounded(x)", "bounded(3", "default"} {
		if _, err := ParseConsistency(s); !errors.Is(err, ErrUnknownLevel) {
			t.Errorf("ParseConsistency(%q) err = %v; want ErrUnknownLevel", s, err)
		}
	}
}

func TestParseDurability(t *testing.T) {
	for _, d := range []Durability{Sync, CAD, Async} {
		got, err := ParseDurability(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDurability(%q) = %v, %v", d.String(), got, err)
		}
	}
	if _, err := ParseDurability("fsync"); !errors.Is(err, ErrUnknownLevel) {
		t.Errorf("ParseDurability(fsync) err = %v; want ErrUnknownLevel", err)
	}
}
