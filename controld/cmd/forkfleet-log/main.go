// Command forkfleet-log is the logging binary containerd's runc shim starts
// for every sandbox task (controld hands the shim a binary:// stdio URI
// naming it): it keeps the task's stdout and stderr on the host within a
// byte budget (see package sandboxlog).
//
//	forkfleet-log -path /var/lib/forkfleet/controld/runtime/logs/<id>.log -max 8388608
//
// The shim passes the stdout and stderr pipes as fds 3 and 4 and waits for
// a byte on fd 5 before it starts the task (the binary-v2 scheme: a writer
// that cannot open its log fails the task's creation instead of leaving the
// sandbox writing into pipes nobody reads). The flags come in any order (the
// shim builds them from a URI query). It runs for as long as the pipes have
// a writer, at a low CPU priority: it costs the host, not the sandbox.
package main

import (
	"flag"
	"fmt"
	"os"
	"syscall"

	"github.com/forkfleet/forkfleet/controld/internal/sandboxlog"
)

// The file descriptors containerd's shim hands a logging binary.
const (
	stdoutFD = 3
	stderrFD = 4
	readyFD  = 5
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "forkfleet-log:", err)
		os.Exit(1)
	}
}

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

func run() error {
	path := flag.String("path", "", "log file (its older half goes to <path>.1)")
	budget := flag.Int64("max", 0, "bytes kept, both files together")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("forkfleet-log", version)
		return nil
	}
	if *path == "" || *budget < sandboxlog.MinBudget {
		return fmt.Errorf("need -path and -max >= %d", sandboxlog.MinBudget)
	}
	// A flood of output costs this process CPU: let the host's own work
	// come first.
	syscall.Setpriority(syscall.PRIO_PROCESS, 0, 10) //nolint:errcheck // best effort
	w, err := sandboxlog.Open(*path, *budget)
	if err != nil {
		return err
	}
	defer w.Close()
	stdout := os.NewFile(stdoutFD, "stdout")
	stderr := os.NewFile(stderrFD, "stderr")
	ready := os.NewFile(readyFD, "ready")
	if _, err := ready.Write([]byte{1}); err != nil {
		return fmt.Errorf("signal ready: %w", err)
	}
	ready.Close()
	sandboxlog.Drain(w, stdout, stderr)
	return nil
}
