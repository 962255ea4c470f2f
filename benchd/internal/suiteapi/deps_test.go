package suiteapi_test

import (
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
)

// The suites' contract sits below the suites and the runner that drives
// them: it must never import either (as controld's runtime contract never
// imports the fleet).
func TestContractImportsNoSuite(t *testing.T) {
	goBin := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil { // GOROOT is empty in a -trimpath build
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("go tool not found: %v", err)
		}
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, above := range []string{"benchd/internal/suites", "benchd/internal/runner", "benchd/cmd/"} {
			if strings.HasPrefix(dep, "github.com/forkfleet/forkfleet/"+above) {
				t.Errorf("the suites' contract depends on %s", dep)
			}
		}
	}
}
