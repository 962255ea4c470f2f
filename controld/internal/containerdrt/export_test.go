//go:build linux

package containerdrt

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/content/local"
	cerrdefs "github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

func TestValidateReference(t *testing.T) {
	for _, ok := range []string{"localhost/forkfleet/ck-test:1", "registry.example:5000/a/b:v1", "docker.io/library/x:latest"} {
		if err := validateReference("reference", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "ck-test:1", "has space/x:1", "localhost/UPPER:1"} {
		if err := validateReference("reference", bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestTopLowerDir(t *testing.T) {
	got, err := topLowerDir([]mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"index=off", "lowerdir=/s/3/fs:/s/2/fs:/s/1/fs"}}})
	if err != nil || got != "/s/3/fs" {
		t.Errorf("overlay: %q, %v", got, err)
	}
	got, err = topLowerDir([]mount.Mount{{Type: "bind", Source: "/s/1/fs", Options: []string{"ro", "rbind"}}})
	if err != nil || got != "/s/1/fs" {
		t.Errorf("bind: %q, %v", got, err)
	}
	if _, err := topLowerDir([]mount.Mount{{Type: "overlay", Options: []string{"upperdir=/u"}}}); err == nil {
		t.Error("overlay without lowerdir accepted")
	}
	if _, err := topLowerDir([]mount.Mount{{Type: "erofs"}}); err == nil {
		t.Error("erofs accepted")
	}
}

// testManifest builds a well-formed checkpoint manifest and metadata.
func exportTestManifest(tier string) (ocispec.Manifest, exportedMeta) {
	d := func(mt, s string) ocispec.Descriptor {
		return ocispec.Descriptor{MediaType: mt, Digest: digest.FromString(s), Size: int64(len(s))}
	}
	var layers []ocispec.Descriptor
	if tier == "memory" {
		layers = append(layers, d(MediaTypeCheckpointCRIU, "criu"))
	}
	layers = append(layers, d(ocispec.MediaTypeImageLayer, "l0"), d(ocispec.MediaTypeImageLayer, "l1"), d(MediaTypeCheckpointMeta, "meta"))
	m := ocispec.Manifest{
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeCheckpoint,
		Config:       ocispec.DescriptorEmptyJSON,
		Layers:       layers,
		Annotations: map[string]string{
			ocispec.AnnotationBaseImageName:   "localhost/base:1",
			ocispec.AnnotationBaseImageDigest: digest.FromString("base").String(),
			AnnotationBaseChainID:             digest.FromString("chain").String(),
			AnnotationTier:                    tier,
		},
	}
	ck, _ := json.Marshal(checkpointMeta{Version: metaVersion, Image: "localhost/base:1", Tier: tier, Snapshot: "s", Snapshotter: "overlayfs"})
	return m, exportedMeta{Version: exportMetaVersion, Checkpoint: ck, Spec: json.RawMessage(`{"ociVersion":"1.2.0"}`), Metadata: []byte("opaque")}
}

func TestParseCheckpointManifest(t *testing.T) {
	for _, tier := range []string{"memory", "disk"} {
		m, em := exportTestManifest(tier)
		b, _ := json.Marshal(m)
		ck, err := parseCheckpointManifest("ref", b)
		if err != nil {
			t.Fatalf("%s: %v", tier, err)
		}
		if len(ck.diffs) != 2 || (tier == "memory") != (len(ck.criu) == 1) {
			t.Errorf("%s: diffs %d, criu %v", tier, len(ck.diffs), ck.criu)
		}
		mb, _ := json.Marshal(em)
		if err := ck.parseMeta("ref", mb); err != nil {
			t.Errorf("%s: meta: %v", tier, err)
		}
		if string(ck.exported.Metadata) != "opaque" || ck.ckMeta.Snapshot != "s" {
			t.Errorf("%s: meta %+v", tier, ck.exported)
		}
	}
	bad := map[string]func(m *ocispec.Manifest, em *exportedMeta){
		"artifact type": func(m *ocispec.Manifest, _ *exportedMeta) { m.ArtifactType = "application/vnd.other" },
		"no tier":       func(m *ocispec.Manifest, _ *exportedMeta) { delete(m.Annotations, AnnotationTier) },
		"no base":       func(m *ocispec.Manifest, _ *exportedMeta) { delete(m.Annotations, ocispec.AnnotationBaseImageName) },
		"no chain":      func(m *ocispec.Manifest, _ *exportedMeta) { delete(m.Annotations, AnnotationBaseChainID) },
		"meta not last": func(m *ocispec.Manifest, _ *exportedMeta) { m.Layers = m.Layers[:len(m.Layers)-1] },
		"criu missing":  func(m *ocispec.Manifest, _ *exportedMeta) { m.Layers = m.Layers[1:] },
		"gzip layer":    func(m *ocispec.Manifest, _ *exportedMeta) { m.Layers[1].MediaType = ocispec.MediaTypeImageLayerGzip },
		"no layer":      func(m *ocispec.Manifest, _ *exportedMeta) { m.Layers = []ocispec.Descriptor{m.Layers[0], m.Layers[3]} },
		"meta version":  func(_ *ocispec.Manifest, em *exportedMeta) { em.Version = 9 },
		"no spec":       func(_ *ocispec.Manifest, em *exportedMeta) { em.Spec = nil },
		"tier mismatch": func(m *ocispec.Manifest, _ *exportedMeta) {
			m.Annotations[AnnotationTier] = "disk"
			m.Layers = m.Layers[1:]
		},
		"image mismatch": func(m *ocispec.Manifest, _ *exportedMeta) {
			m.Annotations[ocispec.AnnotationBaseImageName] = "localhost/other:1"
		},
		"checkpoint json": func(_ *ocispec.Manifest, em *exportedMeta) { em.Checkpoint = json.RawMessage(`[]`) },
	}
	for name, mut := range bad {
		m, em := exportTestManifest("memory")
		mut(&m, &em)
		b, _ := json.Marshal(m)
		mb, _ := json.Marshal(em)
		ck, err := parseCheckpointManifest("ref", b)
		if err == nil {
			err = ck.parseMeta("ref", mb)
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want ErrFailedPrecondition", name, err)
		}
	}
}

// TestOverlayDiff checks the layer tar of a synthetic overlay layer
// directory: whiteouts, opaque directories, hard links, symlinks; and that
// the walk refuses redirected directories. Needs root (whiteout device
// nodes, trusted.* xattrs).
func TestIntegrationOverlayDiff(t *testing.T) {
	integration(t)
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc/app"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc/app/conf"), []byte("v=1"), 0o644))
	must(os.Link(filepath.Join(dir, "etc/app/conf"), filepath.Join(dir, "etc/app/conf.link")))
	must(os.Symlink("app/conf", filepath.Join(dir, "etc/conf")))
	must(unix.Mknod(filepath.Join(dir, "etc/gone"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(dir, "opaque"), 0o755))
	must(unix.Lsetxattr(filepath.Join(dir, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(dir, "opaque/new"), []byte("n"), 0o600))

	var buf bytes.Buffer
	must(writeOverlayDiff(context.Background(), &buf, dir))
	first := bytes.Clone(buf.Bytes())
	got := map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		got[h.Name] = h
		order = append(order, h.Name)
	}
	for _, want := range []string{"etc/", "etc/app/", "etc/app/conf", "etc/app/conf.link", "etc/conf", "etc/.wh.gone", "opaque/", "opaque/.wh..wh..opq", "opaque/new"} {
		if got[want] == nil {
			t.Errorf("entry %s missing; have %q", want, order)
		}
	}
	if h := got["etc/app/conf.link"]; h != nil && (h.Typeflag != tar.TypeLink || h.Linkname != "etc/app/conf") {
		t.Errorf("hard link: %+v", h)
	}
	if h := got["etc/conf"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "app/conf") {
		t.Errorf("symlink: %+v", h)
	}
	if got["etc/gone"] != nil {
		t.Error("the whiteout device itself was written")
	}
	if i, j := slices.Index(order, "opaque/.wh..wh..opq"), slices.Index(order, "opaque/new"); i > j {
		t.Errorf("opaque marker after the directory's content: %q", order)
	}
	// The same tree yields the same bytes (same digest on re-export).
	var again bytes.Buffer
	must(writeOverlayDiff(context.Background(), &again, dir))
	if !bytes.Equal(first, again.Bytes()) {
		t.Error("two diffs of the same layer differ")
	}

	must(os.Mkdir(filepath.Join(dir, "moved"), 0o755))
	must(unix.Lsetxattr(filepath.Join(dir, "moved"), "trusted.overlay.redirect", []byte("/orig"), 0))
	if err := writeOverlayDiff(context.Background(), io.Discard, dir); err == nil || !strings.Contains(err.Error(), "redirect") {
		t.Errorf("redirected directory: %v", err)
	}
}

