package main

import (
	"os/exec"
	"strings"
	"testing"
)

// `make up` builds bin/kefir with progress before it runs it (issue 25 item
// 13): it used to be `go run ./cmd/kefir up`, silent for a minute on a cold
// build cache.
func TestMakeUpBuildsFirst(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	out, err := exec.Command("make", "-n", "-C", "../..", "up").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n up: %v\n%s", err, out)
	}
	recipe := string(out)
	build := strings.Index(recipe, "build -v -o bin/kefir ./cmd/kefir")
	run := strings.Index(recipe, "./bin/kefir up")
	if build < 0 || run < 0 || build > run || strings.Contains(recipe, "go run") {
		t.Errorf("make up should build bin/kefir with progress, then run it; it runs:\n%s", recipe)
	}
}
