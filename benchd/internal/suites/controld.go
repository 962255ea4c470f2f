//go:build linux

package suites

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/client"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// benchLabel marks everything benchd creates through controld, so leftovers
// of an interrupted run are identifiable; a TTL removes them regardless.
const benchLabel = "forkfleet.dev/benchd"

const benchTTL = 15 * time.Minute

// controld is a connection to the daemon under test.
type controld struct {
	c  *client.Client
	sb controldv1.SandboxServiceClient
	ck controldv1.CheckpointServiceClient
	pl controldv1.PoolServiceClient
}

// checkControld skips unless the socket exists and answers.
func checkControld(ctx context.Context, env *suiteapi.Env) error {
	st, err := os.Stat(env.ControldSocket)
	if err != nil {
		return suiteapi.Skipf("controld socket %s absent (controld not running)", env.ControldSocket)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return suiteapi.Skipf("%s is not a socket", env.ControldSocket)
	}
	c, err := dialControld(ctx, env)
	if err != nil {
		return suiteapi.Skipf("controld: %v", err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.sb.ListSandboxes(cctx, &controldv1.ListSandboxesRequest{Labels: map[string]string{benchLabel: "probe"}}); err != nil {
		return suiteapi.Skipf("controld at %s does not answer: %v", env.ControldSocket, err)
	}
	return nil
}

func dialControld(ctx context.Context, env *suiteapi.Env) (*controld, error) {
	c, err := client.Dial(ctx, "unix://"+env.ControldSocket)
	if err != nil {
		return nil, err
	}
	return &controld{c: c, sb: c.SandboxService(), ck: c.CheckpointService(), pl: c.PoolService()}, nil
}

func (c *controld) Close() error { return c.c.Close() }

// create boots a default desktop and waits until it is usable.
func (c *controld) create(ctx context.Context) (*controldv1.CreateSandboxResponse, error) {
	return c.createImage(ctx, "")
}

// createImage boots image (controld's default when empty) and waits until
// it is usable.
func (c *controld) createImage(ctx context.Context, image string) (*controldv1.CreateSandboxResponse, error) {
	return c.sb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{
		Image: image, WaitReady: true, Labels: map[string]string{benchLabel: "1"}, Ttl: durationpb.New(benchTTL)})
}

// remove deletes a sandbox, ignoring a context that already ended so cleanup
// still happens on interruption.
func (c *controld) remove(ctx context.Context, id string) {
	if id == "" {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _ = c.sb.DeleteSandbox(dctx, &controldv1.DeleteSandboxRequest{Id: id})
}

// removeAll deletes the sandboxes at once, as a trainer ends the replicas
// of a fan-out together, and returns the time until the last was deleted
// and the host's busy CPU time over it (hostBusy); err is the first
// failure.
func (c *controld) removeAll(ctx context.Context, ids []string) (wall, cpu time.Duration, err error) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	busy0, berr := hostBusy()
	t0 := time.Now()
	for i, id := range ids {
		wg.Go(func() {
			_, errs[i] = c.sb.DeleteSandbox(dctx, &controldv1.DeleteSandboxRequest{Id: id})
		})
	}
	wg.Wait()
	wall = time.Since(t0)
	busy1, berr2 := hostBusy()
	if err := errors.Join(errs...); err != nil {
		return wall, 0, err
	}
	if err := errors.Join(berr, berr2); err != nil {
		return wall, 0, err
	}
	return wall, busy1 - busy0, nil
}

func (c *controld) removeCheckpoint(ctx context.Context, id string) {
	if id == "" {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _ = c.ck.DeleteCheckpoint(dctx, &controldv1.DeleteCheckpointRequest{Id: id, Cascade: true})
}

// unixEndpoint returns the endpoint's guestd socket when this process can
// reach it (same host, root).
func unixEndpoint(ep *controldv1.Endpoint) (guestsock.Addr, bool) {
	addr, err := guestsock.Parse(ep.GetUnixPath(), ep.GetUnixPidStart())
	if err != nil {
		return guestsock.Addr{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := guestsock.Dial(ctx, addr)
	if err != nil {
		return guestsock.Addr{}, false
	}
	c.Close()
	return addr, true
}

// dialEndpoint opens an ACI session to a sandbox: guestd's unix socket when
// controld exposes it on this host, else the gateway URL.
func dialEndpoint(ctx context.Context, ep *controldv1.Endpoint, opts ...aci.DialOption) (*aci.Session, error) {
	if ep == nil {
		return nil, errors.New("no endpoint")
	}
	opts = append(opts, aci.WithClientName("benchd"))
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// The unix socket straight away, as api/client does (no probe: it
	// would cost a connect on the claim-to-usable path); the URL when
	// this process cannot reach it.
	var unixErr error
	if addr, err := guestsock.Parse(ep.GetUnixPath(), ep.GetUnixPidStart()); err == nil {
		s, err := aci.DialSandbox(dctx, addr, ep.GetToken(), opts...)
		if err == nil || dctx.Err() != nil {
			return s, err
		}
		unixErr = err
	}
	if ep.GetUrl() == "" {
		return nil, fmt.Errorf("endpoint has neither a reachable unix path nor a URL (unix: %v)", unixErr)
	}
	return aci.Dial(dctx, ep.GetUrl(), ep.GetToken(), opts...)
}

// firstScreenshot dials the sandbox and takes one PNG: usable from the
// client's side.
func firstScreenshot(ctx context.Context, ep *controldv1.Endpoint) error {
	s, err := dialEndpoint(ctx, ep)
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := s.Screenshot(ctx, aci.PNG())
	if err != nil {
		return err
	}
	if !validImage("png", r) {
		return suiteapi.ErrUnverified
	}
	return nil
}

// sandboxPids finds a sandbox's processes on this host: guestd carries
// FORKFLEET_SANDBOX_ID in its environment; its descendants belong to it too.
func sandboxPids(id string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte("FORKFLEET_SANDBOX_ID=" + id + "\x00")
	parent := map[int]int{}
	var roots []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				f := strings.Fields(string(stat[i+1:]))
				if len(f) > 1 {
					pp, _ := strconv.Atoi(f[1])
					parent[pid] = pp
				}
			}
		}
		envb, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(append(envb, 0), want) {
			roots = append(roots, pid)
		}
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	// Descendants: iterate to a fixed point (the tree is shallow).
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if !in[pid] && in[pp] {
				in[pid] = true
				changed = true
			}
		}
	}
	var out []int
	for pid := range in {
		out = append(out, pid)
	}
	return out
}

