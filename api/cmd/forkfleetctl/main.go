// Command forkfleetctl drives controld from a shell: sandboxes, screenshots,
// checkpoints, forks, and `demo`, the whole loop in one go.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/client"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

const usage = `forkfleetctl: talk to controld.

Usage:
  forkfleetctl [--address ADDR] [--token-file FILE] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] [--insecure] COMMAND [ARGS]

Commands:
  demo                         boot a sandbox, act, observe, checkpoint, fork 4, verify, clean up
  create [--image REF] [--screen WxH] [--ttl DUR]
  list
  get ID
  delete ID...
  screenshot ID [--jpeg Q] [-o FILE]
  checkpoint ID [--tier memory|disk] [--name NAME] [--stop]
  checkpoints
  fork CHECKPOINT [-n N]
  delete-checkpoint ID [--cascade]

ADDR is unix:///run/forkfleet/controld.sock (the default) or HOST:PORT. A HOST:PORT
that is not the loopback needs TLS (--tls-ca: the CA of controld's certificate;
--tls-cert/--tls-key: a client certificate when controld asks for one), or
--insecure to send the token in plaintext on a network you trust.
`

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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "forkfleetctl:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("forkfleetctl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	address := fs.String("address", "unix:///run/forkfleet/controld.sock", "controld address")
	tokenFile := fs.String("token-file", "", "bearer token file for TCP addresses (default: controld's api.token)")
	tlsCA := fs.String("tls-ca", "", "PEM CA bundle: speak TLS to a TCP address and verify controld's certificate with it")
	tlsCert := fs.String("tls-cert", "", "PEM client certificate (mutual TLS; with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM key of --tls-cert")
	insecure := fs.Bool("insecure", false, "send the token in plaintext to a TCP address that is not the loopback")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("no command")
	}
	var opts []client.Option
	if !strings.HasPrefix(*address, "unix://") {
		tf := *tokenFile
		if tf == "" {
			tf = "/var/lib/forkfleet/controld/api.token"
		}
		opts = append(opts, client.WithTokenFile(tf))
		if *insecure {
			opts = append(opts, client.WithInsecure())
		}
		if *tlsCA != "" {
			cfg, err := tlsConfig(*tlsCA, *tlsCert, *tlsKey)
			if err != nil {
				return err
			}
			opts = append(opts, client.WithTLS(cfg))
		}
	}
	c, err := client.Dial(ctx, *address, opts...)
	if err != nil {
		return err
	}
	defer c.Close()

	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "demo":
		return demo(ctx, c, out)
	case "create":
		return create(ctx, c, rest, out)
	case "list":
		return list(ctx, c, out)
	case "get":
		return get(ctx, c, rest, out)
	case "delete":
		return del(ctx, c, rest, out)
	case "screenshot":
		return screenshot(ctx, c, rest, out)
	case "checkpoint":
		return checkpoint(ctx, c, rest, out)
	case "checkpoints":
		return checkpoints(ctx, c, out)
	case "fork":
		return fork(ctx, c, rest, out)
	case "delete-checkpoint":
		return deleteCheckpoint(ctx, c, rest, out)
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
}

func create(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	image := fs.String("image", "", "image (default: controld's default desktop)")
	screen := fs.String("screen", "", "screen size WxH (default 1280x800)")
	ttl := fs.Duration("ttl", 0, "delete after this long")
	root := fs.Bool("root", false, "run exec, launch and the session apps as root (default: the image's unprivileged user)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := []client.CreateOption{client.WithWaitReady()}
	if *root {
		opts = append(opts, client.WithRunAsRoot())
	}
	if *image != "" {
		opts = append(opts, client.WithImage(*image))
	}
	if *screen != "" {
		var w, h int
		if _, err := fmt.Sscanf(*screen, "%dx%d", &w, &h); err != nil {
			return fmt.Errorf("--screen %q: want WxH", *screen)
		}
		opts = append(opts, client.WithScreen(w, h, 24))
	}
	if *ttl > 0 {
		opts = append(opts, client.WithTTL(*ttl))
	}
	sb, err := c.CreateSandbox(ctx, opts...)
	if err != nil {
		return err
	}
	printSandbox(out, sb.Info())
	ep, err := sb.Endpoint(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "aci        %s\ntoken      %s\nunix       %s\n", ep.GetUrl(), ep.GetToken(), ep.GetUnixPath())
	return nil
}

func list(ctx context.Context, c *client.Client, out io.Writer) error {
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tCHECKPOINT\tCREATED")
	for _, sb := range sbs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.GetId(), stateName(sb.GetState()), sb.GetImage(),
			sb.GetCheckpointId(), sb.GetCreatedAt().AsTime().Local().Format(time.TimeOnly))
	}
	return tw.Flush()
}

func get(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: get ID")
	}
	info, err := c.Sandbox(args[0]).Get(ctx)
	if err != nil {
		return err
	}
	printSandbox(out, info)
	return nil
}

func del(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: delete ID...")
	}
	for _, id := range args {
		if err := c.Sandbox(id).Delete(ctx); err != nil {
			return err
		}
		fmt.Fprintln(out, "deleted", id)
	}
	return nil
}

