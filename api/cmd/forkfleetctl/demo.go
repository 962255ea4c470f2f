package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/client"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

func demoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Boot a sandbox, act, observe, checkpoint, fork 4, verify, diverge, clean up",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if g.output == "json" {
				return usagef("demo prints a narrative; -o json is not for it")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return demo(g.ctx, c, g.stdout)
		},
	}
}

// demo is the main job end to end: boot, act, observe, checkpoint, fork,
// verify, diverge, clean up.
func demo(ctx context.Context, c *client.Client, out io.Writer) (err error) {
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	var cleanup []func(context.Context)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i](cctx)
		}
	}()

	step("boot a desktop sandbox")
	t0 := time.Now()
	src, err := c.CreateSandbox(ctx, client.WithWaitReady(), client.WithLabels(map[string]string{"forkfleet.dev/demo": "true"}))
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	cleanup = append(cleanup, func(ctx context.Context) { _ = src.Delete(ctx) })
	fmt.Fprintf(out, "    %s usable in %s\n", src.ID(), ms(time.Since(t0)))
	fmt.Fprintf(out, "    boot: %s\n", waterfall(src.Info()))

	s, err := src.ACI(ctx)
	if err != nil {
		return fmt.Errorf("aci: %w", err)
	}
	defer s.Close()
	welcome := s.Welcome()
	fmt.Fprintf(out, "    ACI session %s, protocol v%d, capabilities %s\n", welcome.GetSessionId(),
		welcome.GetProtocolVersion(), strings.Join(welcome.GetCapabilities(), ","))

	step("act and observe in one round trip: focus the terminal, type, take a PNG")
	term, err := waitWindow(ctx, s, "xterm", 5*time.Second)
	if err != nil {
		return err
	}
	g := term.GetGeometry()
	actions := []*aciv1.Action{aci.Click(int(g.GetX()+g.GetWidth()/2), int(g.GetY()+g.GetHeight()/2))}
	actions = append(actions, aci.Type("echo hello from forkfleet > /root/demo.txt"), aci.Key("Return"))
	obs := aci.PNG()
	obs.SettleMs = 100
	t1 := time.Now()
	st, err := s.Step(ctx, actions, obs)
	if err != nil {
		return fmt.Errorf("step: %w", err)
	}
	for i, o := range st.GetOutcomes() {
		if o.GetError() != nil {
			return fmt.Errorf("step action %d: %s", i, o.GetError().GetMessage())
		}
	}
	shot := st.GetObservation()
	if err := os.WriteFile("forkfleet-demo-source.png", shot.GetData(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "    %d actions + settled %dx%d PNG (%d bytes) in %s -> forkfleet-demo-source.png\n",
		len(actions), shot.GetWidth(), shot.GetHeight(), len(shot.GetData()), ms(time.Since(t1)))

	step("checkpoint the running sandbox (memory tier: processes, memory, writable layer)")
	ck, err := src.Checkpoint(ctx, client.WithName(fmt.Sprintf("demo-%d", time.Now().UnixNano())))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	cleanup = append(cleanup, func(ctx context.Context) { _, _ = ck.Delete(ctx, client.WithCascade()) })
	printCheckpoint(out, ck.Info())
	if _, err := s.Ping(ctx, nil); err != nil {
		// The session was closed at checkpoint (established connections are
		// not carried into forks); reconnect to the still-running source.
		s.Close()
		if s, err = src.ACI(ctx); err != nil {
			return fmt.Errorf("reconnect to source: %w", err)
		}
		defer s.Close()
	}

	step("fork 4 live replicas and verify each (marker file, in-memory value, pixels)")
	t2 := time.Now()
	results, err := ck.Fork(ctx, 4)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	for _, r := range results {
		if r.Sandbox != nil {
			sb := r.Sandbox
			cleanup = append(cleanup, func(ctx context.Context) { _ = sb.Delete(ctx) })
		}
	}
	printForks(out, results, time.Since(t2))
	if err := client.FirstError(results); err != nil {
		return err
	}

	step("diverge: type into replica 0 only; the others and the source keep their screens")
	forks := client.Sandboxes(results)
	hashes := make([][]byte, len(forks))
	for i, f := range forks {
		fs, err := f.ACI(ctx)
		if err != nil {
			return fmt.Errorf("replica %d aci: %w", i, err)
		}
		if i == 0 {
			if _, err := fs.Step(ctx, []*aciv1.Action{aci.Type("echo only in replica 0"), aci.Key("Return")}, nil); err != nil {
				fs.Close()
				return fmt.Errorf("replica 0 step: %w", err)
			}
		}
		h := aci.HashOnly()
		h.SettleMs = 100
		r, err := fs.Screenshot(ctx, h)
		fs.Close()
		if err != nil {
			return fmt.Errorf("replica %d screenshot: %w", i, err)
		}
		hashes[i] = r.GetFrameHash()
	}
	srcObs := aci.HashOnly()
	srcObs.SettleMs = 100
	r, err := s.Screenshot(ctx, srcObs)
	if err != nil {
		return fmt.Errorf("source screenshot: %w", err)
	}
	srcHash := r.GetFrameHash()
	fmt.Fprintf(out, "    source (%s): frame %x\n", src.ID(), srcHash[:6])
	for i, h := range hashes {
		// Replicas 1..n-1 were untouched: they still show the checkpointed
		// screen, as the source does; replica 0 diverged.
		same := "same screen as the source"
		if string(h) != string(srcHash) {
			same = "diverged"
		}
		fmt.Fprintf(out, "    replica %d (%s): frame %x  %s\n", i, forks[i].ID(), h[:6], same)
	}
	fmt.Fprintf(out, "==> done in %s; cleaning up\n", ms(time.Since(t0)))
	return nil
}

