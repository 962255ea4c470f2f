package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func sandboxCmd(g *globals) *cobra.Command {
	c := group("sandbox", "Boot, inspect, change and remove sandboxes (SandboxService)", "sb", "sandboxes")
	c.AddCommand(
		sandboxCreateCmd(g), sandboxGetCmd(g), sandboxListCmd(g), sandboxDeleteCmd(g), sandboxWaitCmd(g),
		sandboxWatchCmd(g), sandboxEndpointCmd(g), sandboxSuspendCmd(g), sandboxResumeCmd(g), sandboxVerifyCmd(g),
		sandboxNetworkCmd(g), sandboxExposeCmd(g), sandboxUnexposeCmd(g), sandboxScreenshotCmd(g), sandboxExtendCmd(g), sandboxViewCmd(g),
	)
	return c
}

func sandboxCreateCmd(g *globals) *cobra.Command {
	var (
		image, screen, requestID string
		ttl                      time.Duration
		root, noWait             bool
		egress                   bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Boot a sandbox (CreateSandbox); waits until it is usable unless --no-wait",
		Args:  usageArgs(cobra.NoArgs),
	}
	fs := cmd.Flags()
	fs.StringVar(&image, "image", "", "image in controld's containerd namespace (default: the desktop)")
	fs.StringVar(&screen, "screen", "", "screen WxH or WxHxDEPTH (default 1280x800x24)")
	fs.DurationVar(&ttl, "ttl", 0, "delete the sandbox this long after creation")
	fs.BoolVar(&root, "root", false, "run exec, launch and the session apps as root (default: the image's unprivileged user)")
	fs.BoolVar(&noWait, "no-wait", false, "return once the sandbox is created, before it is usable")
	fs.BoolVar(&egress, "egress", false, "network mode egress: the outside through NAT, under --allow/--deny (default: loopback only)")
	fs.StringVar(&requestID, "request-id", "", "makes the call idempotent: a repeat with the same id returns the same sandbox (default: a fresh id)")
	labels := addKeyValues(fs, "label", "label of the sandbox")
	env := addKeyValues(fs, "env", "environment variable of the session")
	res := addResourceFlags(fs)
	pol := addPolicyFlags(fs)
	cmd.RunE = func(*cobra.Command, []string) error {
		opts := []client.CreateOption{}
		if !noWait {
			opts = append(opts, client.WithWaitReady())
		}
		if root {
			opts = append(opts, client.WithRunAsRoot())
		}
		if image != "" {
			opts = append(opts, client.WithImage(image))
		}
		if ttl != 0 {
			opts = append(opts, client.WithTTL(ttl))
		}
		if requestID != "" {
			opts = append(opts, client.WithRequestID(requestID))
		}
		spec, err := specOptions(screen, labels, res)
		if err != nil {
			return err
		}
		for _, o := range spec {
			opts = append(opts, o)
		}
		e, err := env.Map()
		if err != nil {
			return err
		}
		if e != nil {
			opts = append(opts, client.WithEnv(e))
		}
		netOpt, err := networkOption(egress, pol)
		if err != nil {
			return err
		}
		if netOpt != nil {
			opts = append(opts, netOpt)
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		sb, err := c.CreateSandbox(g.ctx, opts...)
		if err != nil {
			return err
		}
		ep, err := sb.Endpoint(g.ctx)
		if err != nil {
			return err
		}
		return g.emit(&controldv1.CreateSandboxResponse{Sandbox: sb.Info(), Endpoint: ep}, func(w io.Writer) {
			sandboxDetail(w, sb.Info(), ep)
		})
	}
	return cmd
}

func sandboxGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "get ID",
		Short:             "Show a sandbox (GetSandbox)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Sandbox(args[0]).Get(g.ctx)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.GetSandboxResponse{Sandbox: info}, func(w io.Writer) { sandboxDetail(w, info, nil) })
		},
	}
}

