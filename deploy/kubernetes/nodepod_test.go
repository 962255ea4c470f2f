package kubernetes

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/netnsfile"
	toml "github.com/pelletier/go-toml/v2"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// DesktopImageLayout is the desktop image's OCI layout (make image), which
// the test imports into the pod's containerd.
const DesktopImageLayout = "/var/cache/forkfleet/images/desktop-oci"

// The downward API's values the test's pod gets: its node's name and its
// address (the pod's network namespace has only its loopback).
const (
	podNodeName = "node-it"
	podIP       = "127.0.0.1"
)

// TestNodePod runs the built node image (make image-node) as the
// DaemonSet runs it, through runc directly (the kubelet's containerd would
// do the same): a pod sandbox holding the pod's pid, network, IPC and UTS
// namespaces (shareProcessNamespace), and the DaemonSet's container in it,
// privileged as CRI makes a privileged container (every capability of the
// bounding set, no seccomp, AppArmor or masked paths, a writable sysfs and
// cgroupfs in a cgroup namespace of its own), with the image's entrypoint,
// its arguments, env (the downward API filled in) and volume mounts:
// temporary directories stand in for the node's host paths (shared bind
// mounts for Bidirectional propagation, a small btrfs with quotas for the
// layers, as a node needs), the ConfigMap's files, a certificate and a
// token for the Secrets. Then containerd answers on the socket in the host
// path, controld's /readyz (the readiness probe, dialled in the pod's
// network namespace as the kubelet dials the pod's address) answers 200, a
// client on the host gets GetHostStatus through controld's socket in the
// host path directory (the node's name, the image's controld version), and
// the desktop image, imported through containerd's socket, boots a sandbox
// in the pod whose memory checkpoint forks a replica that passes every
// verification level.
func TestNodePod(t *testing.T) {
	needNodePod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	img := readLayout(t, NodeImageLayout)
	objs := manifests(t)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	cm := objs["ConfigMap"].(*corev1.ConfigMap)
	p := newTestPod(t, img, ds.Spec.Template.Spec, cm)

	for _, c := range ds.Spec.Template.Spec.Containers {
		p.start(ctx, c.Name)
	}
	ctlCfg := controldConfig(t, cm)
	sock := p.hostPath(ctlCfg.Containerd.Address)
	waitFor(ctx, t, p, "containerd's socket "+sock, func() error {
		_, err := os.Stat(sock)
		return err
	})

	// controld's readiness probe: GET /readyz on its metrics port.
	node := container(t, ds.Spec.Template.Spec, "node")
	probe := node.ReadinessProbe.HTTPGet
	var port int32
	for _, cp := range node.Ports {
		if cp.Name == probe.Port.StrVal {
			port = cp.ContainerPort
		}
	}
	waitFor(ctx, t, p, "controld's readiness probe", func() error {
		return p.httpGet(net.JoinHostPort(podIP, strconv.Itoa(int(port))), probe.Path)
	})

	// A client on the host, through controld's socket in the host path.
	ctl := buildTool(t, "api", "forkfleetctl")
	addr := "unix://" + p.hostPath(ctlCfg.GRPC.UnixSocket)
	forkfleetctl := func(args ...string) []byte {
		t.Helper()
		out, err := exec.CommandContext(ctx, ctl, append([]string{"--address", addr, "-o", "json"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("forkfleetctl %s: %v\n%s\n%s", strings.Join(args, " "), err, out, p.logs())
		}
		return out
	}
	var status struct {
		Host             string
		Version          string
		MemoryTotalBytes string `json:"memoryTotalBytes"`
		MaxSandboxes     int    `json:"maxSandboxes"`
	}
	if err := json.Unmarshal(forkfleetctl("host", "status"), &status); err != nil {
		t.Fatal(err)
	}
	if status.Host != podNodeName {
		t.Errorf("host %q, want the node's name %q (--host=$(NODE_NAME))", status.Host, podNodeName)
	}
	if want := img.labels["org.opencontainers.image.version"]; status.Version != want {
		t.Errorf("controld version %q, the image's %q", status.Version, want)
	}
	if status.MemoryTotalBytes == "" || status.MaxSandboxes == 0 {
		t.Errorf("no room reported: %+v", status)
	}

	// A sandbox in the pod: the desktop image imported into the node's
	// containerd through its socket in the host path (as an operator
	// imports it, README.md "Image"), one boot, a memory checkpoint (CRIU
	// in the image, with its preload) and a fork of it verified at every
	// level it supports.
	if _, err := os.Stat(filepath.Join(DesktopImageLayout, "index.json")); err != nil {
		t.Fatalf("no desktop image layout (make image): %v", err)
	}
	importer := buildTool(t, "controld", "forkfleet-image")
	if out, err := exec.CommandContext(ctx, importer, "import", "--address", sock, "--namespace", ctlCfg.Containerd.Namespace, DesktopImageLayout).CombinedOutput(); err != nil {
		t.Fatalf("import the desktop image: %v\n%s", err, out)
	}
	type sandbox struct{ ID, State string }
	var created struct{ Sandbox sandbox }
	if err := json.Unmarshal(forkfleetctl("sandbox", "create"), &created); err != nil {
		t.Fatal(err)
	}
	sb := created.Sandbox
	if sb.State != "SANDBOX_STATE_READY" {
		t.Fatalf("sandbox %s is %s, not ready", sb.ID, sb.State)
	}
	var ck struct{ Checkpoint struct{ ID string } }
	if err := json.Unmarshal(forkfleetctl("checkpoint", "create", sb.ID), &ck); err != nil {
		t.Fatal(err)
	}
	fork := forkfleetctl("checkpoint", "fork", ck.Checkpoint.ID, "--count", "1")
	var forked struct {
		Replicas []struct {
			Sandbox      sandbox
			ErrorMessage string `json:"errorMessage"`
			Verification []struct {
				Level string
				Ok    bool
			}
		}
	}
	if err := json.Unmarshal(fork, &forked); err != nil {
		t.Fatalf("fork: %v\n%s", err, fork)
	}
	if len(forked.Replicas) != 1 || forked.Replicas[0].ErrorMessage != "" || len(forked.Replicas[0].Verification) == 0 {
		t.Fatalf("fork of %s: %s", ck.Checkpoint.ID, fork)
	}
	for _, l := range forked.Replicas[0].Verification {
		if !l.Ok {
			t.Errorf("the replica fails verification %s: %s", l.Level, fork)
		}
	}
	t.Logf("in the pod: sandbox %s, checkpoint %s, replica %s: %s", sb.ID, ck.Checkpoint.ID, forked.Replicas[0].Sandbox.ID, fork)

	// CRIU kept its kernel feature cache, on the pod's tmpfs /run.
	if out, err := p.runc(ctx, "exec", p.id("node"), "test", "-s", "/run/criu.kdat"); err != nil {
		t.Errorf("no /run/criu.kdat in the container after CRIU ran: %v %s", err, out)
	}

	// The kubelet stops the container with SIGTERM, then SIGKILL after the
	// grace period: the entrypoint stops controld, then containerd, well
	// within it.
	grace := time.Duration(*ds.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	if out, err := p.runc(ctx, "kill", p.id("node"), "TERM"); err != nil {
		t.Fatalf("runc kill TERM: %v\n%s", err, out)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, grace)
	defer stopCancel()
	p.waitStopped(stopCtx, "node", "the container's end after SIGTERM")
	log, err := os.ReadFile(filepath.Join(p.dir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "forkfleet-node: stopping") || !strings.Contains(string(log), "controld shutting down") {
		t.Errorf("no ordered stop in the container's log:\n%s", p.logs())
	}
	// controld's last shutdown step removes its socket.
	if _, err := os.Stat(p.hostPath(ctlCfg.GRPC.UnixSocket)); !os.IsNotExist(err) {
		t.Errorf("controld's socket after its stop: %v", err)
	}
}

// TestNodePodContainerdExit: when containerd ends, the entrypoint stops
// controld and the container ends, so the kubelet restarts both rather
// than leave a controld without its containerd.
func TestNodePodContainerdExit(t *testing.T) {
	needNodePod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	objs := manifests(t)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	cm := objs["ConfigMap"].(*corev1.ConfigMap)
	p := newTestPod(t, readLayout(t, NodeImageLayout), ds.Spec.Template.Spec, cm)
	p.start(ctx, "node")
	sock := p.hostPath(controldConfig(t, cm).GRPC.UnixSocket)
	waitFor(ctx, t, p, "controld's socket", func() error {
		_, err := os.Stat(sock)
		return err
	})
	if out, err := p.runc(ctx, "exec", p.id("node"), "sh", "-c", "kill -KILL $(pidof containerd)"); err != nil {
		t.Fatalf("kill containerd: %v\n%s", err, out)
	}
	p.waitStopped(ctx, "node", "the container's end after containerd's")
	log, err := os.ReadFile(filepath.Join(p.dir, "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "containerd exited (status 137): stopping controld") || !strings.Contains(string(log), "controld shutting down") {
		t.Errorf("no ordered stop after containerd's end:\n%s", p.logs())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("controld's socket after its stop: %v", err)
	}
}

// needNodePod opts a test in that runs the node image as a pod, and fails
// loudly when this machine cannot.
func needNodePod(t *testing.T) {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("needs root, runc, btrfs-progs, the node image (make image-node) and FORKFLEET_INTEGRATION=1")
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s runs runc and mounts: run it as root", t.Name())
	}
	for _, tool := range []string{"runc", "tar", "mkfs.btrfs", "btrfs", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (make host installs it)", tool, err)
		}
	}
	if _, err := os.Stat(filepath.Join(NodeImageLayout, "index.json")); err != nil {
		t.Fatalf("no node image (make image-node): %v", err)
	}
}

// podControldConfig is what the tests read of the ConfigMap's controld.toml.
type podControldConfig struct {
	GRPC struct {
		UnixSocket string `toml:"unix_socket"`
	} `toml:"grpc"`
	Containerd struct{ Address, Namespace string }
	LayersDir  string `toml:"layers_dir"`
}

func controldConfig(t *testing.T, cm *corev1.ConfigMap) podControldConfig {
	t.Helper()
	var cfg podControldConfig
	if err := toml.Unmarshal([]byte(cm.Data["controld.toml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testPod is the DaemonSet's pod run with runc: a sandbox container
// holding the pod's namespaces, and the DaemonSet's containers.
type testPod struct {
	t       *testing.T
	img     nodeImage
	spec    corev1.PodSpec
	dir     string
	rootfs  string            // the image's layers, extracted
	sources map[string]string // volume name -> host directory
	state   string            // runc --root
	cgroup  string            // the pod's cgroup, below the host's root
	prefix  string            // of the runc container ids
	sandbox int               // the pod sandbox's pid
}

func newTestPod(t *testing.T, img nodeImage, spec corev1.PodSpec, cm *corev1.ConfigMap) *testPod {
	t.Helper()
	suffix := os.Getenv("FORKFLEET_TEST_SUFFIX")
	p := &testPod{
		t: t, img: img, spec: spec, dir: t.TempDir(),
		sources: map[string]string{},
		prefix:  "forkfleet-node-it" + suffix,
	}
	p.cgroup = "/" + p.prefix
	p.state = filepath.Join(p.dir, "runc")

	// The image's layers, once; each container gets an overlay over them.
	p.rootfs = filepath.Join(p.dir, "image")
	if err := os.Mkdir(p.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range img.layers {
		if out, err := exec.Command("tar", "--numeric-owner", "-xpf", l, "-C", p.rootfs).CombinedOutput(); err != nil {
			t.Fatalf("extract %s: %v\n%s", l, err, out)
		}
	}

	// Cleanup runs after every mount's own (t.Cleanup is last in, first
	// out): runc's containers first, then the cgroups they leave.
	t.Cleanup(p.removeCgroups)
	for _, v := range spec.Volumes {
		src := filepath.Join(p.dir, "volumes", v.Name)
		switch {
		case v.HostPath != nil:
			// The node's directory, a shared mount as on a systemd node,
			// so Bidirectional propagation works both ways.
			src = filepath.Join(p.dir, "node", v.HostPath.Path)
			mkdir(t, src)
			p.mount(src, src, "", unix.MS_BIND, "")
			p.mount("", src, "", unix.MS_SHARED, "")
		case v.EmptyDir != nil:
			mkdir(t, src)
			if v.EmptyDir.Medium == corev1.StorageMediumMemory {
				opts := "mode=0755"
				if l := v.EmptyDir.SizeLimit; l != nil {
					opts += fmt.Sprintf(",size=%d", l.Value())
				}
				p.mount("tmpfs", src, "tmpfs", 0, opts)
			}
		case v.ConfigMap != nil && v.ConfigMap.Name == cm.Name:
			mkdir(t, src)
			for k, data := range cm.Data {
				writeFile(t, filepath.Join(src, k), []byte(data), 0o644)
			}
		case v.Secret != nil && v.Secret.SecretName == "forkfleet-controld-tls":
			mkdir(t, src)
			crt, key := selfSigned(t)
			writeFile(t, filepath.Join(src, corev1.TLSCertKey), crt, 0o400)
			writeFile(t, filepath.Join(src, corev1.TLSPrivateKeyKey), key, 0o400)
		case v.Secret != nil && v.Secret.SecretName == "forkfleet-controld-token":
			mkdir(t, src)
			writeFile(t, filepath.Join(src, "token"), []byte(rand.Text()+"\n"), 0o400)
		default:
			t.Fatalf("volume %s: the test has no stand-in for it", v.Name)
		}
		p.sources[v.Name] = src
	}

	// The layers filesystem a node has (README.md, "Nodes"): a btrfs with
	// quotas at controld's layers_dir, here a small one in a file.
	layers := p.hostPath(controldConfig(t, cm).LayersDir)
	mkdir(t, layers)
	file := filepath.Join(p.dir, "layers.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 256<<20); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"mkfs.btrfs", "-q", file}, {"mount", "-o", "loop", file, layers}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	t.Cleanup(func() { p.unmount(layers) })
	if out, err := exec.Command("btrfs", "quota", "enable", layers).CombinedOutput(); err != nil {
		t.Fatalf("btrfs quota enable: %v\n%s", err, out)
	}

	// The pod sandbox: it holds the namespaces the containers join.
	p.sandbox = p.run(context.Background(), "sandbox", []string{"/bin/sleep", "infinity"}, nil, nil, false)
	return p
}

func (p *testPod) id(name string) string { return p.prefix + "-" + name }

// hostPath is where the pod's path lies on the (stand-in) node, through the
// host path volume holding it.
func (p *testPod) hostPath(inPod string) string {
	p.t.Helper()
	for _, v := range p.spec.Volumes {
		if v.HostPath != nil && under(inPod, v.HostPath.Path) {
			return filepath.Join(p.dir, "node", inPod)
		}
	}
	p.t.Fatalf("%s is under none of the pod's host paths", inPod)
	return ""
}

func (p *testPod) mount(src, dst, fstype string, flags uintptr, data string) {
	p.t.Helper()
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		p.t.Fatalf("mount %s on %s: %v", src, dst, err)
	}
	if flags&unix.MS_BIND != 0 || fstype != "" {
		p.t.Cleanup(func() { p.unmount(dst) })
	}
}

// unmount detaches dst and every mount below it (what containerd and
// controld mounted there and propagated back).
func (p *testPod) unmount(dst string) {
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
		p.t.Errorf("unmount %s: %v", dst, err)
	}
}

// start runs one of the DaemonSet's containers as the kubelet would.
func (p *testPod) start(ctx context.Context, name string) {
	p.t.Helper()
	c := container(p.t, p.spec, name)
	env := map[string]string{}
	var envList []string
	for _, e := range p.img.env {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			switch f.FieldRef.FieldPath {
			case "spec.nodeName":
				v = podNodeName
			case "status.podIP":
				v = podIP
			default:
				p.t.Fatalf("container %s: env %s from %s: the test has no value for it", name, e.Name, f.FieldRef.FieldPath)
			}
		}
		env[e.Name] = v
	}
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}
	// $(VAR) in command and args, as the kubelet expands them.
	expand := func(s []string) []string {
		out := make([]string, len(s))
		for i, a := range s {
			out[i] = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(a, func(m string) string {
				if v, ok := env[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		}
		return out
	}
	args := c.Command
	if len(args) == 0 {
		args = p.img.config.Entrypoint
	}
	args = append(expand(args), expand(c.Args)...)
	p.run(ctx, name, args, envList, c.VolumeMounts, true)
}

// run makes and starts container name with runc; joined: in the pod
// sandbox's namespaces. It returns the container's pid.
func (p *testPod) run(ctx context.Context, name string, args, env []string, mounts []corev1.VolumeMount, joined bool) int {
	p.t.Helper()
	bundle := filepath.Join(p.dir, "bundles", name)
	root := filepath.Join(bundle, "rootfs")
	for _, d := range []string{root, filepath.Join(bundle, "upper"), filepath.Join(bundle, "work")} {
		mkdir(p.t, d)
	}
	p.mount("overlay", root, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", p.rootfs, bundle, bundle))

	caps := boundingCaps(p.t)
	if len(env) == 0 {
		env = p.img.env
	}
	cwd := p.img.config.WorkingDir
	if cwd == "" {
		cwd = "/"
	}
	type mount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type,omitempty"`
		Source      string   `json:"source,omitempty"`
		Options     []string `json:"options,omitempty"`
	}
	ms := []mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		// Privileged: the node's devices.
		{Destination: "/dev", Type: "bind", Source: "/dev", Options: []string{"rbind", "rprivate"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		// Privileged: sysfs and cgroupfs writable.
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "rw"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "rw"}},
	}
	if hybridCgroups() {
		// A cgroup v1 host with the v2 hierarchy beside (systemd's
		// hybrid layout, these machines): runc mounts the v1 controllers
		// only, and CRIU dumps every hierarchy a task is in. The pod gets
		// the node's layout; on a cgroup v2 node (what the kubelet runs on
		// since Kubernetes 1.35) runc's cgroup mount is all there is.
		ms = append(ms, mount{Destination: "/sys/fs/cgroup/unified", Type: "cgroup2", Source: "cgroup2", Options: []string{"nosuid", "noexec", "nodev", "rw"}})
	}
	propagation := "rprivate"
	// Shallow paths first, as CRI orders them: /run before /run/forkfleet.
	mounts = slices.Clone(mounts)
	slices.SortStableFunc(mounts, func(a, b corev1.VolumeMount) int {
		return strings.Count(filepath.Clean(a.MountPath), "/") - strings.Count(filepath.Clean(b.MountPath), "/")
	})
	for _, m := range mounts {
		opts := []string{"rbind", "rprivate"}
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			opts[1] = "rshared"
			propagation = "rshared"
		}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		src, ok := p.sources[m.Name]
		if !ok {
			p.t.Fatalf("container %s mounts %s: no such volume", name, m.Name)
		}
		ms = append(ms, mount{Destination: m.MountPath, Type: "bind", Source: src, Options: opts})
	}
	type ns struct {
		Type string `json:"type"`
		Path string `json:"path,omitempty"`
	}
	nss := []ns{{Type: "mount"}, {Type: "cgroup"}}
	for _, n := range []struct{ typ, file string }{{"pid", "pid"}, {"network", "net"}, {"ipc", "ipc"}, {"uts", "uts"}} {
		if joined {
			nss = append(nss, ns{Type: n.typ, Path: fmt.Sprintf("/proc/%d/ns/%s", p.sandbox, n.file)})
		} else {
			nss = append(nss, ns{Type: n.typ})
		}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": args, "env": env, "cwd": cwd,
			"user":         map[string]int{"uid": 0, "gid": 0},
			"capabilities": map[string][]string{"bounding": caps, "effective": caps, "permitted": caps},
		},
		"root":   map[string]any{"path": root},
		"mounts": ms,
		"linux": map[string]any{
			"namespaces":        nss,
			"cgroupsPath":       p.cgroup + "/" + name,
			"rootfsPropagation": propagation,
		},
	}
	if !joined {
		spec["hostname"] = "forkfleet-node-it"
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		p.t.Fatal(err)
	}
	writeFile(p.t, filepath.Join(bundle, "config.json"), b, 0o600)

	log, err := os.Create(filepath.Join(p.dir, name+".log"))
	if err != nil {
		p.t.Fatal(err)
	}
	defer log.Close()
	pidFile := filepath.Join(bundle, "pid")
	id := p.id(name)
	cmd := exec.CommandContext(ctx, "runc", "--root", p.state, "run", "--detach", "--bundle", bundle, "--pid-file", pidFile, id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, log, log
	// The container's first process inherits these; runc --detach returns
	// once it runs.
	p.t.Cleanup(func() {
		// Killing the sandbox's init ends its pid namespace: every process
		// of the pod, the shims too.
		_, _ = p.runc(context.Background(), "kill", id, "KILL")
		if out, err := p.runc(context.Background(), "delete", "--force", id); err != nil {
			p.t.Errorf("runc delete %s: %v\n%s", id, err, out)
		}
	})
	if err := cmd.Run(); err != nil {
		p.t.Fatalf("runc run %s: %v\n%s", name, err, p.logs())
	}
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		p.t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

func (p *testPod) runc(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "runc", append([]string{"--root", p.state}, args...)...).CombinedOutput()
}

// logs is every container's output so far, for a failure's message.
func (p *testPod) logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if len(data) > 8<<10 {
			data = data[len(data)-8<<10:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", filepath.Base(f), data)
	}
	return b.String()
}

// httpGet GETs path at addr in the pod's network namespace, as the
// kubelet's httpGet probe does at the pod's address; 200 or an error.
func (p *testPod) httpGet(addr, path string) error {
	var conn net.Conn
	err := netnsfile.Run(fmt.Sprintf("/proc/%d/ns/net", p.sandbox), func() (err error) {
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	if err := req.Write(conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return nil
}

// hybridCgroups says whether this host has systemd's hybrid cgroup layout:
// v1 controllers, and the v2 hierarchy at /sys/fs/cgroup/unified.
func hybridCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// removeCgroups removes the pod's cgroup trees (one per v1 hierarchy, or
// the v2 one), deepest first: runc removes its containers' own, not what
// containerd made below them.
func (p *testPod) removeCgroups() {
	roots, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", p.cgroup))
	roots = append(roots, filepath.Join("/sys/fs/cgroup", p.cgroup))
	var dirs []string
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !os.IsNotExist(err) {
			p.t.Errorf("cgroup %s: %v", dirs[i], err)
		}
	}
}

// waitStopped waits until runc reports the pod's container name stopped.
func (p *testPod) waitStopped(ctx context.Context, name, what string) {
	p.t.Helper()
	waitFor(ctx, p.t, p, what, func() error {
		out, err := p.runc(ctx, "state", p.id(name))
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		var st struct{ Status string }
		if err := json.Unmarshal(out, &st); err != nil {
			return err
		}
		if st.Status != "stopped" {
			return fmt.Errorf("status %s", st.Status)
		}
		return nil
	})
}

// waitFor polls ok until it returns nil, failing with the pod's logs when
// ctx ends first.
func waitFor(ctx context.Context, t *testing.T, p *testPod, what string, ok func() error) {
	t.Helper()
	for {
		err := ok()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v\n%s", what, err, p.logs())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// boundingCaps names every capability in this process's bounding set:
// what CRI gives a privileged container (root on some hosts lacks a few).
func boundingCaps(t *testing.T) []string {
	t.Helper()
	names := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
		"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
		"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
		"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
		"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
		"CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
		"CAP_CHECKPOINT_RESTORE",
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapBnd:\s*([0-9a-f]+)$`).FindSubmatch(status)
	if m == nil {
		t.Fatal("no CapBnd in /proc/self/status")
	}
	bnd, err := strconv.ParseUint(string(m[1]), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	var caps []string
	for i, n := range names {
		if bnd&(1<<i) != 0 {
			caps = append(caps, n)
		}
	}
	return caps
}

// selfSigned is a certificate and key for controld's TLS listeners, naming
// the Service and the pod's address.
func selfSigned(t *testing.T) (crt, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial := make([]byte, 16)
	_, _ = rand.Read(serial)
	tmpl := &x509.Certificate{
		SerialNumber: new(big.Int).SetBytes(serial),
		Subject:      pkix.Name{CommonName: "controld.forkfleet.svc " + hex.EncodeToString(serial[:4])},
		DNSNames:     []string{"controld.forkfleet.svc"},
		IPAddresses:  []net.IP{net.ParseIP(podIP)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// buildTool builds module's ./cmd/name from this checkout, for the host
// side (the client, the image importer).
func buildTool(t *testing.T, module, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = filepath.Join("..", "..", module)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return bin
}

func mkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, f string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(f, b, mode); err != nil {
		t.Fatal(err)
	}
}