const exportNamespace = "forkfleet-export-it"

// imageManifest returns the record of image ref and its OCI manifest.
func imageManifest(t *testing.T, ctx context.Context, r *Runtime, ref string) (images.Image, ocispec.Manifest) {
	t.Helper()
	img, err := r.client.ImageService().Get(ctx, ref)
	if err != nil {
		t.Fatalf("image %s: %v", ref, err)
	}
	mb, err := content.ReadBlob(ctx, r.client.ContentStore(), img.Target)
	if err != nil {
		t.Fatal(err)
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(mb, &man); err != nil {
		t.Fatal(err)
	}
	return img, man
}

// TestIntegrationExportImport round-trips a memory-tier checkpoint through
// an OCI image in containerd's content store: export, delete the
// checkpoint, import, fork, and a checkpoint of that fork (two stacked
// layers) the same way. Everything it creates goes, namespace included.
func TestIntegrationExportImport(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, exportNamespace)
	ctx := r.ctx(context.Background())
	if err := buildAndImport(r); err != nil {
		t.Fatalf("test image: %v", err)
	}
	is := r.client.ImageService()
	cs := r.client.ContentStore()
	// The sandboxes boot from an alias of the test image, so the test can
	// take the base image away and bring it back.
	base := "localhost/forkfleet/export-base:" + randomHex(4)
	testImg, err := is.Get(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	setBase := func() {
		t.Helper()
		if _, err := is.Create(ctx, images.Image{Name: base, Target: testImg.Target}); err != nil && !cerrdefs.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	setBase()
	ckRef := "localhost/forkfleet/ck-test:1"
	ckRef2 := "localhost/forkfleet/ck-test:2"
	t.Cleanup(func() {
		cctx := r.ctx(context.Background())
		// The runtime's prepared checkpoint layer pins the image's.
		if err := r.closeLayerSlots(cctx); err != nil {
			t.Error(err)
		}
		for _, n := range []string{ckRef, ckRef2, base, testImage} {
			if err := is.Delete(cctx, n, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("delete image %s: %v", n, err)
			}
		}
		if err := r.client.NamespaceService().Delete(context.Background(), r.cfg.Namespace); err != nil {
			t.Errorf("namespace %s not empty after the test: %v", r.cfg.Namespace, err)
		}
	})
	snapsBefore := countSnapshots(t, r)
	leasesBefore := leaseCount(t, r)

	spec := testSpec(uniqueID("exsrc"))
	spec.Image = base
	src := bootT(t, r, spec)
	memValue := "mem-" + randomHex(8)
	fileValue := "file-" + randomHex(8)
	mustCall(t, src, "set "+memValue)
	mustCall(t, src, "write /var/lib/state/value "+fileValue)
	mustCall(t, src, "write /var/lib/state/big "+strings.Repeat("y", 1<<20))
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	deleteQuiet(r, src.ID)

	metadata := []byte(`{"record":"opaque to the runtime"}`)
	start := time.Now()
	ex, err := r.ExportCheckpoint(ctx, res.Ref, metadata, ckRef)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	t.Logf("export (memory %d B, layer %d B): %v, image %s %d B", res.MemoryBytes, res.LayerBytes, time.Since(start), ex.Digest, ex.SizeBytes)
	if ex.Reference != ckRef || ex.SizeBytes <= 0 {
		t.Errorf("export result %+v", ex)
	}
	img, man := imageManifest(t, ctx, r, ckRef)
	if img.Target.Digest.String() != ex.Digest {
		t.Fatalf("image record %+v, want %s", img.Target, ex.Digest)
	}
	if _, ok := img.Labels["containerd.io/gc.expire"]; ok {
		t.Error("image record expires")
	}
	var types []string
	for _, l := range man.Layers {
		types = append(types, l.MediaType)
	}
	if man.ArtifactType != ArtifactTypeCheckpoint || !slices.Equal(types, []string{MediaTypeCheckpointCRIUZstd, ocispec.MediaTypeImageLayerZstd, MediaTypeCheckpointMeta}) {
		t.Errorf("manifest: artifact %s, layers %q", man.ArtifactType, types)
	}
	if man.Annotations[ocispec.AnnotationBaseImageName] != base || man.Annotations[ocispec.AnnotationBaseImageDigest] != testImg.Target.Digest.String() ||
		man.Annotations[AnnotationTier] != "memory" || man.Annotations[AnnotationCRIUVersion] == "" || man.Annotations[ocispec.AnnotationCreated] == "" {
		t.Errorf("annotations %v", man.Annotations)
	}
	// Exporting again changes nothing (and drops an expiry someone set).
	if _, err := is.Update(ctx, images.Image{Name: ckRef, Labels: map[string]string{"containerd.io/gc.expire": time.Now().Add(time.Hour).Format(time.RFC3339)}}, "labels"); err != nil {
		t.Fatal(err)
	}
	if ex2, err := r.ExportCheckpoint(ctx, res.Ref, metadata, ckRef); err != nil || ex2.Digest != ex.Digest {
		t.Errorf("second export: %+v, %v (first %s)", ex2, err, ex.Digest)
	}
	if img, err := is.Get(ctx, ckRef); err != nil || len(img.Labels) != 0 {
		t.Errorf("image labels after the second export: %v, %v", img.Labels, err)
	}

	// The checkpoint goes; only the image holds it now.
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sn.Stat(ctx, res.Ref.Snapshot); !cerrdefs.IsNotFound(err) {
		t.Fatalf("checkpoint layer still there: %v", err)
	}
	if _, err := r.ExportCheckpoint(ctx, res.Ref, nil, ckRef2); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("export of a deleted checkpoint: %v, want ErrNotFound", err)
	}

	// Without the base image the import is refused, naming it.
	if err := is.Delete(ctx, base); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("imported"))
	_, _, err = r.ImportCheckpoint(ctx, ckRef, dir)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), base) || errdefs.Reason(err) != "BASE_IMAGE_MISSING" {
		t.Errorf("import without the base image: %v (reason %q)", err, errdefs.Reason(err))
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed import left its directory: %v", err)
	}
	setBase()

	start = time.Now()
	ref, gotMeta, err := r.ImportCheckpoint(ctx, ckRef, dir)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	t.Logf("import: %v", time.Since(start))
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), ref) })
	if !bytes.Equal(gotMeta, metadata) {
		t.Errorf("metadata %q, want %q", gotMeta, metadata)
	}
	if ref.Dir != dir || ref.Tier != runtime.TierMemory || ref.Image != base || ref.Snapshot == "" || ref.Snapshot == res.Ref.Snapshot {
		t.Errorf("imported ref %+v", ref)
	}
	if info, err := r.sn.Stat(ctx, ref.Snapshot); err != nil || info.Labels[snapshotLabelGCRoot] == "" {
		t.Errorf("imported layer %+v, %v", info, err)
	}
	if _, _, err := r.ImportCheckpoint(ctx, ckRef, dir); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("import into an existing dir: %v, want ErrAlreadyExists", err)
	}
	if _, err := readMeta(dir); err != nil {
		t.Errorf("import into an existing dir touched the checkpoint there: %v", err)
	}

	// A fork of the imported checkpoint has the file and the memory.
	fork := restoreT(t, r, testSpec(uniqueID("exfork")), ref)
	if got := mustCall(t, fork, "get"); got != memValue {
		t.Errorf("fork of the imported checkpoint: memory %q, want %q", got, memValue)
	}
	if got := mustCall(t, fork, "read /var/lib/state/value"); got != fileValue {
		t.Errorf("fork of the imported checkpoint: file %q, want %q", got, fileValue)
	}
	if got := mustCall(t, fork, "read /var/lib/state/big"); len(got) != 1<<20 {
		t.Errorf("fork of the imported checkpoint: big file of %d bytes", len(got))
	}

	// A checkpoint of that fork sits on the imported layer: two diffs.
	mustCall(t, fork, "write /var/lib/state/second second-"+fork.ID)
	mustCall(t, fork, "set grand-"+memValue)
	res2 := checkpointT(t, r, fork.ID, runtime.TierMemory, false)
	ex2, err := r.ExportCheckpoint(ctx, res2.Ref, nil, ckRef2)
	if err != nil {
		t.Fatalf("export of a fork's checkpoint: %v", err)
	}
	ck2, err := readCheckpointImage(ctx, cs, ckRef2, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.Digest(ex2.Digest), Size: exportBlobSize(t, r, ex2.Digest)})
	if err != nil || len(ck2.diffs) != 2 {
		t.Fatalf("fork's checkpoint image: %v (%d diffs, want 2)", err, len(ck2.diffs))
	}
	dir2 := filepath.Join(r.cfg.CheckpointRoot, uniqueID("imported2"))
	ref2, _, err := r.ImportCheckpoint(ctx, ckRef2, dir2)
	if err != nil {
		t.Fatalf("import of a fork's checkpoint: %v", err)
	}
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), ref2) })
	grand := restoreT(t, r, testSpec(uniqueID("exgrand")), ref2)
	if got := mustCall(t, grand, "get"); got != "grand-"+memValue {
		t.Errorf("grandchild memory %q", got)
	}
	if got := mustCall(t, grand, "read /var/lib/state/value"); got != fileValue {
		t.Errorf("grandchild file %q", got)
	}
	if got := mustCall(t, grand, "read /var/lib/state/second"); got != "second-"+fork.ID {
		t.Errorf("grandchild second file %q", got)
	}

	// Typed errors.
	if _, _, err := r.ImportCheckpoint(ctx, "localhost/forkfleet/no-such-checkpoint:1", filepath.Join(r.cfg.CheckpointRoot, "x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("import of a missing reference: %v, want ErrNotFound", err)
	}
	if _, _, err := r.ImportCheckpoint(ctx, testImage, filepath.Join(r.cfg.CheckpointRoot, "y")); !errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.Reason(err) != "NOT_A_CHECKPOINT_IMAGE" {
		t.Errorf("import of an ordinary image: %v, want NOT_A_CHECKPOINT_IMAGE", err)
	}
	if _, _, err := r.ImportCheckpoint(ctx, "not a reference", filepath.Join(r.cfg.CheckpointRoot, "z")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("import of an invalid reference: %v", err)
	}
	// An image whose blobs were not all fetched.
	incomplete := "localhost/forkfleet/ck-test:incomplete"
	m, _ := exportTestManifest("disk")
	mb, _ := json.Marshal(m)
	lctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := writeBytesBlob(lctx, cs, ocispec.MediaTypeImageManifest, mb, nil)
	if err == nil {
		_, err = is.Create(lctx, images.Image{Name: incomplete, Target: md})
	}
	done(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = r.ImportCheckpoint(ctx, incomplete, filepath.Join(r.cfg.CheckpointRoot, "w"))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.Reason(err) != "CHECKPOINT_IMAGE_INCOMPLETE" {
		t.Errorf("import of an incomplete image: %v (reason %q)", err, errdefs.Reason(err))
	}
	if err := is.Delete(ctx, incomplete, images.SynchronousDelete()); err != nil {
		t.Error(err)
	}
	if _, err := r.ExportCheckpoint(ctx, runtime.CheckpointRef{Dir: "/elsewhere/ck"}, nil, ckRef); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("export outside the checkpoint root: %v", err)
	}

	// Cleanup leaves nothing: forks, imported checkpoints, images, blobs.
	deleteQuiet(r, grand.ID)
	deleteQuiet(r, fork.ID)
	for _, rf := range []runtime.CheckpointRef{res2.Ref, ref, ref2} {
		if err := r.DeleteCheckpoint(ctx, rf); err != nil {
			t.Errorf("DeleteCheckpoint %s: %v", rf.Dir, err)
		}
	}
	var blobs []digest.Digest
	for _, n := range []string{ckRef, ckRef2} {
		img, err := is.Get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, img.Target.Digest)
		b, err := content.ReadBlob(ctx, cs, img.Target)
		if err != nil {
			t.Fatal(err)
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, l := range m.Layers {
			blobs = append(blobs, l.Digest)
		}
		if err := is.Delete(ctx, n, images.SynchronousDelete()); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range blobs {
		if _, err := cs.Info(ctx, d); !cerrdefs.IsNotFound(err) {
			t.Errorf("blob %s still there after deleting the images: %v", d, err)
		}
	}
	if n := countSnapshots(t, r); n > snapsBefore { // fewer: an earlier test's layer collected meanwhile
		t.Errorf("%d snapshots after cleanup, %d before", n, snapsBefore)
	}
	if n := leaseCount(t, r); n != leasesBefore {
		t.Errorf("%d leases after cleanup, %d before", n, leasesBefore)
	}
	if ingests, err := cs.ListStatuses(ctx); err != nil || len(ingests) != 0 {
		t.Errorf("ingests left: %v, %v", ingests, err)
	}
}

func exportBlobSize(t *testing.T, r *Runtime, d string) int64 {
	t.Helper()
	info, err := r.client.ContentStore().Info(r.ctx(context.Background()), digest.Digest(d))
	if err != nil {
		t.Fatal(err)
	}
	return info.Size
}

// TestIntegrationExportWhiteouts exports a disk-tier checkpoint whose layer
// deletes a file and a directory of the base image and makes a directory
// opaque, imports it, and checks the merged view of the imported layer.
// The layer is built through the snapshotter directly (testinit cannot
// delete files), as Checkpoint builds its layers.
// A blob the content store holds already, with nothing referencing it (its
// image just deleted), is held by the lease of the export that writes it
// again: else a collection due to that deletion removes it before the new
// manifest references it, and the exported image lacks a layer.
func TestIntegrationExportRewritesLeased(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, exportNamespace+"-again")
	ctx := r.ctx(context.Background())
	cs, ls := r.client.ContentStore(), r.client.LeasesService()
	data := []byte("blob " + randomHex(8))
	for pass := range 2 {
		lctx, done, err := r.client.WithLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d, err := writeStreamBlob(lctx, cs, ls, "application/octet-stream", func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		lid, _ := leases.FromContext(lctx)
		res, err := ls.ListResources(ctx, leases.Lease{ID: lid})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(res, leases.Resource{ID: d.Digest.String(), Type: "content"}) {
			t.Errorf("pass %d: the blob is not in the writer's lease: %v", pass, res)
		}
		// Released without a collection: the blob stays, unreferenced.
		if err := done(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// End to end: the same checkpoint exported again and again, each
	// image deleted before the next export.
	if err := buildAndImport(r); err != nil {
		t.Fatalf("test image: %v", err)
	}
	id := uniqueID("again")
	bootT(t, r, testSpec(id))
	ck := checkpointT(t, r, id, runtime.TierMemory, false)
	is := r.client.ImageService()
	for i := range 20 {
		name := "localhost/forkfleet/ck-again:" + strconv.Itoa(i)
		if _, err := r.ExportCheckpoint(ctx, ck.Ref, nil, name); err != nil {
			t.Fatal(err)
		}
		img, err := is.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := readCheckpointImage(ctx, cs, name, img.Target)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range m.manifest.Layers {
			if _, err := cs.Info(ctx, l.Digest); err != nil {
				t.Errorf("export %d: %s (%s): %v", i, l.Annotations[ocispec.AnnotationTitle], l.Digest, err)
			}
		}
		if err := is.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIntegrationExportWhiteouts(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, exportNamespace+"-wh")
	ctx := r.ctx(context.Background())
	if err := buildAndImport(r); err != nil {
		t.Fatalf("test image: %v", err)
	}
	is := r.client.ImageService()
	ckRef := "localhost/forkfleet/ck-whiteouts:1"
	t.Cleanup(func() {
		cctx := r.ctx(context.Background())
		// The runtime's prepared checkpoint layer pins the image's.
		if err := r.closeLayerSlots(cctx); err != nil {
			t.Error(err)
		}
		for _, n := range []string{ckRef, testImage} {
			if err := is.Delete(cctx, n, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("delete image %s: %v", n, err)
			}
		}
		if err := r.client.NamespaceService().Delete(context.Background(), r.cfg.Namespace); err != nil {
			t.Errorf("namespace not empty after the test: %v", err)
		}
	})
	_, chainID, err := r.baseImage(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}

	// The layer: /testinit and /etc/forkfleet deleted, /var opaque with a
	// new file, /new added.
	suffix := randomHex(8)
	prep, committed := "forkfleet-checkpoint-prepare-"+suffix, "forkfleet-checkpoint-"+suffix
	// Under a lease until its commit (which roots it): containerd's GC,
	// run by any namespace's changes, removes a prepared snapshot nothing
	// holds.
	lctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(ctx)
	ms, err := r.sn.Prepare(lctx, prep, chainID)
	if err != nil {
		t.Fatal(err)
	}
	upper, err := upperDir(ms)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mknod(filepath.Join(upper, "testinit"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(upper, "etc"), 0o755))
	must(unix.Mknod(filepath.Join(upper, "etc/forkfleet"), unix.S_IFCHR, 0))
	must(os.MkdirAll(filepath.Join(upper, "var/cache"), 0o755))
	must(unix.Lsetxattr(filepath.Join(upper, "var"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(upper, "var/cache/kept"), []byte("kept"), 0o644))
	must(os.WriteFile(filepath.Join(upper, "new"), []byte("new"), 0o644))
	must(r.sn.Commit(lctx, committed, prep, snapshots.WithLabels(map[string]string{
		snapshotLabelGCRoot: time.Now().UTC().Format(time.RFC3339), snapshotLabelCheckpoint: "synthetic",
	})))
	dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("wh"))
	must(os.MkdirAll(dir, 0o700))
	mb, _ := json.Marshal(checkpointMeta{Version: metaVersion, Source: "synthetic", Image: testImage, Snapshotter: r.cfg.Snapshotter,
		Snapshot: committed, Tier: tierName(runtime.TierDisk), CreatedAt: time.Now().UTC()})
	must(os.WriteFile(filepath.Join(dir, metaFile), mb, 0o600))
	must(os.WriteFile(filepath.Join(dir, specFile), []byte(`{"ociVersion":"1.2.0"}`), 0o600))
	src := runtime.CheckpointRef{Dir: dir, Snapshot: committed, Image: testImage, Tier: runtime.TierDisk}
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), src) })

	ex, err := r.ExportCheckpoint(ctx, src, nil, ckRef)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	if err := r.DeleteCheckpoint(ctx, src); err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(r.cfg.CheckpointRoot, uniqueID("wh-imported"))
	ref, meta, err := r.ImportCheckpoint(ctx, ckRef, dir2)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), ref) })
	if len(meta) != 0 || ref.Tier != runtime.TierDisk {
		t.Errorf("imported %+v, metadata %q", ref, meta)
	}
	if _, err := os.Stat(filepath.Join(dir2, criuImageDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("disk tier import has CRIU images: %v", err)
	}
	t.Logf("exported %s (%d B), imported as %s", ex.Digest, ex.SizeBytes, ref.Snapshot)

	view := "forkfleet-test-view-" + randomHex(4)
	vm, err := r.sn.View(lctx, view, ref.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer r.sn.Remove(ctx, view)
	must(mount.WithReadonlyTempMount(ctx, vm, func(root string) error {
		for p, want := range map[string]bool{"testinit": false, "etc": true, "etc/forkfleet": false,
			"var/lib": false, "var/log": false, "var/cache/kept": true, "new": true, "run": true} {
			_, err := os.Lstat(filepath.Join(root, p))
			if got := err == nil; got != want {
				t.Errorf("imported layer: %s exists %v, want %v (%v)", p, got, want, err)
			}
		}
		if b, err := os.ReadFile(filepath.Join(root, "new")); err != nil || string(b) != "new" {
			t.Errorf("new file: %q, %v", b, err)
		}
		return nil
	}))
}

// TestIntegrationExportDesktop measures export and import of a memory-tier
// checkpoint of the bare desktop in its own namespace, and checks a fork of
// the imported checkpoint runs the desktop with the source's file.
func TestIntegrationExportDesktop(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, exportNamespace+"-desktop")
	ctx := r.ctx(context.Background())
	image := testenv.Image(t, ctx, r.client, r.cfg.Namespace, testenv.Desktop)
	is := r.client.ImageService()
	ckRef := "localhost/forkfleet/ck-desktop:1"
	t.Cleanup(func() {
		cctx := r.ctx(context.Background())
		// The runtime's prepared checkpoint layer pins the image's.
		if err := r.closeLayerSlots(cctx); err != nil {
			t.Error(err)
		}
		for _, n := range []string{ckRef, image} {
			if err := is.Delete(cctx, n, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("delete image %s: %v", n, err)
			}
		}
		if err := r.client.NamespaceService().Delete(context.Background(), r.cfg.Namespace); err != nil {
			t.Errorf("namespace %s not empty after the test: %v", r.cfg.Namespace, err)
		}
	})
	spec := runtime.BootSpec{
		ID: uniqueID("exdesk"), Image: image, MemoryBytes: 1 << 30,
		Width: 1280, Height: 800, Depth: 24,
		ACIToken: "aci-" + randomHex(8), AdminToken: "admin-" + randomHex(8),
	}
	src := bootT(t, r, spec)
	if err := waitX(src, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, r, src.ID, []string{"Xvfb", "openbox", "xterm", "bash"}, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // let the desktop settle
	marker := "/var/lib/forkfleet/markers/export-" + randomHex(4)
	value := "desktop-" + randomHex(8)
	hostPath := func(pid uint32, p string) string { return "/proc/" + strconv.FormatUint(uint64(pid), 10) + "/root" + p }
	if err := os.MkdirAll(filepath.Dir(hostPath(src.PID, marker)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostPath(src.PID, marker), []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	srcProcs := sandboxProcs(t, r, src.ID)
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	deleteQuiet(r, src.ID)

	start := time.Now()
	ex, err := r.ExportCheckpoint(ctx, res.Ref, []byte("{}"), ckRef)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	exportT := time.Since(start)
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	ref, _, err := r.ImportCheckpoint(ctx, ckRef, filepath.Join(r.cfg.CheckpointRoot, uniqueID("desk-imported")))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	importT := time.Since(start)
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), ref) })
	t.Logf("desktop checkpoint: memory %.1f MB, layer %.1f MB; export %v (image %.1f MB), import %v",
		float64(res.MemoryBytes)/1e6, float64(res.LayerBytes)/1e6, exportT, float64(ex.SizeBytes)/1e6, importT)

	fs := spec
	fs.ID = uniqueID("exdeskfork")
	fork := restoreT(t, r, fs, ref)
	if err := waitX(fork, 10*time.Second); err != nil {
		t.Errorf("fork of the imported checkpoint: X: %v", err)
	}
	if got := sandboxProcs(t, r, fork.ID); !slices.Equal(got, srcProcs) {
		t.Errorf("fork processes %v, source had %v", got, srcProcs)
	}
	if b, err := os.ReadFile(hostPath(fork.PID, marker)); err != nil || string(b) != value {
		t.Errorf("fork marker %q, %v", b, err)
	}
	deleteQuiet(r, fork.ID)
}