func sandboxListCmd(g *globals) *cobra.Command {
	var states []string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sandboxes, oldest first (ListSandboxes)",
		Args:  usageArgs(cobra.NoArgs),
	}
	fs := cmd.Flags()
	pg := addPageFlags(fs)
	fs.StringArrayVar(&states, "state", nil, "only sandboxes in this state (repeatable: any of them)")
	labels := addKeyValues(fs, "label", "only sandboxes with this label")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(sortedNames(stateByName), cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(*cobra.Command, []string) error {
		l, err := labels.Map()
		if err != nil {
			return err
		}
		st, err := parseEnums("state", states, stateByName)
		if err != nil {
			return err
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		opts := []client.ListOption{client.WithLabels(l), client.WithStates(st...)}
		sbs, next, err := pages(pg, func(token string) ([]*controldv1.Sandbox, string, error) {
			return c.ListSandboxesPage(g.ctx, token, append(opts, pg.option())...)
		})
		if err != nil {
			return err
		}
		return g.emit(&controldv1.ListSandboxesResponse{Sandboxes: sbs, NextPageToken: next}, func(w io.Writer) {
			sandboxRows(w, sbs)
			pageFooter(w, next)
		})
	}
	return cmd
}

func sandboxDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "delete ID...",
		Short:             "Delete sandboxes (DeleteSandbox)",
		Args:              usageArgs(cobra.MinimumNArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.Sandbox(id).Delete(g.ctx); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				if err := g.emit(&controldv1.DeleteSandboxResponse{}, func(w io.Writer) { fmt.Fprintln(w, "deleted", id) }); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func sandboxWaitCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:               "wait ID",
		Short:             "Wait until a sandbox is usable (WaitSandboxReady)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var opts []client.WaitOption
			if timeout > 0 {
				opts = append(opts, client.WithTimeout(timeout))
			}
			info, err := c.Sandbox(args[0]).WaitReady(g.ctx, opts...)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.WaitSandboxReadyResponse{Sandbox: info}, func(w io.Writer) { sandboxDetail(w, info, nil) })
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "server-side bound of the wait (default 60s)")
	return cmd
}

func sandboxWatchCmd(g *globals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:               "watch [ID...]",
		Short:             "Stream sandbox lifecycle events, the current state of each first (WatchSandboxes); Ctrl-C ends it",
		Args:              usageArgs(cobra.ArbitraryArgs),
		ValidArgsFunction: g.completeSandboxes,
	}
	labels := addKeyValues(cmd.Flags(), "label", "only sandboxes with this label")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many events (0: until interrupted)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		l, err := labels.Map()
		if err != nil {
			return err
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		const row = "%-12s  %-8s  %-28s  %-9s  %s\n"
		if g.output != "json" {
			fmt.Fprintf(g.stdout, row, "TIME", "EVENT", "SANDBOX", "STATE", "PHASE")
		}
		n := 0
		for ev, err := range c.Watch(g.ctx, client.WithIDs(args...), client.WithLabels(l)) {
			if err != nil {
				return err
			}
			if g.output == "json" {
				if err := g.emitJSON(ev, false); err != nil {
					return err
				}
			} else {
				phase := ""
				if p := ev.GetPhase(); p != nil {
					phase = p.GetName() + " " + ms(p.GetAt().AsDuration())
				}
				fmt.Fprintf(g.stdout, row, time.Now().Format("15:04:05.000"),
					enumShort(ev.GetType().String(), "SANDBOX_EVENT_TYPE_"), ev.GetSandbox().GetId(),
					stateName(ev.GetSandbox().GetState()), dash(phase))
			}
			if n++; count > 0 && n >= count {
				return nil
			}
		}
		return nil
	}
	return cmd
}

func sandboxEndpointCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "endpoint ID",
		Short:             "Show where and how to reach a sandbox's ACI (GetSandboxEndpoint)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ep, err := c.Sandbox(args[0]).RefreshEndpoint(g.ctx)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.GetSandboxEndpointResponse{Endpoint: ep}, func(w io.Writer) {
				fmt.Fprintf(w, "aci\t%s\ntoken\t%s\nunix\t%s\n", ep.GetUrl(), ep.GetToken(), dash(ep.GetUnixPath()))
			})
		},
	}
}

func sandboxSuspendCmd(g *globals) *cobra.Command {
	return sandboxStateCmd(g, "suspend", "Freeze every process of a sandbox (SuspendSandbox)", func(sb *client.Sandbox) (proto.Message, error) {
		err := sb.Suspend(g.ctx)
		return &controldv1.SuspendSandboxResponse{Sandbox: sb.Info()}, err
	})
}

