// Package kubernetes holds the test of forkfleet's Kubernetes manifests. It
// is a module of its own so that the Kubernetes API types it decodes into
// never enter controld's, guestd's or the client's builds.
package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// manifests decodes every *.yaml here strictly (unknown or duplicate
// fields fail, as kubectl's --validate=strict does) into the official API
// types, one object per file.
func manifests(t *testing.T) map[string]runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme, json.SerializerOptions{Yaml: true, Strict: true})
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("manifests: %v %v", files, err)
	}
	out := map[string]runtime.Object{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("\n---")) {
			t.Fatalf("%s: one object per file", f)
		}
		obj, gvk, err := dec.Decode(b, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[gvk.Kind] = obj
	}
	return out
}

func TestManifests(t *testing.T) {
	objs := manifests(t)
	ns := objs["Namespace"].(*corev1.Namespace)
	cm := objs["ConfigMap"].(*corev1.ConfigMap)
	svc := objs["Service"].(*corev1.Service)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	if len(objs) != 4 {
		t.Fatalf("kinds %v", slices.Collect(func(yield func(string) bool) {
			for k := range objs {
				yield(k)
			}
		}))
	}
	for _, m := range []string{cm.Namespace, svc.Namespace, ds.Namespace} {
		if m != ns.Name {
			t.Errorf("object in namespace %q, not %q", m, ns.Name)
		}
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Error("the namespace does not admit privileged pods")
	}

	pod := ds.Spec.Template
	for k, v := range ds.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("DaemonSet selector %s=%s does not match its pods", k, v)
		}
	}
	// Headless, selecting the DaemonSet's pods, on ports they name.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service clusterIP %q: clients route per host, it must be headless", svc.Spec.ClusterIP)
	}
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("Service selector %s=%s selects no pod of the DaemonSet", k, v)
		}
	}
	ports := map[string]int32{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type != intstr.String || ports[p.TargetPort.StrVal] != p.Port {
			t.Errorf("Service port %s: target %v is not a container port %d", p.Name, p.TargetPort, p.Port)
		}
	}

	// Every mount names a volume, the config volume the ConfigMap.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			v, ok := vols[m.Name]
			if !ok {
				t.Errorf("container %s mounts %s: no such volume", c.Name, m.Name)
			}
			if v.ConfigMap != nil && v.ConfigMap.Name != cm.Name {
				t.Errorf("volume %s: ConfigMap %s is not %s", v.Name, v.ConfigMap.Name, cm.Name)
			}
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional &&
				(c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged) {
				t.Errorf("container %s: Bidirectional propagation needs a privileged container", c.Name)
			}
		}
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			t.Errorf("container %s: runc and CRIU need it privileged (README.md, Privileges)", c.Name)
		}
	}
	var hostPaths []string
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	slices.Sort(hostPaths)
	// The node's paths forkfleet uses, and nothing else of the node's.
	if want := []string{"/run/forkfleet", "/var/lib/forkfleet"}; !slices.Equal(hostPaths, want) {
		t.Errorf("host paths %v, want %v", hostPaths, want)
	}
	if pod.Spec.HostPID || pod.Spec.HostNetwork || pod.Spec.HostIPC {
		t.Error("the pod shares the node's pid, network or IPC namespace: the sandboxes need none of them")
	}
	if pod.Spec.ShareProcessNamespace == nil || !*pod.Spec.ShareProcessNamespace {
		t.Error("the pod's sandbox must be its init (shareProcessNamespace): it reaps the shims containerd leaves")
	}
	// containerd and controld in one container: controld sees the
	// sandboxes' cgroups and runc's state only in containerd's cgroup and
	// mount namespaces.
	if len(pod.Spec.Containers) != 1 {
		t.Errorf("%d containers: containerd and controld run in one (README.md, One container)", len(pod.Spec.Containers))
	}

	// Both containers run the image images/node/build.sh names.
	image, _ := buildScriptConfig(t)
	for _, c := range pod.Spec.Containers {
		if c.Image != image {
			t.Errorf("container %s runs %s, not the node image %s (images/node/build.sh)", c.Name, c.Image, image)
		}
	}

	node := container(t, pod.Spec, "node")
	if node.ReadinessProbe == nil || node.ReadinessProbe.HTTPGet == nil || node.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("controld's readiness is /readyz: a reconciling controld must stay out of the Service")
	}
	checkControldConfig(t, cm, node)
	checkContainerdConfig(t, cm, node)
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// checkControldConfig runs controld's own configuration loading (strict
// TOML, every validation) on the ConfigMap's file with the DaemonSet's
// flags, the downward API's values filled in.
func checkControldConfig(t *testing.T, cm *corev1.ConfigMap, c corev1.Container) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "controld.toml")
	if err := os.WriteFile(file, []byte(cm.Data["controld.toml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	// The image's entrypoint (forkfleet-node) hands its arguments to
	// controld.
	if _, cfg := buildScriptConfig(t); len(c.Command) != 0 || !slices.Equal(cfg.Entrypoint, []string{"/usr/local/bin/forkfleet-node"}) {
		t.Fatalf("command %v, the image's entrypoint %v: forkfleet-node must start containerd and controld", c.Command, cfg.Entrypoint)
	}
	env := map[string]string{"NODE_NAME": "node-1", "POD_IP": "10.1.2.3"}
	args := []string{"run", "./cmd/controld"}
	sawConfig := false
	for _, a := range c.Args {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		if strings.HasPrefix(a, "--config=") {
			if mounted := strings.TrimPrefix(a, "--config="); mounted != "/etc/forkfleet/config/controld.toml" {
				t.Errorf("--config %s is not the ConfigMap's file", mounted)
			}
			a, sawConfig = "--config="+file, true
		}
		args = append(args, a)
	}
	if !sawConfig {
		t.Fatal("controld is not given the ConfigMap's file")
	}
	cmd := exec.Command("go", append(args, "--print-config")...)
	cmd.Dir = filepath.Join("..", "..", "controld")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("controld refuses the configuration: %v\n%s", err, out)
	}
	var eff struct {
		Host    string
		Gateway struct{ Advertise string }
		GRPC    struct {
			TCPAddress string `toml:"tcp_address"`
		} `toml:"grpc"`
		Containerd struct{ Address string }
	}
	if err := toml.Unmarshal(out, &eff); err != nil {
		t.Fatalf("controld --print-config: %v\n%s", err, out)
	}
	if eff.Host != "node-1" || eff.Gateway.Advertise != "10.1.2.3:7480" || !strings.HasSuffix(eff.GRPC.TCPAddress, ":7443") {
		t.Errorf("effective config: host %q, gateway.advertise %q, grpc.tcp_address %q", eff.Host, eff.Gateway.Advertise, eff.GRPC.TCPAddress)
	}
	var cd struct{ GRPC struct{ Address string } }
	if err := toml.Unmarshal([]byte(cm.Data["containerd.toml"]), &cd); err != nil {
		t.Fatal(err)
	}
	if eff.Containerd.Address != cd.GRPC.Address {
		t.Errorf("controld dials containerd at %s, containerd listens at %s", eff.Containerd.Address, cd.GRPC.Address)
	}
}

// checkContainerdConfig holds the ConfigMap's containerd file to the
// host's (deploy/containerd/config.toml) where it matters: its own root,
// state and socket, no CRI, no NRI.
func checkContainerdConfig(t *testing.T, cm *corev1.ConfigMap, c corev1.Container) {
	t.Helper()
	type conf struct {
		Version         int
		Root, State     string
		DisabledPlugins []string `toml:"disabled_plugins"`
		GRPC            struct{ Address string }
	}
	var got, host conf
	if err := toml.Unmarshal([]byte(cm.Data["containerd.toml"]), &got); err != nil {
		t.Fatalf("containerd.toml: %v", err)
	}
	b, err := os.ReadFile(filepath.Join("..", "containerd", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal(b, &host); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(host) {
		t.Errorf("containerd.toml %+v differs from the host's %+v", got, host)
	}
	// forkfleet-node starts containerd with the ConfigMap's file and waits
	// for it on its socket.
	b, err = os.ReadFile(filepath.Join(nodeImageDir, "forkfleet-node"))
	if err != nil {
		t.Fatal(err)
	}
	entry := string(b)
	mounted := ""
	for _, m := range c.VolumeMounts {
		if m.Name == "config" {
			mounted = m.MountPath
		}
	}
	if !strings.Contains(entry, "FORKFLEET_CONTAINERD_CONFIG:-"+mounted+"/containerd.toml}") {
		t.Errorf("forkfleet-node does not start containerd with the ConfigMap's file %s/containerd.toml", mounted)
	}
	if !strings.Contains(entry, "FORKFLEET_CONTAINERD_ADDRESS:-"+got.GRPC.Address+"}") {
		t.Errorf("forkfleet-node does not wait for containerd at its address %s", got.GRPC.Address)
	}
}