// TestStreamParts cuts a zstd tar of a directory into blobs of a part size
// (a real content store: containerd's local one) and unpacks their
// concatenation: the tree comes back whole; a stream shorter than a part
// is one blob.
func TestStreamParts(t *testing.T) {
	ctx := context.Background()
	cs, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	want := map[string][]byte{}
	for i := range 4 {
		b := make([]byte, 96<<10)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		name := "pages-" + strconv.Itoa(i) + ".img"
		want[name] = b
		if err := os.WriteFile(filepath.Join(src, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	produce := func(w io.Writer) error {
		return zstdCompress(w, func(w io.Writer) error { return writeTreeTar(ctx, w, src) })
	}
	const part = 100 << 10
	descs, err := writeStreamBlobs(ctx, cs, nil, MediaTypeCheckpointCRIUZstd, part, produce)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for i, d := range descs {
		total += d.Size
		if i < len(descs)-1 && d.Size != part || d.Size > part || d.MediaType != MediaTypeCheckpointCRIUZstd {
			t.Fatalf("part %d: %+v", i, d)
		}
	}
	if len(descs) < 4 {
		t.Fatalf("%d parts of %d B (%d B in all), want at least 4", len(descs), part, total)
	}
	dst := filepath.Join(t.TempDir(), "images")
	if err := unpackBlobs(ctx, cs, "ref", descs, dst); err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s unpacked: %d B, %v", name, len(got), err)
		}
	}
	// One blob when the stream fits (the same bytes as unparted).
	whole, err := writeStreamBlobs(ctx, cs, nil, MediaTypeCheckpointCRIUZstd, 0, produce)
	if err != nil || len(whole) != 1 || whole[0].Size != total {
		t.Fatalf("unparted: %+v, %v (parts held %d B)", whole, err, total)
	}
}

// TestParseCheckpointManifestParts reads a CRIU stream cut into parts: every
// leading layer of the CRIU media type, in order.
func TestParseCheckpointManifestParts(t *testing.T) {
	m, _ := exportTestManifest("memory")
	criu := m.Layers[0]
	parts := []ocispec.Descriptor{criu, {MediaType: criu.MediaType, Digest: digest.FromString("p1"), Size: 3}, {MediaType: criu.MediaType, Digest: digest.FromString("p2"), Size: 2}}
	m.Layers = append(parts, m.Layers[1:]...)
	b, _ := json.Marshal(m)
	ck, err := parseCheckpointManifest("ref", b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(ck.criu, parts, func(a, b ocispec.Descriptor) bool { return a.Digest == b.Digest }) || len(ck.diffs) != 2 {
		t.Fatalf("criu %v, diffs %d", ck.criu, len(ck.diffs))
	}
}
