package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// makeTree builds a small source tree: a file, an executable, a symlink, a
// hard link and a nested directory. mtime varies per call on purpose.
func makeTree(t *testing.T, mtime time.Time) string {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc", "forkfleet"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc", "forkfleet", "guestd.json"), []byte(`{"display":":0"}`), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "usr", "bin"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "usr", "bin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Link(filepath.Join(dir, "usr", "bin", "tool"), filepath.Join(dir, "usr", "bin", "tool2")))
	must(os.Symlink("tool", filepath.Join(dir, "usr", "bin", "tool-link")))
	must(filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, mtime, mtime)
	}))
	return dir
}

func buildImage(t *testing.T, out, tree, bin string) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	w, err := Create(out)
	if err != nil {
		t.Fatal(err)
	}
	base, err := w.LayerFromTree(ctx, []TarEntry{{Source: tree, Dest: "/"}}, TarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	add, err := w.LayerFromTree(ctx, []TarEntry{{Source: bin, Dest: "/usr/local/bin/guestd"}}, TarOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint = []string{"/usr/local/bin/guestd"}
	cfg.Config.Env = []string{"PATH=/usr/bin", "HOME=/root", "DISPLAY=:0"}
	cfg.Config.WorkingDir = "/root"
	m, err := w.WriteImage(ctx, Image{Config: cfg, Layers: []Layer{base, add}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Tag(m, "localhost/forkfleet/desktop:latest", nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return m
}

func writeBin(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "guestd")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestImageLayoutValidates(t *testing.T) {
	out := filepath.Join(t.TempDir(), "layout")
	m := buildImage(t, out, makeTree(t, time.Now()), writeBin(t, "\x7fELF fake"))

	n, err := Validate(out)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if n != 4 { // manifest, config, 2 layers
		t.Errorf("validated %d blobs, want 4", n)
	}

	lay, err := os.ReadFile(filepath.Join(out, "oci-layout"))
	if err != nil || string(lay) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q, %v", lay, err)
	}
	idx, err := ReadIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != ocispec.MediaTypeImageIndex || len(idx.Manifests) != 1 {
		t.Fatalf("index = %+v", idx)
	}
	e := idx.Manifests[0]
	if e.Digest != m.Digest || e.Size != m.Size || e.MediaType != ocispec.MediaTypeImageManifest {
		t.Errorf("index entry %+v, want %+v", e, m)
	}
	if got := e.Annotations[AnnotationContainerdImageName]; got != "localhost/forkfleet/desktop:latest" {
		t.Errorf("containerd name annotation = %q", got)
	}
	if got := e.Annotations[ocispec.AnnotationRefName]; got != "latest" {
		t.Errorf("ref.name annotation = %q", got)
	}
	if e.Platform == nil || e.Platform.OS != "linux" || e.Platform.Architecture != runtime.GOARCH {
		t.Errorf("platform = %+v", e.Platform)
	}

	var man ocispec.Manifest
	if err := ReadBlobJSON(out, e, &man); err != nil {
		t.Fatal(err)
	}
	if man.MediaType != ocispec.MediaTypeImageManifest || man.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("manifest media types %q / %q", man.MediaType, man.Config.MediaType)
	}
	var cfg ocispec.Image
	if err := ReadBlobJSON(out, man.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	for i, l := range man.Layers {
		if l.MediaType != ocispec.MediaTypeImageLayer {
			t.Errorf("layer %d media type %q", i, l.MediaType)
		}
		if cfg.RootFS.DiffIDs[i] != l.Digest {
			t.Errorf("layer %d diff id %s != digest %s", i, cfg.RootFS.DiffIDs[i], l.Digest)
		}
		fi, err := os.Stat(BlobPath(out, l.Digest))
		if err != nil || fi.Size() != l.Size {
			t.Errorf("layer %d blob: %v size %v want %d", i, err, fi, l.Size)
		}
	}
	if strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/guestd" || cfg.Config.WorkingDir != "/root" || len(cfg.Config.Env) != 3 {
		t.Errorf("config = %+v", cfg.Config)
	}
	// No temp files left behind.
	ents, _ := os.ReadDir(filepath.Join(out, "blobs", "sha256"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Errorf("leftover temp blob %s", e.Name())
		}
	}
}

func TestDeterministicDigests(t *testing.T) {
	bin := writeBin(t, "same binary")
	a := buildImage(t, filepath.Join(t.TempDir(), "a"), makeTree(t, time.Unix(1000, 0)), bin)
	b := buildImage(t, filepath.Join(t.TempDir(), "b"), makeTree(t, time.Unix(2000000000, 0)), bin)
	if a.Digest != b.Digest {
		t.Fatalf("same input gave manifests %s and %s", a.Digest, b.Digest)
	}
	c := buildImage(t, filepath.Join(t.TempDir(), "c"), makeTree(t, time.Unix(1000, 0)), writeBin(t, "other binary"))
	if c.Digest == a.Digest {
		t.Fatal("different input gave the same manifest digest")
	}
}

func TestTarContents(t *testing.T) {
	tree := makeTree(t, time.Now())
	var buf bytes.Buffer
	mt := time.Unix(1700000000, 0)
	err := WriteTar(context.Background(), &buf, []TarEntry{
		{Source: tree, Dest: "/opt/app"},
		{Source: writeBin(t, "bin"), Dest: "/usr/local/bin/guestd"},
	}, TarOptions{UID: 0, GID: 0, ModTime: mt})
	if err != nil {
		t.Fatal(err)
	}
	type ent struct {
		typ  byte
		mode int64
		link string
	}
	got := map[string]ent{}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		got[h.Name] = ent{h.Typeflag, h.Mode, h.Linkname}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(mt) {
			t.Errorf("%s: owner %d:%d %q:%q mtime %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
	}
	want := []string{
		"opt/", "opt/app/", "opt/app/etc/", "opt/app/etc/forkfleet/", "opt/app/etc/forkfleet/guestd.json",
		"opt/app/usr/", "opt/app/usr/bin/", "opt/app/usr/bin/tool", "opt/app/usr/bin/tool-link", "opt/app/usr/bin/tool2",
		"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/guestd",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	if e := got["opt/app/usr/bin/tool"]; e.typ != tar.TypeReg || e.mode != 0o755 {
		t.Errorf("tool: %+v", e)
	}
	if e := got["opt/app/usr/bin/tool2"]; e.typ != tar.TypeLink || e.link != "opt/app/usr/bin/tool" {
		t.Errorf("hard link: %+v", e)
	}
	if e := got["opt/app/usr/bin/tool-link"]; e.typ != tar.TypeSymlink || e.link != "tool" {
		t.Errorf("symlink: %+v", e)
	}
	if e := got["usr/local/bin/"]; e.typ != tar.TypeDir || e.mode != 0o755 {
		t.Errorf("parent dir: %+v", e)
	}
}

func TestTarRejects(t *testing.T) {
	bin := writeBin(t, "x")
	for name, entries := range map[string][]TarEntry{
		"relative dest": {{Source: bin, Dest: "usr/bin/x"}},
		"dotdot":        {{Source: bin, Dest: "/usr/../etc/x"}},
		"no source":     {{Dest: "/x"}},
		"missing":       {{Source: "/nonexistent/forkfleet", Dest: "/x"}},
		"duplicate":     {{Source: bin, Dest: "/x"}, {Source: bin, Dest: "/x"}},
	} {
		if err := WriteTar(context.Background(), io.Discard, entries, TarOptions{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestGzipLayerDiffID(t *testing.T) {
	var raw bytes.Buffer
	if err := WriteTar(context.Background(), &raw, []TarEntry{{Source: writeBin(t, "payload"), Dest: "/f"}}, TarOptions{}); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw.Bytes())
	zw.Close()

	w, err := Create(filepath.Join(t.TempDir(), "l"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := w.WriteLayer(context.Background(), ocispec.MediaTypeImageLayerGzip, bytes.NewReader(gz.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if l.DiffID != digest.FromBytes(raw.Bytes()) || l.Descriptor.Digest != digest.FromBytes(gz.Bytes()) {
		t.Fatalf("diff id %s digest %s", l.DiffID, l.Descriptor.Digest)
	}
	if _, err := w.WriteLayer(context.Background(), ocispec.MediaTypeImageLayerGzip, strings.NewReader("not gzip")); err == nil {
		t.Fatal("garbage gzip layer accepted")
	}
	if _, err := w.WriteLayer(context.Background(), "application/x-criu", strings.NewReader("x")); !errors.Is(err, ErrUnsupportedMedia) {
		t.Fatalf("non-tar layer: %v", err)
	}
}

// An artifact (as a CRIU checkpoint export will be): empty config, blobs of
// arbitrary media types, artifactType carried to the index.
func TestArtifactManifest(t *testing.T) {
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "art")
	w, err := Create(out)
	if err != nil {
		t.Fatal(err)
	}
	pages, err := w.WriteBlob(ctx, "application/vnd.forkfleet.criu.pages.v1", strings.NewReader(strings.Repeat("p", 10000)))
	if err != nil {
		t.Fatal(err)
	}
	pages.Annotations = map[string]string{ocispec.AnnotationTitle: "pages-1.img"}
	m, err := w.WriteManifest(ctx, ocispec.Manifest{
		ArtifactType: "application/vnd.forkfleet.checkpoint.v1",
		Config:       ocispec.DescriptorEmptyJSON,
		Layers:       []ocispec.Descriptor{pages},
		Annotations:  map[string]string{"org.forkfleet.sandbox": "sb-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != "application/vnd.forkfleet.checkpoint.v1" {
		t.Errorf("artifactType not carried: %+v", m)
	}
	if err := w.Tag(m, "", map[string]string{"org.forkfleet.kind": "checkpoint"}); err != nil {
		t.Fatal(err)
	}
	w.SetIndexAnnotations(map[string]string{"org.forkfleet.created-by": "test"})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Validate(out); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	if _, err := w.WriteBlob(ctx, "x/y", strings.NewReader("")); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteBlob after Close: %v", err)
	}
}

func TestValidateDetectsDamage(t *testing.T) {
	out := filepath.Join(t.TempDir(), "layout")
	buildImage(t, out, makeTree(t, time.Now()), writeBin(t, "bin"))
	idx, _ := ReadIndex(out)
	var man ocispec.Manifest
	if err := ReadBlobJSON(out, idx.Manifests[0], &man); err != nil {
		t.Fatal(err)
	}
	p := BlobPath(out, man.Layers[1].Digest)
	orig, _ := os.ReadFile(p)
	os.Chmod(p, 0o644)

	bad := append([]byte(nil), orig...)
	bad[len(bad)-1] ^= 0xff
	os.WriteFile(p, bad, 0o644)
	if _, err := Validate(out); !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("corrupted blob: %v", err)
	}
	os.WriteFile(p, append(orig, 0), 0o644)
	if _, err := Validate(out); !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("resized blob: %v", err)
	}
	os.Remove(p)
	if _, err := Validate(out); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("missing blob: %v", err)
	}
}

func TestCreateRefusesNonEmpty(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)
	if _, err := Create(dir); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Create: %v", err)
	}
}

func TestTagNames(t *testing.T) {
	for name, want := range map[string]string{
		"localhost/forkfleet/desktop:latest":                    "latest",
		"localhost:5000/a/b:v1.2":                               "v1.2",
		"localhost:5000/a/b":                                    "",
		"docker.io/library/x@sha256:" + strings.Repeat("a", 64): "",
	} {
		got, err := tagOf(name)
		if err != nil || got != want {
			t.Errorf("tagOf(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, bad := range []string{"a b", "https://x/y", "/x", "x/", "a//b", "x:", "x@sha256:zz"} {
		if _, err := tagOf(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("tagOf(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
}

// zeros is an endless reader that allocates nothing per read.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A 256 MiB blob must stream: the heap must not grow by anything like it.
func TestBlobStreams(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "big"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 256 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d, err := w.WriteLayer(context.Background(), ocispec.MediaTypeImageLayer, io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if d.Descriptor.Size != size {
		t.Fatalf("size %d", d.Descriptor.Size)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 8<<20 {
		t.Fatalf("writing a %d MiB blob allocated %d MiB", size>>20, grown>>20)
	}
}

func TestCancel(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "c"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.WriteBlob(ctx, ocispec.MediaTypeImageLayer, io.LimitReader(zeros{}, 1<<20)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled write: %v", err)
	}
}
