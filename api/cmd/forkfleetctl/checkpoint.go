package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func checkpointCmd(g *globals) *cobra.Command {
	c := group("checkpoint", "Capture running sandboxes and fork replicas from them (CheckpointService)", "ck", "checkpoints")
	c.AddCommand(checkpointCreateCmd(g), checkpointGetCmd(g), checkpointListCmd(g), checkpointDeleteCmd(g),
		checkpointForkCmd(g), checkpointExportCmd(g), checkpointImportCmd(g))
	return c
}

func checkpointCreateCmd(g *globals) *cobra.Command {
	var (
		tier, name, requestID string
		stop                  bool
	)
	cmd := &cobra.Command{
		Use:               "create SANDBOX",
		Short:             "Checkpoint a running sandbox, which keeps running (CreateCheckpoint)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeSandboxes,
	}
	fs := cmd.Flags()
	fs.StringVar(&tier, "tier", "memory", "memory (processes, memory, writable layer) or disk (writable layer only)")
	fs.StringVar(&name, "name", "", "a name, unique among checkpoints")
	fs.BoolVar(&stop, "stop", false, "stop the source afterwards")
	fs.StringVar(&requestID, "request-id", "", "makes the call idempotent: a repeat with the same id returns the same checkpoint")
	labels := addKeyValues(fs, "label", "label of the checkpoint")
	_ = cmd.RegisterFlagCompletionFunc("tier", cobra.FixedCompletions(sortedNames(tierByName), cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		t, ok := tierByName[tier]
		if !ok {
			return usagef("--tier %q: want memory or disk", tier)
		}
		opts := []client.CheckpointOption{client.WithTier(t)}
		if name != "" {
			opts = append(opts, client.WithName(name))
		}
		if stop {
			opts = append(opts, client.WithStop())
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
		c, err := g.client()
		if err != nil {
			return err
		}
		ck, err := c.Sandbox(args[0]).Checkpoint(g.ctx, opts...)
		if err != nil {
			return err
		}
		return g.emit(&controldv1.CreateCheckpointResponse{Checkpoint: ck.Info()}, func(w io.Writer) { checkpointDetail(w, ck.Info()) })
	}
	return cmd
}

func checkpointGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:               "get ID|NAME",
		Short:             "Show a checkpoint (GetCheckpoint)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeCheckpoints,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			info, err := c.Checkpoint(args[0]).Get(g.ctx)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.GetCheckpointResponse{Checkpoint: info}, func(w io.Writer) { checkpointDetail(w, info) })
		},
	}
}

func checkpointListCmd(g *globals) *cobra.Command {
	var root string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List checkpoints, oldest first (ListCheckpoints)",
		Args:  usageArgs(cobra.NoArgs),
	}
	cmd.Flags().StringVar(&root, "root", "", "only checkpoints descending from this one (itself included)")
	pg := addPageFlags(cmd.Flags())
	labels := addKeyValues(cmd.Flags(), "label", "only checkpoints with this label")
	cmd.RunE = func(*cobra.Command, []string) error {
		l, err := labels.Map()
		if err != nil {
			return err
		}
		opts := []client.ListCheckpointsOption{client.WithLabels(l)}
		if root != "" {
			opts = append(opts, client.WithRoot(root))
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		cks, next, err := pages(pg, func(token string) ([]*controldv1.Checkpoint, string, error) {
			return c.ListCheckpointsPage(g.ctx, token, append(opts, pg.option())...)
		})
		if err != nil {
			return err
		}
		return g.emit(&controldv1.ListCheckpointsResponse{Checkpoints: cks, NextPageToken: next}, func(w io.Writer) {
			checkpointRows(w, cks)
			pageFooter(w, next)
		})
	}
	return cmd
}