// cgroupHierarchies are the cgroup v1 controllers (and the v2 root) where
// controld places a sandbox at <parent>/<sandbox-id>.
var cgroupHierarchies = []string{"memory", "pids", "freezer", "cpu,cpuacct", "unified", ""}

// cgroupPids lists the processes of the sandbox's cgroup: controld gives
// every sandbox and every fork its own (/sys/fs/cgroup/memory/forkfleet/<id>,
// or under another controld's containerd.cgroup_parent: benchd/ab.sh's).
func cgroupPids(id string) []int {
	if id == "" || strings.ContainsAny(id, "/\x00*?[\\") {
		return nil
	}
	for _, h := range cgroupHierarchies {
		procs := []string{filepath.Join("/sys/fs/cgroup", h, "forkfleet", id, "cgroup.procs"), filepath.Join("/sys/fs/cgroup", h, id, "cgroup.procs")}
		more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", h, "*", id, "cgroup.procs"))
		for _, path := range append(procs, more...) {
			data, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			var pids []int
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			if len(pids) > 0 {
				return pids
			}
		}
	}
	return nil
}

// sandboxProcs finds a sandbox's processes: its cgroup first, since a
// memory-tier fork's guestd carries the SOURCE's FORKFLEET_SANDBOX_ID (CRIU
// restores the environment with the memory), else the environment walk.
func sandboxProcs(id string) []int {
	if pids := cgroupPids(id); len(pids) > 0 {
		return pids
	}
	return sandboxPids(id)
}

// memoryOf sums RSS and PSS (MB) over pids.
func memoryOf(pids []int) (rss, pss float64, ok bool) {
	for _, pid := range pids {
		p := strconv.Itoa(pid)
		if kb, err := StatusKB(p, "VmRSS"); err == nil {
			rss += float64(kb) / 1024
		}
		data, err := os.ReadFile("/proc/" + p + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, found := strings.CutPrefix(line, "Pss:"); found {
				f := strings.Fields(rest)
				if len(f) > 0 {
					kb, _ := strconv.ParseFloat(f[0], 64)
					pss += kb / 1024
					ok = true
				}
			}
		}
	}
	return rss, pss, ok
}

// hostUsedMB is MemTotal - MemAvailable.
func hostUsedMB() float64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var total, avail float64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	return (total - avail) / 1024
}

func dur(d *durationpb.Duration) float64 {
	if d == nil {
		return 0
	}
	return suiteapi.Ms(d.AsDuration())
}

func verified(r *controldv1.ForkReplica) bool {
	if r.GetSandbox() == nil || r.GetErrorCode() != 0 {
		return false
	}
	for _, v := range r.GetVerification() {
		if !v.GetOk() {
			return false
		}
	}
	return true
}

func fmtErr(code int32, msg string) error { return fmt.Errorf("code %d: %s", code, msg) }

// dialEndpointCounted is dialEndpoint with the session's wire bytes counted
// in w, over guestd's unix socket when reachable, else the gateway URL.
func dialEndpointCounted(ctx context.Context, ep *controldv1.Endpoint, w *wireCounter, opts ...aci.DialOption) (*aci.Session, error) {
	if ep == nil {
		return nil, errors.New("no endpoint")
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	url := ep.GetUrl()
	sock, viaUnix := unixEndpoint(ep)
	if viaUnix {
		url = "ws://guestd" + aci.DefaultUnixPath
	}
	if url == "" {
		return nil, errors.New("endpoint has neither a reachable unix path nor a URL")
	}
	opts = append(opts, aci.WithClientName("benchd"), aci.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if viaUnix {
			c, err = guestsock.Dial(ctx, sock)
		} else {
			c, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		return countedConn{Conn: c, w: w}, nil
	}))
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return aci.Dial(dctx, url, ep.GetToken(), opts...)
}

// cgroupMemoryMB finds the sandbox's memory cgroup (v1 or v2) by its id in
// the path and returns its usage: the fallback when its processes cannot be
// found in /proc.
func cgroupMemoryMB(id string) (float64, bool) {
	var found float64
	ok := false
	for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || ok {
				return filepath.SkipDir
			}
			if strings.Count(strings.TrimPrefix(p, root), "/") > 4 {
				return filepath.SkipDir
			}
			if !strings.Contains(filepath.Base(p), id) {
				return nil
			}
			for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
				if b, err := os.ReadFile(filepath.Join(p, f)); err == nil {
					if v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil {
						found, ok = v/1e6, true
						return filepath.SkipAll
					}
				}
			}
			return nil
		})
		if ok {
			break
		}
	}
	return found, ok
}
