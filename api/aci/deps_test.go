package aci_test

import (
	"os/exec"
	"strings"
	"testing"
)

// guestd links api/aci; it must not drag in gRPC's client or server
// machinery (only the status/codes packages api/errdefs uses).
func TestNoGRPCTransport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "google.golang.org/grpc" || strings.HasPrefix(dep, "google.golang.org/grpc/internal/transport") ||
			strings.HasPrefix(dep, "golang.org/x/net/http2") {
			t.Errorf("api/aci depends on %s", dep)
		}
	}
}
