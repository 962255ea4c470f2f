//go:build linux

package containerdrt

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/cap"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
	"github.com/forkfleet/forkfleet/controld/internal/guestconn"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Root tests of issue #12's paths from a sandbox to the host. They run in
// their own namespace (testenv) on the testinit image, whose init does what
// root in a hostile sandbox may do on command.

const securityNamespace = "forkfleet-test-security"

func securityRuntime(t *testing.T) *Runtime {
	t.Helper()
	integration(t)
	r := newTestRuntime(t, securityNamespace)
	importTestImage(t, r)
	return r
}

// hostListener serves a unix socket on the host and counts what connects.
type hostListener struct {
	path  string
	conns atomic.Int32
}

func listenHost(t *testing.T, path string) *hostListener {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h := &hostListener{path: path}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.conns.Add(1)
			c.Close()
		}
	}()
	return h
}

type oneRoute map[string]fleet.Route

func (r oneRoute) Route(id string) (fleet.Route, error) {
	if rt, ok := r[id]; ok {
		return rt, nil
	}
	return fleet.Route{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// gatewayUpgrade sends an authenticated ACI upgrade through a real gateway
// routing id to inst's socket and returns the HTTP status.
func gatewayUpgrade(t *testing.T, inst runtime.Instance, token string) int {
	t.Helper()
	g := gateway.New(oneRoute{inst.ID: {Token: token, ACISocket: inst.ACISocket}}, gateway.Options{})
	srv := gateway.NewServer(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /v1/sandboxes/%s/aci HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer %s\r\n\r\n", inst.ID, token)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("gateway response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestIntegrationPlantedSocketSymlink: root in the sandbox replaces guestd's
// socket, or the directory holding it, with an absolute symlink to a host
// socket. A plain dial of /proc/<pid>/root/... lands on the host socket (the
// attack); controld's dialer, its admin sessions and the ACI gateway refuse
// the path and reach nothing on the host.
func TestIntegrationPlantedSocketSymlink(t *testing.T) {
	r := securityRuntime(t)
	ctx := context.Background()
	hostDir := t.TempDir()
	host := listenHost(t, filepath.Join(hostDir, "aci.sock"))

	for _, tc := range []struct{ name, target, link string }{
		{"socket", host.path, ACISocketInSandbox},
		{"directory", hostDir, filepath.Dir(ACISocketInSandbox)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(uniqueID("plant"))
			inst := bootT(t, r, spec)
			if got := mustCall(t, inst, "symlink "+tc.target+" "+tc.link); got != "ok" {
				t.Fatalf("plant: %s", got)
			}
			before := host.conns.Load()

			// The attack as it was: a plain path follows the link on the host.
			c, err := net.Dial("unix", inst.ACISocket.String())
			if err != nil {
				t.Fatalf("a plain dial did not follow the planted link (the test reproduces nothing): %v", err)
			}
			c.Close()
			waitFor(t, "the host socket sees the plain dial", func() bool { return host.conns.Load() == before+1 })
			before++

			if _, err := dialSandbox(inst.ACISocket, 5*time.Second); !errors.Is(err, guestsock.ErrUnsafePath) {
				t.Errorf("guestsock.Dial through a planted link: %v, want ErrUnsafePath", err)
			}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = guestconn.Dialer{}.DialGuest(dctx, inst.ACISocket, spec.AdminToken)
			cancel()
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("admin session through a planted link: %v, want FailedPrecondition (not retried)", err)
			}
			if code := gatewayUpgrade(t, inst, spec.ACIToken); code != http.StatusBadGateway {
				t.Errorf("gateway upgrade through a planted link: HTTP %d, want 502", code)
			}
			time.Sleep(50 * time.Millisecond)
			if n := host.conns.Load() - before; n != 0 {
				t.Errorf("the host socket received %d connection(s) from controld's dialers", n)
			}
		})
	}
}

// TestIntegrationSocketPidGone: an address outlives its sandbox only as an
// error; the dialer never follows a pid to whatever holds it next.
func TestIntegrationSocketPidGone(t *testing.T) {
	r := securityRuntime(t)
	inst := bootT(t, r, testSpec(uniqueID("gone")))
	if inst.ACISocket.Start == 0 {
		t.Fatalf("instance socket without the init's start time: %+v", inst.ACISocket)
	}
	deleteQuiet(r, inst.ID)
	if _, err := dialSandbox(inst.ACISocket, 5*time.Second); !errors.Is(err, guestsock.ErrProcessGone) {
		t.Fatalf("dial after delete: %v, want ErrProcessGone", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestIntegrationLayerCopyRace: root in a running sandbox swaps a
// directory of its writable layer for a symlink to a host directory
// (renameat2 RENAME_EXCHANGE, in a loop) while checkpoints copy the layer.
// 1,000 layer copies (first pass racing, second pass frozen, as Checkpoint
// runs them) and real checkpoints of both tiers carry no host byte, and
// the host directory is untouched.
func TestIntegrationLayerCopyRace(t *testing.T) {
	r := securityRuntime(t)
	ctx := r.ctx(context.Background())
	hostDir, secret := hostSecret(t)
	inst := bootT(t, r, testSpec(uniqueID("swap")))
	for i := range 8 {
		if got := mustCall(t, inst, fmt.Sprintf("write /data/d/f%d sandbox", i)); got != "ok" {
			t.Fatal(got)
		}
	}
	if got := mustCall(t, inst, "symlink "+hostDir+" /data/l"); got != "ok" {
		t.Fatal(got)
	}
	if got := mustCall(t, inst, "swap /data/d /data/l"); got != "ok" {
		t.Fatal(got)
	}
	info, err := r.client.ContainerService().Get(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := r.sn.Mounts(ctx, info.SnapshotKey)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := upperDir(ms)
	if err != nil {
		t.Fatal(err)
	}

	const copies = 1000
	work := t.TempDir()
	for i := range copies {
		dst, err := os.MkdirTemp(work, "copy-")
		if err != nil {
			t.Fatal(err)
		}
		lc := newLayerCopier(upper, dst)
		if err := lc.First(ctx); err != nil {
			t.Fatalf("copy %d: first pass: %v", i, err)
		}
		if err := r.setFreezer(ctx, inst.ID, freezerFrozen); err != nil {
			t.Fatal(err)
		}
		err = lc.Sync(ctx)
		if terr := r.setFreezer(ctx, inst.ID, freezerThawed); terr != nil {
			t.Fatal(terr)
		}
		if err != nil {
			t.Fatalf("copy %d: second pass: %v", i, err)
		}
		assertNoHostBytes(t, dst, hostDir, secret)
		if t.Failed() {
			t.Fatalf("copy %d of %d carried or touched host bytes", i, copies)
		}
		os.RemoveAll(dst)
	}
	swaps := mustCall(t, inst, "swaps")
	t.Logf("%d raced layer copies; the sandbox made %s exchanges meanwhile", copies, swaps)
	if swaps == "0" {
		t.Fatal("the sandbox never swapped: the test raced nothing")
	}

	// Whole checkpoints, their committed layers read back.
	for i, tier := range []runtime.CheckpointTier{runtime.TierDisk, runtime.TierMemory, runtime.TierDisk, runtime.TierMemory, runtime.TierDisk} {
		res := checkpointT(t, r, inst.ID, tier, false)
		key := "forkfleet-test-view-" + randomHex(4)
		vms, err := r.sn.View(ctx, key, res.Ref.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		dir, err := topLowerDir(vms)
		if err != nil {
			t.Fatal(err)
		}
		assertNoHostBytes(t, dir, hostDir, secret)
		r.sn.Remove(ctx, key)
		if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			t.Fatalf("checkpoint %d (%v) carried or touched host bytes", i, tier)
		}
	}
}

// craftCheckpointImage writes dst, a copy of the checkpoint image src as a
// hostile exporter would change it: editSpec rewrites the exported
// spec.json, editCore every CRIU core image (thread state), editMeta the
// rest of the metadata blob.
func craftCheckpointImage(t *testing.T, r *Runtime, src, dst string, editSpec func(*specs.Spec), editCore func(*criucore.CoreEntry), editMeta func(*exportedMeta)) {
	t.Helper()
	ctx, done, err := r.client.WithLease(r.ctx(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	defer done(context.Background())
	cs, is := r.client.ContentStore(), r.client.ImageService()
	img, err := is.Get(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := readCheckpointImage(ctx, cs, src, img.Target)
	if err != nil {
		t.Fatal(err)
	}
	man := ck.manifest
	layers := slices.Clone(man.Layers)
	em := ck.exported
	if editSpec != nil {
		var s specs.Spec
		if err := json.Unmarshal(em.Spec, &s); err != nil {
			t.Fatal(err)
		}
		editSpec(&s)
		if em.Spec, err = json.Marshal(&s); err != nil {
			t.Fatal(err)
		}
	}
	if editMeta != nil {
		editMeta(&em)
	}
	mb, err := json.Marshal(em)
	if err != nil {
		t.Fatal(err)
	}
	md, err := writeBytesBlob(ctx, cs, MediaTypeCheckpointMeta, mb, nil)
	if err != nil {
		t.Fatal(err)
	}
	md.Annotations = layers[len(layers)-1].Annotations
	layers[len(layers)-1] = md
	if editCore != nil {
		dir := filepath.Join(t.TempDir(), "criu")
		if err := unpackBlobs(ctx, cs, src, ck.criu, dir); err != nil {
			t.Fatal(err)
		}
		cores, _ := filepath.Glob(filepath.Join(dir, "core-*.img"))
		for _, p := range cores {
			rewriteCore(t, p, editCore)
		}
		d, err := writeStreamBlob(ctx, cs, r.client.LeasesService(), MediaTypeCheckpointCRIU, func(w io.Writer) error { return writeTreeTar(ctx, w, dir) })
		if err != nil {
			t.Fatal(err)
		}
		d.Annotations = layers[0].Annotations
		// One blob for the rewritten images, in place of every part.
		layers = append([]ocispec.Descriptor{d}, layers[len(ck.criu):]...)
	}
	man.Layers = layers
	manb, err := json.Marshal(man)
	if err != nil {
		t.Fatal(err)
	}
	gc := map[string]string{gcRefContentPrefix + "config": man.Config.Digest.String()}
	for i, l := range layers {
		gc[gcRefContentPrefix+"l."+strconv.Itoa(i)] = l.Digest.String()
	}
	desc, err := writeBytesBlob(ctx, cs, ocispec.MediaTypeImageManifest, manb, gc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Create(ctx, images.Image{Name: dst, Target: desc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Delete(r.ctx(context.Background()), dst) })
}

// rewriteCore edits one CRIU core image in place, keeping its header.
func rewriteCore(t *testing.T, path string, edit func(*criucore.CoreEntry)) {
	t.Helper()
	var core criucore.CoreEntry
	if err := readSingleEntry(path, magic.LoadMagic().ByName["CORE"], &core); err != nil {
		t.Fatal(err)
	}
	edit(&core)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(&core)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), b[:8]...) // common magic, CORE magic
	out = binary.LittleEndian.AppendUint32(out, uint32(len(body)))
	if err := os.WriteFile(path, append(out, body...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// statusField returns a field of the /proc status of a sandbox's init (and
// of every thread: they must agree).
func statusField(t *testing.T, inst runtime.Instance, field string) string {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", inst.PID))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("tasks of %s: %v", inst.ID, err)
	}
	got := map[string]bool{}
	for _, p := range tasks {
		got[procField(t, p, field)] = true
	}
	if len(got) != 1 {
		t.Errorf("%s: the threads of its init disagree on %s: %v", inst.ID, field, got)
	}
	return procField(t, tasks[0], field)
}

func procField(t *testing.T, path, field string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestIntegrationImportedCheckpointPolicy: an imported checkpoint brings
// process state and a layer, nothing else. Its spec.json, rewritten to
// grant every capability, drop seccomp and no_new_privs and bind-mount the
// host's /etc, is ignored: memory and disk forks run under this host's
// policy. CRIU images whose threads hold extra capabilities, or run without
// seccomp, are refused at import with CHECKPOINT_POLICY.
func TestIntegrationImportedCheckpointPolicy(t *testing.T) {
	r := securityRuntime(t)
	ctx := r.ctx(context.Background())
	src := bootT(t, r, testSpec(uniqueID("pol")))
	mustCall(t, src, "set policy-value")
	wantCaps := statusField(t, src, "CapBnd")
	if wantCaps == "" {
		t.Fatal("no CapBnd in the source's status")
	}
	mem := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	disk := checkpointT(t, r, src.ID, runtime.TierDisk, false)

	// The host's own checkpoint passes its own policy.
	pol, err := r.processPolicy(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkProcessState(filepath.Join(mem.Ref.Dir, criuImageDir), pol); err != nil {
		t.Fatalf("the host's own checkpoint fails its policy: %v", err)
	}

	hostile := func(s *specs.Spec) {
		all := cap.Known()
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: all, Effective: all, Permitted: all, Inheritable: all, Ambient: all}
		s.Process.NoNewPrivileges = false
		s.Linux.Seccomp = nil
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = nil, nil
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/hostetc", Type: "bind", Source: "/etc", Options: []string{"rbind", "rw"}})
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/hostmem", Type: "c", Major: 1, Minor: 1})
	}
	for _, tc := range []struct {
		name string
		ref  runtime.CheckpointRef
	}{{"memory", mem.Ref}, {"disk", disk.Ref}} {
		t.Run(tc.name, func(t *testing.T) {
			exported := "localhost/forkfleet/sec-it-ck:" + randomHex(4)
			crafted := exported + "-crafted"
			if _, err := r.ExportCheckpoint(ctx, tc.ref, nil, exported); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.client.ImageService().Delete(r.ctx(context.Background()), exported) })
			craftCheckpointImage(t, r, exported, crafted, hostile, nil, nil)
			ref, _, err := r.ImportCheckpoint(ctx, crafted, filepath.Join(r.cfg.CheckpointRoot, uniqueID("crafted")))
			if err != nil {
				t.Fatalf("import of a checkpoint with a hostile spec.json: %v", err)
			}
			t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), ref) })
			f := restoreT(t, r, testSpec(uniqueID("polf")), ref)
			if tc.name == "memory" {
				if got := mustCall(t, f, "get"); got != "policy-value" {
					t.Errorf("fork value %q", got)
				}
			}
			if got := statusField(t, f, "CapBnd"); got != wantCaps {
				t.Errorf("fork's bounding set %s, want this host's %s", got, wantCaps)
			}
			if got := statusField(t, f, "Seccomp"); got != "2" {
				t.Errorf("fork's seccomp mode %q, want 2 (filter)", got)
			}
			if got := statusField(t, f, "NoNewPrivs"); got != "1" {
				t.Errorf("fork's no_new_privs %q, want 1", got)
			}
			if mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", f.PID)); err != nil || strings.Contains(string(mi), "/hostetc") {
				t.Errorf("the host mount of the imported spec is in the fork:\n%s", mi)
			}
			if got := mustCall(t, f, "read /dev/hostmem"); !strings.HasPrefix(got, "error") {
				t.Errorf("the device of the imported spec is in the fork: %q", got)
			}
		})
	}

	// Process state beyond the policy: refused at import.
	exported := "localhost/forkfleet/sec-it-ck:" + randomHex(4)
	if _, err := r.ExportCheckpoint(ctx, mem.Ref, nil, exported); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.client.ImageService().Delete(r.ctx(context.Background()), exported) })

	// A host that never dumped a sandbox learns its own filter first (a
	// throwaway sandbox of the base image), then admits an honest import.
	fresh := newTestRuntime(t, securityNamespace)
	if n := len(fresh.seccomp.snapshot()); n != 0 {
		t.Fatalf("a fresh runtime knows %d seccomp filters", n)
	}
	fref, _, err := fresh.ImportCheckpoint(ctx, exported, filepath.Join(fresh.cfg.CheckpointRoot, uniqueID("honest")))
	if err != nil {
		t.Fatalf("honest import on a host without a reference: %v", err)
	}
	fresh.DeleteCheckpoint(ctx, fref)
	if n := len(fresh.seccomp.snapshot()); n != 1 {
		t.Errorf("the fresh runtime learned %d seccomp filters, want 1", n)
	}
	for name, edit := range map[string]func(*criucore.CoreEntry){
		"capabilities": func(c *criucore.CoreEntry) {
			cr := c.GetThreadCore().GetCreds()
			full := []uint32{^uint32(0), 0x1ff}
			cr.CapBnd, cr.CapPrm, cr.CapEff = full, full, full
		},
		"no seccomp": func(c *criucore.CoreEntry) {
			mode := criucore.SeccompMode_disabled
			c.GetThreadCore().SeccompMode = &mode
			c.GetThreadCore().SeccompFilter = nil
		},
	} {
		crafted := exported + "-" + strings.ReplaceAll(name, " ", "-")
		craftCheckpointImage(t, r, exported, crafted, nil, edit, nil)
		snapsBefore := countSnapshots(t, r)
		dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("refused"))
		_, _, err := r.ImportCheckpoint(ctx, crafted, dir)
		// Refused once unpacked: nothing of the attempt stays.
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused import (%s) left its dir: %v", name, err)
		}
		if n := countSnapshots(t, r); n > snapsBefore {
			t.Errorf("snapshots: %d before, %d after a refused import (%s)", snapsBefore, n, name)
		}
		var re *errdefs.ReasonError
		if !errors.As(err, &re) || re.Reason != "CHECKPOINT_POLICY" || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("import of CRIU images with %s: %v, want FAILED_PRECONDITION CHECKPOINT_POLICY", name, err)
		} else {
			t.Logf("refused (%s): %v", name, err)
		}
	}
}
