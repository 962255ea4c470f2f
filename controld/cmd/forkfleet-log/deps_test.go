package main

import (
	"os/exec"
	"strings"
	"testing"
)

// One forkfleet-log runs beside every sandbox: it links the standard
// library and its own package only, so it starts in a millisecond and holds
// little memory.
func TestSmallBinary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case "github.com/forkfleet/forkfleet/controld/cmd/forkfleet-log", "github.com/forkfleet/forkfleet/controld/internal/sandboxlog":
		default:
			t.Errorf("forkfleet-log depends on %s", dep)
		}
	}
}