// waitWindow waits for a window of class (the session's apps map a moment
// after the desktop is ready).
func waitWindow(ctx context.Context, s *aci.Session, class string, timeout time.Duration) (*aciv1.Window, error) {
	deadline := time.Now().Add(timeout)
	for {
		wins, err := s.ListWindows(ctx)
		if err != nil {
			return nil, fmt.Errorf("list windows: %w", err)
		}
		for _, w := range wins {
			if strings.EqualFold(w.GetClass(), class) {
				return w, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no %s window after %s", class, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func printCheckpoint(out io.Writer, ck *controldv1.Checkpoint) {
	t := ck.GetTiming()
	fmt.Fprintf(out, "    checkpoint %s (%s): source frozen %s, dump %s, layer %s, total %s; memory %s, layer %s\n",
		ck.GetId(), tierName(ck.GetTier()), ms(t.GetFrozen().AsDuration()), ms(t.GetDump().AsDuration()),
		ms(t.GetLayer().AsDuration()), ms(t.GetTotal().AsDuration()), mib(ck.GetMemoryBytes()), mib(ck.GetLayerBytes()))
}

func printForks(out io.Writer, results []client.ForkResult, wall time.Duration) {
	ok := 0
	for i, r := range results {
		if r.Err != nil {
			fmt.Fprintf(out, "    replica %d: FAILED: %v\n", i, r.Err)
			continue
		}
		ok++
		var checks []string
		for _, v := range r.Verification {
			mark := "ok"
			if !v.GetOk() {
				mark = "FAILED (" + v.GetDetail() + ")"
			}
			checks = append(checks, strings.TrimPrefix(strings.ToLower(v.GetLevel().String()), "verify_level_")+" "+mark)
		}
		fmt.Fprintf(out, "    replica %d: %s usable in %s, verified: %s\n", i, r.Sandbox.ID(), ms(r.Took), strings.Join(checks, ", "))
	}
	fmt.Fprintf(out, "    %d/%d replicas usable, wall %s\n", ok, len(results), ms(wall))
}
