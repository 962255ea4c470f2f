package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

func hostCmd(g *globals) *cobra.Command {
	c := group("host", "The host controld runs on (HostService)", "hosts")
	c.AddCommand(hostStatusCmd(g))
	return c
}

func hostStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show each host's memory, admitted sandboxes and pools (GetHostStatus)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			hosts, err := c.Hosts(g.ctx)
			if err != nil {
				return err
			}
			// -o json: one GetHostStatusResponse per host, one per line
			// with several.
			if g.output == "json" {
				for _, h := range hosts {
					if h.Err != nil {
						return fmt.Errorf("host %s: %w", h.Target, h.Err)
					}
					if err := g.emitJSON(h.Status, len(hosts) == 1); err != nil {
						return err
					}
				}
				return nil
			}
			var failed error
			err = g.emit(nil, func(w io.Writer) {
				for i, h := range hosts {
					if i > 0 {
						fmt.Fprintln(w)
					}
					if h.Err != nil {
						fmt.Fprintf(w, "target\t%s\nerror\t%v\n", h.Target, h.Err)
						failed = fmt.Errorf("host %s: %w", h.Target, h.Err)
						continue
					}
					hostDetail(w, h.Status)
				}
			})
			if err != nil {
				return err
			}
			return failed
		},
	}
}

func hostDetail(w io.Writer, st *controldv1.GetHostStatusResponse) {
	row := func(k, format string, args ...any) { fmt.Fprintf(w, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	row("host", "%s", st.GetHost())
	row("version", "%s", st.GetVersion())
	row("memory", "%s available of %s", limits.Bytes(st.GetMemoryAvailableBytes()), limits.Bytes(st.GetMemoryTotalBytes()))
	row("sandboxes", "%d of %d", st.GetSandboxes(), st.GetMaxSandboxes())
	row("admitted memory", "%s of %s (default per sandbox %s)", limits.Bytes(st.GetAdmittedMemoryBytes()),
		limits.Bytes(st.GetMaxMemoryBytes()), limits.Bytes(st.GetDefaultMemoryBytes()))
	row("checkpoints", "%d", st.GetCheckpoints())
	for _, p := range st.GetPools() {
		row("pool "+p.GetId(), "%s: %d of %d warm", dash(p.GetName()), p.GetAvailable(), p.GetSize())
	}
}
