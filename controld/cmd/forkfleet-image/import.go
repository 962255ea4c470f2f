package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/forkfleet/forkfleet/controld/internal/imageimport"
)

const (
	defaultAddress     = "/run/forkfleet/containerd/containerd.sock"
	defaultNamespace   = "forkfleet"
	defaultSnapshotter = "overlayfs"
)

type importOpts struct {
	address string
	imageimport.Options
}

func parseImport(args []string) (importOpts, error) {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	o := importOpts{}
	def := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS")
	if def == "" {
		def = defaultAddress
	}
	noUnpack := false
	fs.StringVar(&o.address, "address", def, "containerd socket (default $FORKFLEET_CONTAINERD_ADDRESS or "+defaultAddress+")")
	fs.StringVar(&o.Namespace, "namespace", defaultNamespace, "containerd namespace")
	fs.StringVar(&o.Snapshotter, "snapshotter", defaultSnapshotter, "snapshotter to unpack into")
	fs.BoolVar(&noUnpack, "no-unpack", false, "import content only, do not unpack")
	fs.BoolVar(&o.Force, "force", false, "import even if containerd has the same manifest already")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	if fs.NArg() != 1 {
		return o, fmt.Errorf("%w: import takes one layout directory", errUsage)
	}
	o.Layout = fs.Arg(0)
	o.Unpack = !noUnpack
	return o, nil
}

func cmdImport(ctx context.Context, args []string) error {
	o, err := parseImport(args)
	if err != nil {
		return err
	}
	c, err := containerd.New(o.address, containerd.WithDefaultNamespace(o.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", o.address, err)
	}
	defer c.Close()
	res, err := imageimport.Import(ctx, c, o.Options)
	for _, r := range res {
		fmt.Println(r)
	}
	return err
}
