package keyslot

import "testing"

// The slots Redis Cluster's spec and redis-cli give, for strings and for
// byte slices alike.
func TestOf(t *testing.T) {
	for k, want := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443,
		"{user1000}.followers": 3443, "": 0, "a{}b": 13694, "{}": 15257, "{a": 10276, "x{a}y{b}": 15495} {
		if got := Of(k); got != want {
			t.Errorf("Of(%q) = %d, want %d", k, got, want)
		}
		if got := Of([]byte(k)); got != want {
			t.Errorf("Of([]byte(%q)) = %d, want %d", k, got, want)
		}
	}
}

func TestHashTag(t *testing.T) {
	for k, want := range map[string]string{"{user}.a": "user", "a{}b": "a{}b", "{a": "{a", "x{a}y{b}": "a", "}{a}": "a", "plain": "plain"} {
		if got := HashTag(k); got != want {
			t.Errorf("HashTag(%q) = %q, want %q", k, got, want)
		}
	}
}
