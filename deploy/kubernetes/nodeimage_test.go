package kubernetes

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// NodeImageLayout is where images/node/build.sh (make image-node) writes
// the DaemonSet's image, an OCI layout.
const NodeImageLayout = "/var/cache/forkfleet/images/node-oci"

// nodeImageDir is images/node, from this package's directory.
var nodeImageDir = filepath.Join("..", "..", "images", "node")

// imageConfig is what an image says about how it runs: build.sh's
// forkfleet-image flags, the Dockerfile's last stage, or a built image's
// config.
type imageConfig struct {
	Entrypoint []string
	Path       string // the PATH of Env
	WorkingDir string
}

// buildScriptConfig reads images/node/build.sh's image name and config
// flags.
func buildScriptConfig(t *testing.T) (name string, cfg imageConfig) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nodeImageDir, "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	one := func(re string) string {
		m := regexp.MustCompile(re).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("build.sh has no %s", re)
		}
		return m[1]
	}
	name = one(`image_name=\$\{IMAGE_NAME:-([^}]+)\}`)
	cfg.Entrypoint = []string{one(`--entrypoint (\S+)`)}
	cfg.Path = one(`--env PATH=(\S+)`)
	cfg.WorkingDir = one(`--workdir (\S+)`)
	return name, cfg
}

// dockerfile is images/node/Dockerfile: every instruction (continuation
// lines joined) and its last stage's config.
type dockerfile struct {
	instructions []string
	final        imageConfig
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nodeImageDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	var cur strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") && cur.Len() == 0 {
			continue
		}
		cont := strings.HasSuffix(line, "\\")
		cur.WriteString(strings.TrimSuffix(line, "\\"))
		if cont {
			continue
		}
		if ins := strings.Join(strings.Fields(cur.String()), " "); ins != "" {
			d.instructions = append(d.instructions, ins)
		}
		cur.Reset()
	}
	for _, ins := range d.instructions {
		op, arg, _ := strings.Cut(ins, " ")
		switch op {
		case "FROM":
			d.final = imageConfig{}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(arg), &d.final.Entrypoint); err != nil {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: not the exec form: %v", arg, err)
			}
		case "ENV":
			for kv := range strings.FieldsSeq(arg) {
				if v, ok := strings.CutPrefix(kv, "PATH="); ok {
					d.final.Path = v
				}
			}
		case "WORKDIR":
			d.final.WorkingDir = arg
		}
	}
	return d
}

