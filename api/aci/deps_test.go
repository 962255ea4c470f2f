package aci_test

import (
	"os/exec"
	"strings"
	"testing"
)

// guestd links api/aci and api/errdefs; neither may drag in gRPC (the
// conversion of error classes to gRPC status lives in api/errdefs/errgrpc).
func TestNoGRPCTransport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".", "../errdefs").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "google.golang.org/grpc") || strings.HasPrefix(dep, "google.golang.org/genproto") ||
			strings.HasPrefix(dep, "golang.org/x/net/http2") {
			t.Errorf("api/aci or api/errdefs depends on %s", dep)
		}
	}
}