func checkpointDeleteCmd(g *globals) *cobra.Command {
	var cascade bool
	cmd := &cobra.Command{
		Use:               "delete ID|NAME...",
		Short:             "Delete checkpoints (DeleteCheckpoint)",
		Args:              usageArgs(cobra.MinimumNArgs(1)),
		ValidArgsFunction: g.completeCheckpoints,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var opts []client.DeleteCheckpointOption
			if cascade {
				opts = append(opts, client.WithCascade())
			}
			for _, id := range args {
				ids, err := c.Checkpoint(id).Delete(g.ctx, opts...)
				if err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				if err := g.emit(&controldv1.DeleteCheckpointResponse{DeletedIds: ids}, func(w io.Writer) {
					fmt.Fprintln(w, "deleted", strings.Join(ids, " "))
				}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&cascade, "cascade", false, "also delete descendant checkpoints")
	return cmd
}

func checkpointForkCmd(g *globals) *cobra.Command {
	var (
		n         int
		ttl       time.Duration
		levels    []string
		requestID string
		remote    bool
		record    bool
		restore   string
	)
	cmd := &cobra.Command{
		Use:               "fork CHECKPOINT | --remote REFERENCE",
		Short:             "Start N live replicas of a checkpoint, each verified (ForkCheckpoint)",
		Args:              usageArgs(cobra.ExactArgs(1)),
		ValidArgsFunction: g.completeCheckpoints,
	}
	fs := cmd.Flags()
	fs.IntVarP(&n, "count", "n", 1, "replicas")
	fs.DurationVar(&ttl, "ttl", 0, "delete each replica this long after creation")
	fs.StringArrayVar(&levels, "verify", nil, "verify every replica at this level (repeatable; none to skip; default: what the checkpoint supports)")
	fs.StringVar(&requestID, "request-id", "", "makes the call idempotent: a repeat with the same id returns the same replicas")
	fs.BoolVar(&remote, "remote", false, "the argument is a checkpoint image in an OCI registry (pushed by export --push): controld pulls it once and forks its import")
	fs.BoolVar(&record, "record", false, "record every replica from its first keyframe (recording start; replicas of a recording source are recorded anyway)")
	fs.StringVar(&restore, "restore", "auto", "how memory-tier replicas' pages come back: lazy (served at first touch), eager, or auto (controld chooses by the checkpoint's size)")
	labels := addKeyValues(fs, "label", "label of every replica")
	res := addResourceFlags(fs)
	pol := addPolicyFlags(fs)
	_ = cmd.RegisterFlagCompletionFunc("verify", cobra.FixedCompletions(sortedNames(levelByName), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("restore", cobra.FixedCompletions(sortedNames(restoreModeByName), cobra.ShellCompDirectiveNoFileComp))
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		if n < 1 {
			return usagef("--count %d: want at least 1", n)
		}
		opts, err := forkOptions(ttl, levels, labels, res, pol)
		if err != nil {
			return err
		}
		if requestID != "" {
			opts = append(opts, client.WithRequestID(requestID))
		}
		if record {
			opts = append(opts, client.WithRecord())
		}
		mode, err := parseEnums("restore", []string{restore}, restoreModeByName)
		if err != nil {
			return err
		}
		opts = append(opts, client.WithRestoreMode(mode[0]))
		c, err := g.client()
		if err != nil {
			return err
		}
		var results []client.ForkResult
		resp := &controldv1.ForkCheckpointResponse{CheckpointId: args[0]}
		if remote {
			var ck *client.Checkpoint
			results, ck, err = c.ForkRemote(g.ctx, args[0], n, opts...)
			if ck != nil {
				resp.CheckpointId = ck.ID()
			}
		} else {
			results, err = c.Checkpoint(args[0]).Fork(g.ctx, n, opts...)
		}
		if err != nil {
			return err
		}
		for _, r := range results {
			resp.Replicas = append(resp.Replicas, r.Replica)
		}
		if err := g.emit(resp, func(w io.Writer) { replicaRows(w, resp.GetReplicas()) }); err != nil {
			return err
		}
		failed := 0
		for _, r := range resp.GetReplicas() {
			if r.GetErrorCode() != 0 {
				failed++
			}
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d replicas failed", failed, len(resp.GetReplicas()))
		}
		return nil
	}
	return cmd
}

func forkOptions(ttl time.Duration, levels []string, labels *keyValues, res *resourceFlags, pol *policyFlags) ([]client.ForkOption, error) {
	var opts []client.ForkOption
	if ttl != 0 {
		opts = append(opts, client.WithTTL(ttl))
	}
	ls, err := parseEnums("verify", levels, levelByName)
	if err != nil {
		return nil, err
	}
	if len(ls) > 0 {
		opts = append(opts, client.WithVerify(ls...))
	}
	l, err := labels.Map()
	if err != nil {
		return nil, err
	}
	if l != nil {
		opts = append(opts, client.WithLabels(l))
	}
	r, err := res.Resources()
	if err != nil {
		return nil, err
	}
	if r != nil {
		opts = append(opts, client.WithResources(r))
	}
	p, err := pol.Policy()
	if err != nil {
		return nil, err
	}
	if p != nil {
		opts = append(opts, client.WithNetworkPolicy(p))
	}
	return opts, nil
}

func checkpointExportCmd(g *globals) *cobra.Command {
	var push bool
	cmd := &cobra.Command{
		Use:               "export CHECKPOINT REFERENCE",
		Short:             "Write a checkpoint as an OCI image into containerd's content store, and push it to its registry (ExportCheckpoint)",
		Args:              usageArgs(cobra.ExactArgs(2)),
		ValidArgsFunction: g.completeCheckpoints,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var opts []client.ExportOption
			if push {
				opts = append(opts, client.WithPush())
			}
			r, err := c.Checkpoint(args[0]).Export(g.ctx, args[1], opts...)
			if err != nil {
				return err
			}
			return g.emit(r, func(w io.Writer) {
				fmt.Fprintf(w, "reference\t%s\ndigest\t%s\nsize\t%s\n", r.GetReference(), r.GetDigest(), mib(r.GetSizeBytes()))
				if push {
					fmt.Fprintf(w, "pushed\t%s\n", mib(r.GetPushedBytes()))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&push, "push", false, "also push the image to the registry REFERENCE names (only blobs it lacks are sent)")
	return cmd
}

func checkpointImportCmd(g *globals) *cobra.Command {
	var pull bool
	cmd := &cobra.Command{
		Use:   "import REFERENCE",
		Short: "Register a checkpoint image written by export, here or on another host, pulling it from its registry first (ImportCheckpoint)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var opts []client.ImportOption
			if pull {
				opts = append(opts, client.WithPull())
			}
			ck, err := c.ImportCheckpoint(g.ctx, args[0], opts...)
			if err != nil {
				return err
			}
			return g.emit(&controldv1.ImportCheckpointResponse{Checkpoint: ck.Info()}, func(w io.Writer) { checkpointDetail(w, ck.Info()) })
		},
	}
	cmd.Flags().BoolVar(&pull, "pull", false, "pull the image from the registry REFERENCE names first (by tag or @sha256 digest)")
	return cmd
}

func (g *globals) completeCheckpoints(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	return complete(g, args, func(c *client.Client) ([]*controldv1.Checkpoint, error) { return c.ListCheckpoints(g.ctx) },
		func(ck *controldv1.Checkpoint) string {
			return ck.GetId() + "\t" + tierName(ck.GetTier()) + " " + ck.GetName()
		})
}
