package runtime_test

import (
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
)

// The runtime contract sits below the fleet: the contract itself, the
// runtime that implements it and the store the fleet keeps records in must
// never import the fleet (a cycle waiting to happen, and the reason this
// package exists).
func TestNothingBelowImportsFleet(t *testing.T) {
	goBin := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil { // GOROOT is empty in a -trimpath build
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("go tool not found: %v", err)
		}
	}
	const fleet = "github.com/forkfleet/forkfleet/controld/internal/fleet"
	for _, pkg := range []string{".", "../containerdrt", "../store"} {
		out, err := exec.Command(goBin, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == fleet || strings.HasPrefix(dep, fleet+"/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
