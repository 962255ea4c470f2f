// Command forkfleet-image builds forkfleet's sandbox images as OCI image
// layouts without Docker and imports them into containerd.
//
//	forkfleet-image build --base rootfs.tar --add /usr/local/bin/guestd=./guestd \
//	    --entrypoint /usr/local/bin/guestd --env HOME=/root --name localhost/forkfleet/desktop:latest --out DIR
//	forkfleet-image import --address /run/forkfleet/containerd/containerd.sock --namespace forkfleet DIR
//	forkfleet-image validate DIR
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const usage = `usage:
  forkfleet-image build    --base ROOTFS.tar [--add DEST=SRC]... --entrypoint ARG [--entrypoint ARG]...
                           [--cmd ARG]... [--env K=V]... [--workdir DIR] [--label K=V]...
                           --name REF --out DIR
  forkfleet-image import   [--address SOCK] [--namespace NS] [--snapshotter NAME] [--no-unpack] [--force] DIR
  forkfleet-image validate DIR
  forkfleet-image version
`

// errUsage marks command-line mistakes (exit status 2).
var errUsage = errors.New("usage error")

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "forkfleet-image: %v\n", err)
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no command", errUsage)
	}
	switch args[0] {
	case "build":
		return cmdBuild(ctx, args[1:])
	case "import":
		return cmdImport(ctx, args[1:])
	case "validate":
		return cmdValidate(args[1:])
	case "version", "--version":
		fmt.Println("forkfleet-image", version)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	default:
		return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseFlags parses fs and turns flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(discard{})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(usage)
			os.Exit(0)
		}
		return fmt.Errorf("%w: %s: %v", errUsage, fs.Name(), err)
	}
	return nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
