package client

import "testing"

// The slots Redis Cluster's spec gives (and kv.KeySlot computes).
func TestKeySlot(t *testing.T) {
	for k, want := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "": 0, "a{}b": 13694} {
		if got := keySlot(k); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", k, got, want)
		}
	}
}
