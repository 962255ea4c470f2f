package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func poolCmd(g *globals) *cobra.Command {
	c := group("pool", "Keep warm sandboxes ready to claim (PoolService)", "pl", "pools")
	c.AddCommand(poolCreateCmd(g), poolGetCmd(g), poolListCmd(g), poolDeleteCmd(g), poolClaimCmd(g), poolResizeCmd(g))
	return c
}

func poolCreateCmd(g *globals) *cobra.Command {
	var (
		image, checkpoint, screen string
		size                      int
		egress                    bool
	)
	cmd := &cobra.Command{
		Use:   "create NAME --size N (--image REF | --checkpoint CK)",
		Short: "Create a warm pool of an image or of a checkpoint (CreatePool)",
		Args:  usageArgs(cobra.ExactArgs(1)),
	}
	fs := cmd.Flags()
	fs.IntVar(&size, "size", 0, "warm sandboxes to keep (required)")
	fs.StringVar(&image, "image", "", "boot the members from this image")
	fs.StringVar(&checkpoint, "checkpoint", "", "fork the members from this checkpoint (kept frozen until claimed)")
	fs.StringVar(&screen, "screen", "", "screen WxH or WxHxDEPTH (an image pool)")
	fs.BoolVar(&egress, "egress", false, "members in network mode egress (an image pool), connected at their claim")
	labels := addKeyValues(fs, "label", "label of the pool")
	res := addResourceFlags(fs)
	pol := addPolicyFlags(fs)
	_ = cmd.RegisterFlagCompletionFunc("checkpoint", func(c *cobra.Command, _ []string, s string) ([]string, cobra.ShellCompDirective) {
		return g.completeCheckpoints(c, nil, s)
	})
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		if size < 1 {
			return usagef("--size %d: want at least 1", size)
		}
		if (image == "") == (checkpoint == "") {
			return usagef("give exactly one of --image and --checkpoint")
		}
		var opts []client.PoolOption
		if image != "" {
			opts = append(opts, client.WithImage(image))
		} else {
			opts = append(opts, client.FromCheckpoint(checkpoint))
		}
		spec, err := specOptions(screen, labels, res)
		if err != nil {
			return err
		}
		for _, o := range spec {
			opts = append(opts, o)
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
		p, err := c.CreatePool(g.ctx, args[0], size, opts...)
		if err != nil {
			return err
		}
		return g.emit(&controldv1.CreatePoolResponse{Pool: p}, func(w io.Writer) { poolRows(w, []*controldv1.Pool{p}) })
	}
	return cmd
}

func poolGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "get ID",
		Short:             "Show a pool (GetPool)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completePools,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.GetPool(g.ctx, args[0])
			if err != nil {
				return err
			}
			return g.emit(&controldv1.GetPoolResponse{Pool: p}, func(w io.Writer) { poolRows(w, []*controldv1.Pool{p}) })
		},
	}
}

func poolListCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List pools by id (ListPools)",
		Args:  usageArgs(cobra.NoArgs),
	}
	pg := addPageFlags(cmd.Flags())
	cmd.RunE = func(*cobra.Command, []string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		pls, next, err := pages(pg, func(token string) ([]*controldv1.Pool, string, error) {
			return c.ListPoolsPage(g.ctx, token, pg.option())
		})
		if err != nil {
			return err
		}
		return g.emit(&controldv1.ListPoolsResponse{Pools: pls, NextPageToken: next}, func(w io.Writer) {
			poolRows(w, pls)
			pageFooter(w, next)
		})
	}
	return cmd
}

func poolResizeCmd(g *globals) *cobra.Command {
	var size int
	cmd := &cobra.Command{
		Use:               "resize POOL --size N",
		Short:             "Change a pool's size: fill up to a larger one, remove warm members past a smaller one (UpdatePool)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completePools,
		RunE: func(_ *cobra.Command, args []string) error {
			if size < 1 {
				return usagef("--size %d: want at least 1", size)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			p, err := c.UpdatePool(g.ctx, args[0], size)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.UpdatePoolResponse{Pool: p}, func(w io.Writer) { poolRows(w, []*controldv1.Pool{p}) })
		},
	}
	cmd.Flags().IntVar(&size, "size", 0, "the new size, 1..64 (required)")
	return cmd
}

func poolDeleteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "delete ID...",
		Short:             "Delete pools and their warm sandboxes (DeletePool)",
		Args:              usageArgs(cobra.MinimumNArgs(1)),
		ValidArgsFunction: g.completePools,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeletePool(g.ctx, id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				if err := g.emit(&controldv1.DeletePoolResponse{}, func(w io.Writer) { fmt.Fprintln(w, "deleted", id) }); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func poolClaimCmd(g *globals) *cobra.Command {
	var (
		ttl       time.Duration
		requestID string
	)
	cmd := &cobra.Command{
		Use:               "claim POOL",
		Short:             "Take a usable sandbox from a pool, warm on a hit (ClaimPool)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completePools,
	}
	fs := cmd.Flags()
	fs.DurationVar(&ttl, "ttl", 0, "delete the claimed sandbox this long after the claim")
	fs.StringVar(&requestID, "request-id", "", "makes the call idempotent: a repeat with the same id returns the same sandbox")
	labels := addKeyValues(fs, "label", "label of the claimed sandbox")
	pol := addPolicyFlags(fs)
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		var opts []client.ClaimOption
		if ttl != 0 {
			opts = append(opts, client.WithTTL(ttl))
		}
		if requestID != "" {
			opts = append(opts, client.WithRequestID(requestID))
		}
		l, err := labels.Map()
		if err != nil {
			return err
		}
		if l != nil {
			opts = append(opts, client.WithLabels(l))
		}
		p, err := pol.Policy()
		if err != nil {
			return err
		}
		if p != nil {
			opts = append(opts, client.WithNetworkPolicy(p))
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		cl, err := c.ClaimPool(g.ctx, args[0], opts...)
		if err != nil {
			return err
		}
		ep, err := cl.Sandbox.Endpoint(g.ctx)
		if err != nil {
			return err
		}
		resp := &controldv1.ClaimPoolResponse{Sandbox: cl.Sandbox.Info(), Endpoint: ep, Hit: cl.Hit, Took: durationpb.New(cl.Took)}
		return g.emit(resp, func(w io.Writer) {
			fmt.Fprintf(w, "hit\t%t\ntook\t%s\n", cl.Hit, ms(cl.Took))
			sandboxDetail(w, cl.Sandbox.Info(), ep)
		})
	}
	return cmd
}

func (g *globals) completePools(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	return complete(g, args, func(c *client.Client) ([]*controldv1.Pool, error) { return c.ListPools(g.ctx) },
		func(p *controldv1.Pool) string { return p.GetId() + "\t" + p.GetName() })
}