// TestNodeImageDockerfile keeps images/node/Dockerfile in step with
// build.sh: the same inputs (packages.txt, prune.sh, the rootfs/ overlay,
// binaries.sh with host-setup.sh's functions and the CRIU preload's
// sources), the same Debian release and Go, and the same config.
func TestNodeImageDockerfile(t *testing.T) {
	d := readDockerfile(t)
	_, want := buildScriptConfig(t)
	if !equalConfig(d.final, want) {
		t.Errorf("Dockerfile's image config %+v, build.sh's %+v", d.final, want)
	}
	all := strings.Join(d.instructions, "\n")
	for _, in := range []string{
		"COPY images/node/packages.txt images/node/prune.sh ",
		"COPY images/node/rootfs/ /",
		"COPY images/node/binaries.sh ",
		"COPY deploy/host-setup.sh ",
		"COPY deploy/criu/ ",
		"images/node/binaries.sh /out",
		"unpack_criu \"$(newest_cached_criu)\" /out/opt/forkfleet/criu",
		"/tmp/forkfleet/prune.sh /",
		"COPY --from=binaries /out/ /",
	} {
		if !strings.Contains(all, in) {
			t.Errorf("Dockerfile lacks %q (build.sh's input)", in)
		}
	}
	// The Go builds resolve modules as make build does: the workspace.
	work, err := os.ReadFile(filepath.Join("..", "..", "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(all, "COPY go.work go.work.sum ./") {
		t.Error("Dockerfile lacks go.work: its builds would resolve other module versions than build.sh's")
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+\./(\S+)$`).FindAllSubmatch(work, -1) {
		if mod := string(m[1]); !strings.Contains(all, "COPY "+mod+"/go.mod ") && !strings.Contains(all, "COPY "+mod+"/ ") {
			t.Errorf("Dockerfile lacks %s/go.mod, a module of go.work", mod)
		}
	}
	base, err := os.ReadFile(filepath.Join(nodeImageDir, "base.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^suite=(\S+)`).FindSubmatch(base); m == nil || !strings.Contains(all, "FROM debian:"+string(m[1])+"-slim") {
		t.Errorf("Dockerfile's Debian is not base.sh's (%s)", m)
	}
	if !strings.Contains(string(base), `"$here/prune.sh" "$root"`) {
		t.Error("base.sh does not run prune.sh")
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "controld", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod); m == nil || !strings.Contains(all, "FROM golang:"+string(m[1])+"-") {
		t.Errorf("Dockerfile's Go is not controld's (go %s)", m)
	}
}

func equalConfig(a, b imageConfig) bool {
	return slices.Equal(a.Entrypoint, b.Entrypoint) && a.Path == b.Path && a.WorkingDir == b.WorkingDir
}

// imageFile is one entry of an image's merged layers.
type imageFile struct {
	mode     os.FileMode
	linkname string // symlinks
	size     int64
	read     func() []byte
}

// nodeImage is the built node image: its name, config and files.
type nodeImage struct {
	name   string
	config imageConfig
	env    []string
	labels map[string]string
	layers []string             // the layers' tars, bottom first
	files  map[string]imageFile // absolute paths, layers applied in order
}

func readLayout(t *testing.T, dir string) nodeImage {
	t.Helper()
	blob := func(digest string) string {
		algo, hex, ok := strings.Cut(digest, ":")
		if !ok {
			t.Fatalf("digest %q", digest)
		}
		return filepath.Join(dir, "blobs", algo, hex)
	}
	readJSON := func(p string, v any) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	readJSON(filepath.Join(dir, "index.json"), &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("%s: %d images, want 1", dir, len(index.Manifests))
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest, MediaType string }
	}
	readJSON(blob(index.Manifests[0].Digest), &manifest)
	var config struct {
		Config struct {
			Entrypoint []string
			Env        []string
			WorkingDir string
			Labels     map[string]string
		}
	}
	readJSON(blob(manifest.Config.Digest), &config)
	img := nodeImage{
		name:   index.Manifests[0].Annotations["io.containerd.image.name"],
		config: imageConfig{Entrypoint: config.Config.Entrypoint, WorkingDir: config.Config.WorkingDir},
		env:    config.Config.Env,
		labels: config.Config.Labels,
		files:  map[string]imageFile{},
	}
	for _, e := range config.Config.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			img.config.Path = v
		}
	}
	for _, l := range manifest.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar" {
			t.Fatalf("layer %s: media type %s (build.sh writes uncompressed tars)", l.Digest, l.MediaType)
		}
		img.layers = append(img.layers, blob(l.Digest))
		readLayer(t, blob(l.Digest), img.files)
	}
	return img
}

// readLayer applies one uncompressed layer tar to files (whiteouts
// included, though build.sh writes none).
func readLayer(t *testing.T, p string, files map[string]imageFile) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		name := path.Clean("/" + h.Name)
		if base := path.Base(name); strings.HasPrefix(base, ".wh.") {
			delete(files, path.Join(path.Dir(name), strings.TrimPrefix(base, ".wh.")))
			continue
		}
		e := imageFile{mode: h.FileInfo().Mode(), linkname: h.Linkname, size: h.Size}
		if h.Typeflag == tar.TypeReg && h.Size < 1<<16 {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			e.read = func() []byte { return b }
		}
		files[name] = e
	}
}

// resolve follows the image's symlinks (absolute and relative, in every
// component) to the file p names.
func (img nodeImage) resolve(p string) (string, imageFile, bool) {
	for range 40 {
		parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
		cur := "/"
		moved := false
		for i, part := range parts {
			next := path.Join(cur, part)
			f, ok := img.files[next]
			if !ok {
				return "", imageFile{}, false
			}
			if f.mode&os.ModeSymlink != 0 {
				target := f.linkname
				if !path.IsAbs(target) {
					target = path.Join(cur, target)
				}
				p = path.Join(append([]string{target}, parts[i+1:]...)...)
				moved = true
				break
			}
			cur = next
		}
		if !moved {
			f := img.files[cur]
			return cur, f, true
		}
	}
	return "", imageFile{}, false
}

// lookPath finds name on the image's PATH as exec.LookPath would.
func (img nodeImage) lookPath(name string) (string, bool) {
	if path.IsAbs(name) {
		_, f, ok := img.resolve(name)
		return name, ok && f.mode.IsRegular() && f.mode.Perm()&0o111 != 0
	}
	for dir := range strings.SplitSeq(img.config.Path, ":") {
		if p, ok := img.lookPath(path.Join(dir, name)); ok {
			return p, true
		}
	}
	return "", false
}

