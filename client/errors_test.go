package client

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kefirdb/kefir/internal/shard"
)

// The client recognizes the server's reply for a session that saw lost writes
// by its text, so the test builds that reply from the server's own error.
func TestSessionLostReplyMatchesSentinel(t *testing.T) {
	reply := "ERR " + fmt.Errorf("%w: it saw version 7, and versions 5 to 9 were lost", shard.ErrSessionLost).Error()
	err := error(serverError([]byte(reply)))
	if !errors.Is(err, ErrSessionLost) {
		t.Fatalf("%q does not match ErrSessionLost", reply)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Fatalf("a lost session must not look retryable")
	}
	if errors.Is(serverError([]byte("ERR session token is ahead")), ErrSessionLost) {
		t.Fatal("an unrelated -ERR matched ErrSessionLost")
	}
}
