// Command guestd is forkfleet's in-sandbox agent: the container's init
// (PID 1) and the server of the Agent-Computer Interface. See
// docs/aci-spec.md for the protocol and internal/guestd for the wiring.
package main

import (
	"os"

	"github.com/forkfleet/forkfleet/guestd/internal/guestd"
)

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

func main() {
	guestd.Version = version
	os.Exit(guestd.Main())
}