// under says whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// TestNodeImage holds the built node image (make image-node) to the
// DaemonSet and the Dockerfile: the DaemonSet names it, its config is the
// Dockerfile's, every command and probe the DaemonSet runs is in it, and so
// is every program controld and CRIU start; and no file of it lies under a
// path the pod mounts over (the node's host paths, the ConfigMap and the
// Secrets), where the pod would never see it: the CRIU wrapper's preload
// library was once in /var/lib/forkfleet.
func TestNodeImage(t *testing.T) {
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("needs the node image (make image-node) and FORKFLEET_INTEGRATION=1")
	}
	if _, err := os.Stat(filepath.Join(NodeImageLayout, "index.json")); err != nil {
		t.Fatalf("no node image (make image-node): %v", err)
	}
	img := readLayout(t, NodeImageLayout)
	ds := manifests(t)["DaemonSet"].(*appsv1.DaemonSet)
	pod := ds.Spec.Template.Spec

	name, _ := buildScriptConfig(t)
	if img.name != name {
		t.Errorf("the layout's image is %q, build.sh's %q", img.name, name)
	}
	if d := readDockerfile(t); !equalConfig(img.config, d.final) {
		t.Errorf("the image's config %+v, the Dockerfile's %+v", img.config, d.final)
	}
	var mounts []string
	for _, c := range pod.Containers {
		if c.Image != img.name {
			t.Errorf("container %s runs %s, not the node image %s", c.Name, c.Image, img.name)
		}
		cmd := c.Command
		if len(cmd) == 0 {
			cmd = img.config.Entrypoint
		}
		progs := []string{cmd[0]}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if p != nil && p.Exec != nil {
				progs = append(progs, p.Exec.Command[0])
			}
		}
		for _, p := range progs {
			if _, ok := img.lookPath(p); !ok {
				t.Errorf("container %s runs %s: not an executable of the image", c.Name, p)
			}
		}
		for _, m := range c.VolumeMounts {
			mounts = append(mounts, m.MountPath)
		}
	}
	// What controld, containerd's shims and CRIU run from PATH.
	for _, p := range []string{"containerd-shim-runc-v2", "runc", "criu", "nft", "ip", "forkfleet-log", "forkfleet-nethook", "forkfleetctl", "ctr"} {
		if _, ok := img.lookPath(p); !ok {
			t.Errorf("%s is not on the image's PATH %s", p, img.config.Path)
		}
	}
	for p := range img.files {
		for _, m := range mounts {
			if under(p, m) && p != m {
				t.Errorf("the image's %s lies under the pod's mount %s: the pod never sees it", p, m)
			}
		}
	}
	// The CRIU wrapper runs the private CRIU through its loader, with its
	// preload library: each must be in the image, outside the mounts.
	wrapper, f, ok := img.resolve("/usr/local/sbin/criu")
	if !ok || f.read == nil {
		t.Fatalf("no CRIU wrapper /usr/local/sbin/criu (%s)", wrapper)
	}
	// A program (deploy/criu/wrapper.c) that names what it runs in one line.
	script := string(f.read())
	for _, re := range []string{`forkfleet-criu-wrapper-paths: .*\bloader=(\S+)`, `forkfleet-criu-wrapper-paths: .*\bpreload=(\S+)`,
		`forkfleet-criu-wrapper-paths: .*\bbinary=(\S+/usr/sbin/criu)\b`, `forkfleet-criu-wrapper-paths: .*\bconf=(\S+)`} {
		m := regexp.MustCompile(re).FindStringSubmatch(script)
		if m == nil {
			t.Errorf("the CRIU wrapper lacks %s", re)
			continue
		}
		if _, _, ok := img.resolve(m[1]); !ok {
			t.Errorf("the CRIU wrapper uses %s: not in the image", m[1])
		}
		for _, mp := range mounts {
			if under(m[1], mp) {
				t.Errorf("the CRIU wrapper uses %s, under the pod's mount %s", m[1], mp)
			}
		}
	}
	for _, id := range []string{"/etc/subuid", "/etc/subgid"} {
		if _, f, ok := img.resolve(id); !ok || f.read == nil || !strings.Contains(string(f.read()), "forkfleet:") {
			t.Errorf("%s reserves no ids for forkfleet (the sandboxes' user namespaces)", id)
		}
	}
}