func screenshot(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: screenshot ID [--jpeg Q] [-o FILE]")
	}
	fs := flag.NewFlagSet("screenshot", flag.ContinueOnError)
	quality := fs.Int("jpeg", 0, "JPEG quality (default: PNG)")
	file := fs.String("o", "", "output file (default ID.png or ID.jpg)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	s, err := c.Sandbox(args[0]).ACI(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	req, ext := aci.PNG(), ".png"
	if *quality > 0 {
		req, ext = aci.JPEG(*quality), ".jpg"
	}
	shot, err := s.Screenshot(ctx, req)
	if err != nil {
		return err
	}
	name := *file
	if name == "" {
		name = args[0] + ext
	}
	if err := os.WriteFile(name, shot.GetData(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: %dx%d, %d bytes, frame %x\n", name, shot.GetWidth(), shot.GetHeight(), len(shot.GetData()), shot.GetFrameHash())
	return nil
}

func checkpoint(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: checkpoint ID [--tier memory|disk] [--name NAME] [--stop]")
	}
	fs := flag.NewFlagSet("checkpoint", flag.ContinueOnError)
	tier := fs.String("tier", "memory", "memory or disk")
	name := fs.String("name", "", "checkpoint name")
	stopSource := fs.Bool("stop", false, "stop the source afterwards")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	opts := []client.CheckpointOption{}
	switch *tier {
	case "memory":
		opts = append(opts, client.WithTier(controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY))
	case "disk":
		opts = append(opts, client.WithTier(controldv1.CheckpointTier_CHECKPOINT_TIER_DISK))
	default:
		return fmt.Errorf("--tier %q: want memory or disk", *tier)
	}
	if *name != "" {
		opts = append(opts, client.WithName(*name))
	}
	if *stopSource {
		opts = append(opts, client.WithStop())
	}
	ck, err := c.Sandbox(args[0]).Checkpoint(ctx, opts...)
	if err != nil {
		return err
	}
	printCheckpoint(out, ck.Info())
	return nil
}

func checkpoints(ctx context.Context, c *client.Client, out io.Writer) error {
	cks, err := c.ListCheckpoints(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTIER\tSOURCE\tPARENT\tFORKS\tMEMORY\tLAYER")
	for _, ck := range cks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ck.GetId(), ck.GetName(), tierName(ck.GetTier()),
			ck.GetSourceSandboxId(), ck.GetParentCheckpointId(), ck.GetLiveForks(),
			mib(ck.GetMemoryBytes()), mib(ck.GetLayerBytes()))
	}
	return tw.Flush()
}

func fork(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: fork CHECKPOINT [-n N]")
	}
	fs := flag.NewFlagSet("fork", flag.ContinueOnError)
	n := fs.Int("n", 1, "replicas")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	start := time.Now()
	results, err := c.Checkpoint(args[0]).Fork(ctx, *n)
	if err != nil {
		return err
	}
	printForks(out, results, time.Since(start))
	return client.FirstError(results)
}

func deleteCheckpoint(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: delete-checkpoint ID [--cascade]")
	}
	fs := flag.NewFlagSet("delete-checkpoint", flag.ContinueOnError)
	cascade := fs.Bool("cascade", false, "also delete descendant checkpoints")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var opts []client.DeleteCheckpointOption
	if *cascade {
		opts = append(opts, client.WithCascade())
	}
	ids, err := c.Checkpoint(args[0]).Delete(ctx, opts...)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "deleted", strings.Join(ids, " "))
	return nil
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
	printWaterfall(out, src.Info())

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
	for i, h := range hashes {
		// Replicas 1..n-1 were untouched: they still show the checkpointed
		// screen, identical to each other; replica 0 diverged.
		same := "identical to replica 1"
		if string(h) != string(hashes[min(1, len(hashes)-1)]) {
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

func printSandbox(out io.Writer, sb *controldv1.Sandbox) {
	fmt.Fprintf(out, "id         %s\nstate      %s\nimage      %s\n", sb.GetId(), stateName(sb.GetState()), sb.GetImage())
	if sb.GetCheckpointId() != "" {
		fmt.Fprintf(out, "checkpoint %s (generation %d)\n", sb.GetCheckpointId(), sb.GetGeneration())
	}
	if sb.GetStatusMessage() != "" {
		fmt.Fprintf(out, "status     %s\n", sb.GetStatusMessage())
	}
	printWaterfall(out, sb)
}

func printWaterfall(out io.Writer, sb *controldv1.Sandbox) {
	phases := sb.GetBoot()
	if len(phases) == 0 {
		return
	}
	sort.SliceStable(phases, func(i, j int) bool { return phases[i].GetAt().AsDuration() < phases[j].GetAt().AsDuration() })
	var parts []string
	for _, p := range phases {
		parts = append(parts, fmt.Sprintf("%s %s", p.GetName(), ms(p.GetAt().AsDuration())))
	}
	fmt.Fprintf(out, "    boot: %s\n", strings.Join(parts, " | "))
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

func stateName(s controldv1.SandboxState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SANDBOX_STATE_"))
}

func tierName(t controldv1.CheckpointTier) string {
	return strings.ToLower(strings.TrimPrefix(t.String(), "CHECKPOINT_TIER_"))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
