// Command forkfleet-nethook is the createRuntime hook runc runs for every
// sandbox once it has made the sandbox's namespaces: at a boot (runc
// create) and at a memory-tier restore (on CRIU's setup-namespaces
// notification, before any restored process runs). It makes the network
// namespace runc or CRIU just made, inside the sandbox's user namespace,
// the sandbox's network as controld prepared it (see network.Attach):
//
//	forkfleet-nethook -pin /run/forkfleet/net/<ns>/ns/<id> [-router /run/forkfleet/net/<ns>/ns/<id>.rt]
//
// runc writes the OCI state (the process's pid) on its stdin and reports
// its stderr when it fails. controld finds it beside its own binary.
package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/forkfleet/forkfleet/controld/internal/network"
)

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println("forkfleet-nethook", version)
		return
	}
	// One thread does it all: Attach enters namespaces on threads it locks.
	runtime.GOMAXPROCS(1)
	if err := network.RunHook(os.Args[1:], os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "forkfleet-nethook:", err)
		os.Exit(1)
	}
}