func sandboxResumeCmd(g *globals) *cobra.Command {
	return sandboxStateCmd(g, "resume", "Thaw a suspended sandbox (ResumeSandbox)", func(sb *client.Sandbox) (proto.Message, error) {
		err := sb.Resume(g.ctx)
		return &controldv1.ResumeSandboxResponse{Sandbox: sb.Info()}, err
	})
}

// sandboxStateCmd is suspend or resume: one call on a sandbox, its new
// state printed.
func sandboxStateCmd(g *globals, verb, short string, call func(*client.Sandbox) (proto.Message, error)) *cobra.Command {
	return &cobra.Command{
		Use:               verb + " ID",
		Short:             short,
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			resp, err := call(sb)
			if err != nil {
				return err
			}
			return g.emit(resp, func(w io.Writer) { sandboxDetail(w, sb.Info(), nil) })
		},
	}
}

func sandboxVerifyCmd(g *globals) *cobra.Command {
	var levels []string
	cmd := &cobra.Command{
		Use:               "verify ID",
		Short:             "Check a forked sandbox against its checkpoint's proofs (VerifySandbox)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
	}
	cmd.Flags().StringArrayVar(&levels, "level", nil, "verify at this level (repeatable; default: all the checkpoint supports)")
	_ = cmd.RegisterFlagCompletionFunc("level", cobra.FixedCompletions(sortedNames(levelByName), cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		ls, err := parseEnums("level", levels, levelByName)
		if err != nil {
			return err
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		res, err := c.Sandbox(args[0]).Verify(g.ctx, ls...)
		if err != nil {
			return err
		}
		if err := g.emit(&controldv1.VerifySandboxResponse{Results: res}, func(w io.Writer) { verifyRows(w, res) }); err != nil {
			return err
		}
		for _, r := range res {
			if !r.GetOk() {
				return fmt.Errorf("verification failed at level %s: %s", levelName(r.GetLevel()), r.GetDetail())
			}
		}
		return nil
	}
	return cmd
}

func sandboxNetworkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "network ID",
		Short:             "Replace a running egress sandbox's network policy (UpdateSandboxNetwork); no rules: allow all",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
	}
	pol := addPolicyFlags(cmd.Flags())
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		p, err := pol.Policy()
		if err != nil {
			return err
		}
		if p == nil {
			p = &controldv1.NetworkPolicy{}
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		sb := c.Sandbox(args[0])
		if err := sb.UpdateNetwork(g.ctx, p); err != nil {
			return err
		}
		return g.emit(&controldv1.UpdateSandboxNetworkResponse{Sandbox: sb.Info()}, func(w io.Writer) { sandboxDetail(w, sb.Info(), nil) })
	}
	return cmd
}

func parsePort(s string) (int, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, usagef("port %q: want 1..65535", s)
	}
	return int(p), nil
}

func sandboxExposeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "expose ID PORT",
		Short:             "Make a TCP port inside a sandbox reachable through controld's gateway (ExposePort)",
		Args:              usageArgs(cobra.ExactArgs(2)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			url, token, err := c.Sandbox(args[0]).ExposePort(g.ctx, port)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.ExposePortResponse{Url: url, Token: token}, func(w io.Writer) {
				fmt.Fprintf(w, "url\t%s\ntoken\t%s\n", url, token)
			})
		},
	}
}

func sandboxUnexposeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "unexpose ID PORT",
		Short:             "Close an exposed port (UnexposePort)",
		Args:              usageArgs(cobra.ExactArgs(2)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Sandbox(args[0]).UnexposePort(g.ctx, port); err != nil {
				return err
			}
			return g.emit(&controldv1.UnexposePortResponse{}, func(w io.Writer) { fmt.Fprintf(w, "unexposed %s port %d\n", args[0], port) })
		},
	}
}

