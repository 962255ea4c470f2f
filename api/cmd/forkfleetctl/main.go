// Command forkfleetctl drives controld from a shell: every RPC of its gRPC
// API (sandbox, checkpoint and pool commands), screenshots, and `demo`, the
// whole loop in one go. Output is a table for people or JSON (-o json: the
// RPC's response message, protojson) for scripts.
//
// Exit status: 0 on success (and for --help), 1 when controld or a sandbox
// refused or failed a request, 2 on a usage error (unknown command or flag, a
// missing or malformed argument).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/forkfleet/forkfleet/api/client"
)

// version is set at link time (make build: -X main.version=$(git describe)).
var version = "dev"

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError marks an error as the caller's (exit status 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{ctx: ctx, stdout: stdout, stderr: stderr}
	defer g.close()
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "forkfleetctl:", err)
	var ue usageError
	if errors.As(err, &ue) {
		if cmd != nil {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return exitUsage
	}
	return exitError
}

// globals are the flags every command takes and the client they dial.
type globals struct {
	ctx            context.Context
	stdout, stderr io.Writer

	address, tokenFile     string
	tlsCA, tlsCert, tlsKey string
	insecure               bool
	forkRegistry           string
	output                 string
	c                      *client.Client
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "forkfleetctl",
		Short: "Drive controld: sandboxes, checkpoints and forks, warm pools",
		Long: `forkfleetctl talks to controld's gRPC API.

ADDR is unix:///run/forkfleet/controld.sock (the default) or HOST:PORT; a comma-separated list
or dns:///NAME:PORT drives many hosts at once (new sandboxes where the room is, every
later command to the host holding the sandbox, lists over every host). A HOST:PORT
that is not the loopback needs TLS (--tls-ca: the CA of controld's certificate;
--tls-cert/--tls-key: a client certificate when controld asks for one), or
--insecure to send the token in plaintext on a network you trust.

-o json prints the RPC's response as protojson (one object per line for watch).`,
		Version:           version,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              usageArgs(cobra.NoArgs),
		RunE:              needSubcommand,
		PersistentPreRunE: g.validateOutput,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.address, "address", client.DefaultAddress, "controld address: unix:///PATH or HOST:PORT; several, comma-separated, or dns:///NAME:PORT for every address NAME resolves to (many hosts)")
	pf.StringVar(&g.tokenFile, "token-file", "", "bearer token file for TCP addresses (default: controld's "+client.DefaultTokenFile+")")
	pf.StringVar(&g.tlsCA, "tls-ca", "", "PEM CA bundle: speak TLS to a TCP address and verify controld's certificate with it")
	pf.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate (mutual TLS; with --tls-key)")
	pf.StringVar(&g.tlsKey, "tls-key", "", "PEM key of --tls-cert")
	pf.StringVar(&g.forkRegistry, "fork-registry", "", "with many hosts: an OCI repository through which checkpoint fork spreads replicas over every host with room")
	pf.BoolVar(&g.insecure, "insecure", false, "send the token in plaintext to a TCP address that is not the loopback")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddGroup(&cobra.Group{ID: "api", Title: "API commands:"})
	for _, c := range []*cobra.Command{sandboxCmd(g), checkpointCmd(g), poolCmd(g), hostCmd(g), recordingCmd(g)} {
		c.GroupID = "api"
		root.AddCommand(c)
	}
	root.AddCommand(demoCmd(g), versionCmd(g))
	root.SetHelpCommandGroupID("")
	root.SetCompletionCommandGroupID("")
	return root
}

func (g *globals) validateOutput(*cobra.Command, []string) error {
	switch g.output {
	case "table", "json":
		return nil
	}
	return usagef("--output %q: want table or json", g.output)
}

// needSubcommand is the RunE of commands that only group others: called
// bare, they print their help and fail as a usage error.
func needSubcommand(cmd *cobra.Command, _ []string) error {
	_ = cmd.Usage() // to stderr
	return usagef("%s needs a subcommand", cmd.CommandPath())
}

// usageArgs marks an argument validator's errors as usage errors.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

// group is a command that holds subcommands.
func group(use, short string, aliases ...string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Aliases: aliases, Args: usageArgs(cobra.NoArgs), RunE: needSubcommand}
}

// client dials controld once per invocation (lazily: help, completion
// scripts and version never dial).
func (g *globals) client() (*client.Client, error) {
	if g.c != nil {
		return g.c, nil
	}
	var opts []client.Option
	remote := slices.ContainsFunc(strings.Split(g.address, ","), func(a string) bool { return !strings.HasPrefix(a, "unix:") })
	if remote {
		tf := g.tokenFile
		if tf == "" {
			tf = client.DefaultTokenFile
		}
		opts = append(opts, client.WithTokenFile(tf))
		if g.insecure {
			opts = append(opts, client.WithInsecure())
		}
		if g.tlsCA != "" {
			cfg, err := tlsConfig(g.tlsCA, g.tlsCert, g.tlsKey)
			if err != nil {
				return nil, usageError{err}
			}
			opts = append(opts, client.WithTLS(cfg))
		}
	}
	var c *client.Client
	var err error
	if targets := strings.Split(g.address, ","); len(targets) > 1 || strings.HasPrefix(g.address, "dns:") {
		// Many hosts: placed and routed as the client does (controld/docs/hosts.md).
		if g.forkRegistry != "" {
			opts = append(opts, client.WithCheckpointRegistry(g.forkRegistry))
		}
		c, err = client.DialHosts(g.ctx, targets, opts...)
	} else {
		c, err = client.Dial(g.ctx, g.address, opts...)
	}
	if err != nil {
		return nil, err
	}
	g.c = c
	return c, nil
}

func (g *globals) close() {
	if g.c != nil {
		g.c.Close()
	}
}

// tlsConfig trusts the CAs in caFile and, given certFile and keyFile,
// presents that client certificate.
func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	cfg := &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", caFile)
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print forkfleetctl's version",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(g.stdout, version)
			return err
		},
	}
}
