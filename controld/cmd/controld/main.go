// Command controld is forkfleet's host daemon: the gRPC API for sandboxes,
// checkpoints/forks and warm pools, the ACI gateway, metrics and traces.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/containerdrt"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

func main() {
	if err := run(); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "controld:", err)
		os.Exit(1)
	}
}

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

func run() error {
	cfg, flags, err := config.LoadArgs(os.Args[1:], os.Getenv)
	if err != nil {
		return err
	}
	if flags.Version {
		fmt.Println("controld", version)
		return nil
	}
	app.Version = version
	if flags.PrintConfig {
		b, err := cfg.Marshal()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	}
	log, err := app.NewLogger(cfg.Log, os.Stderr)
	if err != nil {
		return err
	}
	// The runtime (and CRIU's log level with it) follows the default.
	slog.SetDefault(log)
	if flags.ConfigFile != "" {
		log.Info("configuration", "file", flags.ConfigFile)
	} else {
		log.Info("configuration", "file", "none: built-in defaults", "default_file", config.DefaultFile)
	}

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logWriter, err := containerdrt.LogWriterPath(exe)
	if err != nil {
		return err
	}
	netHook, err := containerdrt.NetHookPath(exe)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	upstreams, err := cfg.Network.Upstreams()
	if err != nil {
		return err
	}
	nm, err := network.New(network.Config{
		// Per containerd namespace: a second controld on the host (another
		// namespace) keeps its sandboxes' network state apart.
		RunDir: filepath.Join(cfg.Network.RunDir, cfg.Containerd.Namespace), Table: cfg.Network.Table, IfPrefix: cfg.Network.IfPrefix,
		UplinkCIDR: netip.MustParsePrefix(cfg.Network.UplinkCIDR), MTU: cfg.Network.MTU,
		DNSUpstream: upstreams, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	// Last to go: sandboxes keep their networks; the DNS stubs stop.
	defer nm.Close()
	var ranges *userns.Pool
	if cfg.UserNS.Enabled {
		if ranges, err = userns.Load(userns.Config{}); err != nil {
			return fmt.Errorf("userns: %w (or userns.enabled = false)", err)
		}
	}
	rt, err := containerdrt.New(ctx, containerdrt.Config{
		LogWriter:      logWriter,
		NetHook:        netHook,
		LayersDir:      cfg.LayersDir,
		Address:        cfg.Containerd.Address,
		Namespace:      cfg.Containerd.Namespace,
		CgroupParent:   cfg.Containerd.CgroupParent,
		CheckpointRoot: cfg.CheckpointDir,
		// Per controld: its CRIU config, logs and work dirs are its own.
		StateDir:       filepath.Join(cfg.StateDir, "runtime"),
		Network:        nm,
		UserNamespaces: ranges,
		Registry: containerdrt.RegistryConfig{DockerConfig: cfg.Registry.DockerConfig, PlainHTTP: cfg.Registry.PlainHTTP,
			PartSize: int64(cfg.Registry.PartSize)},
	})
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	defer rt.Close()
	return app.Run(ctx, cfg, app.Deps{Runtime: rt, Logger: log})
}