func sandboxScreenshotCmd(g *globals) *cobra.Command {
	var (
		quality int
		file    string
	)
	cmd := &cobra.Command{
		Use:               "screenshot ID",
		Short:             "Save a screenshot of a sandbox (over its ACI session)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			if quality < 0 || quality > 100 {
				return usagef("--jpeg %d: want a quality in 1..100", quality)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Sandbox(args[0]).ACI(g.ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			req, ext := aci.PNG(), ".png"
			if quality > 0 {
				req, ext = aci.JPEG(quality), ".jpg"
			}
			shot, err := s.Screenshot(g.ctx, req)
			if err != nil {
				return err
			}
			name := file
			if name == "" {
				name = args[0] + ext
			}
			if err := os.WriteFile(name, shot.GetData(), 0o644); err != nil {
				return err
			}
			if g.output == "json" {
				meta := proto.CloneOf(shot)
				meta.Data = nil // in the file
				return g.emitJSON(meta, true)
			}
			_, err = fmt.Fprintf(g.stdout, "%s: %dx%d, %d bytes, frame %x\n", name, shot.GetWidth(), shot.GetHeight(), len(shot.GetData()), shot.GetFrameHash())
			return err
		},
	}
	cmd.Flags().IntVar(&quality, "jpeg", 0, "JPEG quality 1..100 (default: PNG)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "output file (default ID.png or ID.jpg)")
	return cmd
}

func (g *globals) completeSandboxes(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	return complete(g, args, func(c *client.Client) ([]*controldv1.Sandbox, error) { return c.ListSandboxes(g.ctx) },
		func(sb *controldv1.Sandbox) string {
			return sb.GetId() + "\t" + stateName(sb.GetState()) + " " + sb.GetImage()
		})
}

// specOptions are the options CreateSandbox and CreatePool share: screen,
// labels, resources.
func specOptions(screen string, labels *keyValues, res *resourceFlags) ([]interface {
	client.CreateOption
	client.PoolOption
}, error) {
	var out []interface {
		client.CreateOption
		client.PoolOption
	}
	if screen != "" {
		s, err := parseScreen(screen)
		if err != nil {
			return nil, err
		}
		out = append(out, client.WithScreen(int(s.GetWidth()), int(s.GetHeight()), int(s.GetDepth())))
	}
	l, err := labels.Map()
	if err != nil {
		return nil, err
	}
	if l != nil {
		out = append(out, client.WithLabels(l))
	}
	r, err := res.Resources()
	if err != nil {
		return nil, err
	}
	if r != nil {
		out = append(out, client.WithResources(r))
	}
	return out, nil
}

// networkOption is --egress with its --allow/--deny rules (nil: mode none).
func networkOption(egress bool, pol *policyFlags) (client.NetworkOption, error) {
	policy, err := pol.Policy()
	if err != nil {
		return nil, err
	}
	if policy != nil && !egress {
		return nil, usagef("--allow and --deny need --egress")
	}
	if !egress {
		return nil, nil
	}
	return client.WithEgress(policy), nil
}

func sandboxViewCmd(g *globals) *cobra.Command {
	var control bool
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:               "view ID [--control] [--ttl DURATION]",
		Short:             "Print a single-use URL of the sandbox's live view in a browser (CreateViewTicket)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			if ttl < 0 {
				return usagef("--ttl %v: want a positive duration", ttl)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			url, expires, err := c.Sandbox(args[0]).ViewTicket(g.ctx, control, ttl)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.CreateViewTicketResponse{Url: url, ExpiresAt: timestamppb.New(expires)}, func(w io.Writer) {
				fmt.Fprintf(w, "url\t%s\nexpires\t%s\n", url, expires.Format(time.RFC3339))
			})
		},
	}
	cmd.Flags().BoolVar(&control, "control", false, "the viewer may send mouse and keyboard input")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the URL can be opened (60s when 0, at most 10m)")
	return cmd
}

func enumShort(name, prefix string) string { return strings.ToLower(strings.TrimPrefix(name, prefix)) }

func sandboxExtendCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:               "extend ID --ttl DURATION",
		Short:             "Set when a sandbox is deleted: --ttl from now (ExtendSandbox)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
		RunE: func(_ *cobra.Command, args []string) error {
			if ttl <= 0 {
				return usagef("--ttl %v: want a positive duration, e.g. 2h", ttl)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			if err := sb.Extend(g.ctx, ttl); err != nil {
				return err
			}
			return g.emit(&controldv1.ExtendSandboxResponse{Sandbox: sb.Info()}, func(w io.Writer) { sandboxDetail(w, sb.Info(), nil) })
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "delete the sandbox this long from now (required)")
	return cmd
}
