//go:build linux

package containerdrt

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	cerrdefs "github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// TestIntegrationImageMovedUnderCheckpoint: an image re-imported under its
// name while a sandbox booted from it runs and a checkpoint of it exists
// (an operator's `make image`) keeps the old image's content for them, so
// the checkpoint still forks and exports on the image it was taken on;
// once they are gone, so is that content.
func TestIntegrationImageMovedUnderCheckpoint(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := r.ctx(context.Background())
	is, cs := r.client.ImageService(), r.client.ContentStore()
	ns := r.cfg.Namespace
	name := "localhost/forkfleet/pin-test:" + randomHex(4)
	exported := "localhost/forkfleet/pin-test-ck:" + randomHex(4)
	oldBuild := testenv.Rebuild(t, ctx, r.client, ns, testImage, name, "old-"+randomHex(4))
	t.Cleanup(func() {
		for _, n := range []string{name, exported} {
			if err := is.Delete(context.WithoutCancel(ctx), n, images.SynchronousDelete()); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("delete image %s: %v", n, err)
			}
		}
	})

	spec := testSpec(uniqueID("pinsrc"))
	spec.Image = name
	src := bootT(t, r, spec)
	mustCall(t, src, "set pinned-build")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if res.Ref.ImageDigest != oldBuild.Digest.String() {
		t.Fatalf("checkpoint pins %q, want %s", res.Ref.ImageDigest, oldBuild.Digest)
	}

	// The name moves to a new build; nothing names the old one any more.
	newBuild := testenv.Rebuild(t, ctx, r.client, ns, testImage, name, "new-"+randomHex(4))
	testenv.CollectGarbage(t, ctx, r.client, ns, testImage)
	if _, err := cs.Info(ctx, oldBuild.Digest); err != nil {
		t.Fatalf("the old build's manifest went with the sandbox and checkpoint on it: %v", err)
	}

	fork := restoreT(t, r, testSpec(uniqueID("pinfork")), res.Ref)
	if got := mustCall(t, fork, "get"); got != "pinned-build" {
		t.Errorf("fork value %q", got)
	}
	c, err := r.client.LoadContainer(ctx, fork.ID)
	if err != nil {
		t.Fatal(err)
	}
	if labels, err := c.Labels(ctx); err != nil || labels[labelImageDigest] != oldBuild.Digest.String() || labels[labelImagePin] != oldBuild.Digest.String() {
		t.Errorf("fork's labels %v (%v), want the old build %s pinned", labels, err, oldBuild.Digest)
	}
	// A second checkpoint of the source, taken after the move, is of the
	// old build too.
	res2 := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if res2.Ref.ImageDigest != oldBuild.Digest.String() {
		t.Errorf("checkpoint after the move pins %q, want %s", res2.Ref.ImageDigest, oldBuild.Digest)
	}
	ex, err := r.ExportCheckpoint(ctx, res.Ref, nil, exported)
	if err != nil {
		t.Fatalf("export after the move: %v", err)
	}
	_, man := imageManifest(t, ctx, r, exported)
	if got := man.Annotations[ocispec.AnnotationBaseImageDigest]; got != oldBuild.Digest.String() {
		t.Errorf("export %s names base %s, want the old build %s", ex.Digest, got, oldBuild.Digest)
	}
	if err := is.Delete(ctx, exported); err != nil {
		t.Fatal(err)
	}

	// Everything on the old build goes, and its content with it.
	for _, id := range []string{fork.ID, src.ID} {
		if err := r.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range []runtime.CheckpointRef{res.Ref, res2.Ref} {
		if err := r.DeleteCheckpoint(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}
	testenv.CollectGarbage(t, ctx, r.client, ns, testImage)
	if _, err := cs.Info(ctx, oldBuild.Digest); !cerrdefs.IsNotFound(err) {
		t.Errorf("the old build's manifest outlived every sandbox and checkpoint on it: %v", err)
	}
	if _, err := cs.Info(ctx, newBuild.Digest); err != nil {
		t.Errorf("the name's build: %v", err)
	}
}
