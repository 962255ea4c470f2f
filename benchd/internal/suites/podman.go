//go:build linux

package suites

import (
	"github.com/forkfleet/forkfleet/benchd/internal/peers"

	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// podmanGlobal makes podman work on this host (no systemd, cgroup v1) with
// runc as its runtime: Debian 12's crun is built without CRIU.
var podmanGlobal = []string{"--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime=runc"}

// podmanRunFlags are what `podman run` needs here besides the image: the
// default ulimits exceed this VM's, and a sandbox has no network.
var podmanRunFlags = []string{"--network", "none", "--ulimit", "nproc=4096:4096", "--ulimit", "nofile=1024:1024"}

// guestdSocketInContainer is where guestd listens in the desktop image (the
// same path controld reaches through the sandbox's rootfs).
const guestdSocketInContainer = "/run/forkfleet/aci.sock"

// podmanEnv puts criu 4.2 (/usr/local/sbin) first on PATH, as the project's
// own checkpoints use it.
func podmanEnv() []string {
	return append(os.Environ(), "PATH=/usr/local/sbin:"+os.Getenv("PATH"))
}

func podman(ctx context.Context, args ...string) (string, time.Duration, error) {
	p, _ := peers.Lookup("podman")
	bin, err := p.Path()
	if err != nil {
		return "", 0, err
	}
	out, d, err := runTimed(ctx, podmanEnv(), append(append([]string{bin}, podmanGlobal...), args...)...)
	return strings.TrimSpace(string(out)), d, err
}

// labels are the labels every row of this peer carries.
func (p *podmanPeer) labels(kv ...string) map[string]string {
	return labels(append([]string{"system", "podman", "tool", "podman+runc+criu", "shape", p.shape}, kv...)...)
}

// podmanPeer is the desktop image controld boots, run by podman with the
// environment guestd needs, as the peer of our checkpoint and fork.
type podmanPeer struct {
	env    *suiteapi.Env
	ref    string
	source string
	// aciToken authenticates benchd to guestd in every peer container (the
	// restored ones inherit the source's environment).
	aciToken   string
	adminToken string
	// shape labels the rows ("bare-desktop" unless the suite says);
	// runArgs go to every podman run of the peer's containers.
	shape   string
	runArgs []string

	mu      sync.Mutex
	created []string
}

// podmanPeers is what a suite that measures podman (when on) promises.
func podmanPeers(on bool) []string {
	if !on {
		return nil
	}
	return []string{"podman"}
}

// newPodmanPeer checks that podman holds the same image as containerd
// (loading it from containerd when not), starts the source desktop and
// waits until its guestd answers. shape labels its rows; runArgs are extra
// `podman run` arguments (the image's CRIU config, say).
func newPodmanPeer(ctx context.Context, env *suiteapi.Env, image, shape string, runArgs ...string) (*podmanPeer, error) {
	if _, ok := env.Peer("podman"); !ok {
		return nil, errors.New("podman not installed (make peers)")
	}
	if _, err := lookPath("runc"); err != nil {
		return nil, errors.New("runc not installed: podman's crun on Debian 12 has no CRIU support")
	}
	id, err := samePodmanImage(ctx, env, image)
	if err != nil {
		return nil, err
	}
	env.Notef("podman peer runs %s (image config %.19s, the one controld boots) with runc, --network none and criu from /usr/local/sbin", image, id)
	p := &podmanPeer{env: env, ref: image, aciToken: randomToken(), adminToken: randomToken(),
		source: fmt.Sprintf("benchd-peer-%d", time.Now().UnixNano()), shape: shape, runArgs: runArgs}
	if err := p.run(ctx, p.source); err != nil {
		p.Close(ctx)
		return nil, err
	}
	if err := p.waitGuest(ctx, p.source, 30*time.Second); err != nil {
		p.Close(ctx)
		return nil, err
	}
	// Let the window manager and xterm map, as a sandbox is checkpointed
	// only once its desktop is ready.
	time.Sleep(2 * time.Second)
	return p, nil
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// samePodmanImage returns the image config digest podman and containerd
// share for ref, loading the image from containerd into podman when podman
// lacks it or holds a different build.
func samePodmanImage(ctx context.Context, env *suiteapi.Env, ref string) (string, error) {
	want, err := containerdConfigDigest(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("image %s in containerd: %w", ref, err)
	}
	have, _, _ := podman(ctx, "image", "inspect", "--format", "{{.Id}}", ref)
	if "sha256:"+have == want {
		return want, nil
	}
	tar := filepath.Join(env.WorkDir, "podman-image.tar")
	defer os.Remove(tar)
	if _, _, err := runTimed(ctx, nil, "ctr", "-a", containerdSocket, "-n", containerdNS, "images", "export", tar, ref); err != nil {
		return "", fmt.Errorf("export %s from containerd: %w", ref, err)
	}
	if _, _, err := podman(ctx, "load", "-q", "-i", tar); err != nil {
		return "", err
	}
	have, _, err = podman(ctx, "image", "inspect", "--format", "{{.Id}}", ref)
	if err != nil {
		return "", err
	}
	if "sha256:"+have != want {
		return "", fmt.Errorf("podman's %s is config sha256:%s, containerd's is %s: not the same image", ref, have, want)
	}
	return want, nil
}

// containerdConfigDigest reads ref's manifest from containerd's content
// store and returns its config digest (podman's image id).
func containerdConfigDigest(ctx context.Context, ref string) (string, error) {
	ctr := []string{"ctr", "-a", containerdSocket, "-n", containerdNS}
	out, _, err := runTimed(ctx, nil, append(ctr, "images", "ls", "name=="+ref)...)
	if err != nil {
		return "", err
	}
	var digest string
	for _, line := range strings.Split(string(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == ref {
			digest = f[2]
		}
	}
	if digest == "" {
		return "", errors.New("not found")
	}
	for range 2 { // an index names the platform's manifest
		b, _, err := runTimed(ctx, nil, append(ctr, "content", "get", digest)...)
		if err != nil {
			return "", err
		}
		var m struct {
			Config    struct{ Digest string }
			Manifests []struct {
				Digest   string
				Platform struct{ Architecture, OS string }
			}
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return "", fmt.Errorf("manifest %s: %w", digest, err)
		}
		if m.Config.Digest != "" {
			return m.Config.Digest, nil
		}
		digest = ""
		for _, d := range m.Manifests {
			if d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				digest = d.Digest
				break
			}
		}
		if digest == "" {
			return "", fmt.Errorf("index has no linux/%s manifest", runtime.GOARCH)
		}
	}
	return "", errors.New("nested index")
}

func (p *podmanPeer) track(name string) {
	p.mu.Lock()
	p.created = append(p.created, name)
	p.mu.Unlock()
}

// run starts a desktop container: guestd as PID 1 with the sandbox
// environment controld gives it.
func (p *podmanPeer) run(ctx context.Context, name string) error {
	p.track(name)
	args := append(append([]string{"run", "-d", "--name", name}, podmanRunFlags...), p.runArgs...)
	args = append(args,
		"-e", "FORKFLEET_ACI_TOKEN="+p.aciToken,
		"-e", "FORKFLEET_ADMIN_TOKEN="+p.adminToken,
		"-e", "FORKFLEET_SANDBOX_ID="+name,
		"-e", "FORKFLEET_SCREEN=1280x800x24",
		p.ref)
	_, _, err := podman(ctx, args...)
	return err
}

// remove deletes containers, also after ctx ended.
func (p *podmanPeer) remove(ctx context.Context, names ...string) {
	if len(names) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	if _, _, err := podman(dctx, append([]string{"rm", "-f", "-t", "0"}, names...)...); err != nil {
		p.env.Progressf("podman rm: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.created[:0]
	for _, c := range p.created {
		if !contains(names, c) {
			kept = append(kept, c)
		}
	}
	p.created = kept
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Close removes every container the peer created.
func (p *podmanPeer) Close(ctx context.Context) {
	p.mu.Lock()
	names := append([]string(nil), p.created...)
	p.mu.Unlock()
	p.remove(ctx, names...)
}

// guestSocket is the container's guestd socket seen from the host through
// its init's root.
func (p *podmanPeer) guestSocket(ctx context.Context, name string) (guestsock.Addr, error) {
	out, _, err := podman(ctx, "inspect", "--format", "{{.State.Status}} {{.State.Pid}}", name)
	if err != nil {
		return guestsock.Addr{}, err
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != "running" {
		return guestsock.Addr{}, &notRunningError{name: name, state: out}
	}
	pid, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || pid == 0 {
		return guestsock.Addr{}, &notRunningError{name: name, state: out}
	}
	start, err := guestsock.ProcessStart(uint32(pid))
	if err != nil {
		return guestsock.Addr{}, &notRunningError{name: name, state: out}
	}
	return guestsock.Addr{PID: uint32(pid), Start: start, Path: guestdSocketInContainer}, nil
}

type notRunningError struct{ name, state string }

func (e *notRunningError) Error() string {
	return fmt.Sprintf("podman container %s is not running (state %q)", e.name, e.state)
}

// withSession runs fn on an ACI session to the container's guestd.
func (p *podmanPeer) withSession(ctx context.Context, name string, fn func(context.Context, *aci.Session) error) error {
	sock, err := p.guestSocket(ctx, name)
	if err != nil {
		return err
	}
	s, err := aci.DialSandbox(ctx, sock, p.aciToken, aci.WithClientName("benchd"))
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(ctx, s)
}

// ping proves the container's guestd answers an ACI request.
func (p *podmanPeer) ping(ctx context.Context, name string) error {
	sock, err := p.guestSocket(ctx, name)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := aci.DialSandbox(dctx, sock, p.aciToken, aci.WithClientName("benchd"))
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Ping(dctx, []byte(name))
	return err
}

// waitGuest polls until guestd answers; on failure the error carries the
// tail of the container's log, which says why it exited.
func (p *podmanPeer) waitGuest(ctx context.Context, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := p.ping(ctx, name)
		if err == nil {
			return nil
		}
		var nr *notRunningError
		if errors.As(err, &nr) || time.Now().After(deadline) || ctx.Err() != nil {
			logs, _, _ := podman(context.WithoutCancel(ctx), "logs", "--tail", "15", name)
			return fmt.Errorf("guestd in podman container %s does not answer: %w; log tail: %s", name, err, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkpointCompressions lists the archive compressions to measure: the
// default (named from podman's help) and none, when --compress exists.
func checkpointCompressions(ctx context.Context) (def string, flag bool) {
	help, _, err := podman(ctx, "container", "checkpoint", "--help")
	if err != nil || !strings.Contains(help, "--compress") {
		return "gzip", false // podman < 4.0: gzip, no choice
	}
	if m := regexp.MustCompile(`--compress string.*\(default "([a-z]+)"\)`).FindStringSubmatch(help); m != nil {
		return m[1], true
	}
	return "default", true
}

// checkpointRows measures `podman container checkpoint --leave-running
// --export` of the running source desktop, with the default compression and
// with none.
func (p *podmanPeer) checkpointRows(ctx context.Context, n, warm int) []result.Row {
	def, canChoose := checkpointCompressions(ctx)
	modes := []string{def}
	if canChoose && def != "none" {
		modes = append(modes, "none")
	}
	var rows []result.Row
	for _, mode := range modes {
		lbl := p.labels("compress", mode)
		ck := result.NewSeries("peer.podman_checkpoint_leave_running", "ms", lbl)
		size := result.NewSeries("peer.podman_checkpoint_size", "MB", lbl)
		ck.Baseline, size.Baseline = true, true
		for i := 0; i < warm+n; i++ {
			file := filepath.Join(p.env.WorkDir, fmt.Sprintf("podman-ck-%s-%d.tar", mode, i))
			args := []string{"container", "checkpoint", "--leave-running", "--export", file}
			if mode == "none" {
				args = append(args, "--compress", "none")
			}
			_, d, err := podman(ctx, append(args, p.source)...)
			st, serr := os.Stat(file)
			os.Remove(file)
			switch {
			case i < warm:
				ck.Warmup()
			case err != nil:
				ck.Fail()
				p.env.Progressf("podman checkpoint (%s): %v", mode, err)
			case serr != nil:
				ck.Unverified()
			default:
				ck.Add(suiteapi.Ms(d))
				size.Add(float64(st.Size()) / 1e6)
			}
		}
		p.env.Progressf("podman checkpoint --leave-running (%s): %d ok, p50 %s", mode, ck.Len(), p50String(ck))
		rows = append(rows, ck.Row(), size.Row())
	}
	// --leave-running must leave a working desktop behind.
	if err := p.ping(ctx, p.source); err != nil {
		p.env.Notef("podman source desktop does not answer after its checkpoints: %v", err)
	}
	return rows
}

func p50String(s *result.Series) string {
	if r := s.Row(); r.P50 != nil {
		return fmt.Sprintf("%.0f ms", *r.P50)
	}
	return "-"
}

// exportCheckpoint writes one checkpoint archive of the source (default
// compression) to restore from, with podman's default checkpoint, which
// stops the source (nothing uses it after this). Not --leave-running: podman
// exports the container's changed files after runc has resumed it (libpod's
// checkpoint(): CheckpointContainer, then exportCheckpoint), so a file an
// app writes between CRIU's dump and that export has another size than the
// one CRIU recorded, and every restore of the archive fails: CRIU "File
// home/agent/.config/chromium/Default/History-journal has bad size 8720
// (expect 0)", which runc reports as "criu failed: type NOTIFY" (Chromium's
// profile, now and then; benchd/results/2026-12-02/webpeer/).
func (p *podmanPeer) exportCheckpoint(ctx context.Context) (string, error) {
	file := filepath.Join(p.env.WorkDir, "podman-restore-source.tar")
	if _, _, err := podman(ctx, "container", "checkpoint", "--export", file, p.source); err != nil {
		return "", err
	}
	return file, nil
}

// criuLogFile matches the restore log podman names when runc's CRIU failed.
var criuLogFile = regexp.MustCompile(`log file: (/\S+\.log)(?:\s|$)`)

// criuErrors returns the first CRIU errors of the log a failed podman
// command names (why the restore failed), "" when it names none. Read
// before the container is removed, which takes its log.
func criuErrors(err error) string {
	m := criuLogFile.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	b, rerr := os.ReadFile(m[1])
	if rerr != nil {
		return ""
	}
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error (") {
			errs = append(errs, strings.TrimSpace(l))
			if len(errs) == 5 { // the first may be CRIU's RLIMIT_NOFILE line, not the cause
				break
			}
		}
	}
	return strings.Join(errs, "; ")
}

// restoreRows measures `podman container restore --import` of archive, n
// replicas at once (each with its own --name), reps times per n. A replica
// counts only when its guestd answers an ACI ping afterwards.
func (p *podmanPeer) restoreRows(ctx context.Context, archive string, ns []int, reps int) []result.Row {
	var rows []result.Row
	for _, n := range ns {
		lbl := p.labels("n", itoa(n))
		cmd := result.NewSeries("peer.podman_restore_import", "ms", lbl)
		usable := result.NewSeries("peer.podman_restore_verified", "ms", lbl)
		wall := result.NewSeries("peer.podman_restore.wall", "ms", lbl)
		for _, s := range []*result.Series{cmd, usable, wall} {
			s.Baseline = true
		}
		noted := false // the first failure of each n goes into the notes
		for r := 0; r < reps; r++ {
			names := make([]string, n)
			type outcome struct {
				cmd, usable time.Duration
				restored    bool
				err         error
			}
			out := make([]outcome, n)
			var wg sync.WaitGroup
			t0 := time.Now()
			for i := range n {
				names[i] = fmt.Sprintf("%s-r%d-%d", p.source, r, i)
				p.track(names[i])
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					s0 := time.Now()
					_, d, err := podman(ctx, "container", "restore", "--import", archive, "--name", names[i])
					if err != nil {
						if why := criuErrors(err); why != "" {
							err = fmt.Errorf("%w; CRIU: %s", err, why)
						}
						out[i].err = err
						return
					}
					out[i].cmd, out[i].restored = d, true
					if err := p.waitGuest(ctx, names[i], 10*time.Second); err != nil {
						out[i].err = err
						return
					}
					out[i].usable = time.Since(s0)
				}(i)
			}
			wg.Wait()
			w := time.Since(t0)
			ok := 0
			for _, o := range out {
				switch {
				case !o.restored:
					cmd.Fail()
					usable.Fail()
				case o.err != nil:
					// Restored by podman's account, but no desktop answers.
					cmd.Unverified()
					usable.Unverified()
				default:
					ok++
					cmd.Add(suiteapi.Ms(o.cmd))
					usable.Add(suiteapi.Ms(o.usable))
				}
				if o.err != nil {
					p.env.Progressf("podman restore N=%d: %v", n, o.err)
					if !noted {
						p.env.Notef("podman restore N=%d failed: %v", n, o.err)
						noted = true
					}
				}
			}
			if ok == n {
				wall.Add(suiteapi.Ms(w))
			} else {
				wall.Fail()
			}
			p.remove(ctx, names...)
			p.env.Progressf("podman restore --import N=%d rep %d: %d/%d verified in %.0f ms", n, r+1, ok, n, suiteapi.Ms(w))
		}
		rows = append(rows, cmd.Row(), usable.Row(), wall.Row())
	}
	return rows
}
