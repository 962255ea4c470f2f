package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDependencies keeps guestd small (tailscale depaware style): it runs in
// every sandbox, so container-runtime and gRPC server code must never creep
// into its dependency graph. The api module does depend on gRPC for
// controld; guestd may import only its ACI protobuf package.
func TestDependencies(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatalf("go tool not found: %v", err)
		}
	}
	cmd := exec.Command(goBin, "list", "-deps", ".")
	cmd.Env = append(cmd.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"github.com/containerd/", "google.golang.org/grpc", "github.com/opencontainers/", "github.com/docker/"}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				bad = append(bad, pkg)
			}
		}
	}
	if len(bad) > 0 {
		t.Fatalf("guestd must not depend on:\n  %s", strings.Join(bad, "\n  "))
	}
	if !strings.Contains(string(out), "github.com/coder/websocket") {
		t.Fatalf("sanity: websocket not in the dependency list:\n%s", out)
	}
}
