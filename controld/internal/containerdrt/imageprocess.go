//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"slices"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// imageProcess is what a sandbox's process takes from its image: the
// environment, command and working directory of its config, and its user
// with the groups the image's /etc/passwd and /etc/group give it.
type imageProcess struct {
	env, args []string
	cwd       string
	user      specs.User
}

// imageProcess resolves img's process as containerd's WithImageConfig does
// at a boot, but from a read-only view of the image itself, once per image
// digest. A fork's spec must not read its checkpoint's writable layer: the
// source sandbox could rewrite /etc/group there (supplementary groups are
// host gids), or make it a symlink that the resolution would follow on the
// host.
func (r *Runtime) imageProcess(ctx context.Context, img client.Image) (imageProcess, error) {
	key := img.Target().Digest.String()
	if p, ok := r.imageProcs.Load(key); ok {
		return p.(imageProcess), nil
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return imageProcess{}, fmt.Errorf("image %s: layers: %w", img.Name(), convertErr(err))
	}
	ctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return imageProcess{}, fmt.Errorf("lease: %w", convertErr(err))
	}
	defer done(context.WithoutCancel(ctx))
	view := "forkfleet-image-view-" + randomHex(8)
	if _, err := r.sn.View(ctx, view, identity.ChainID(diffIDs).String()); err != nil {
		return imageProcess{}, fmt.Errorf("image %s: view: %w", img.Name(), convertErr(err))
	}
	defer r.sn.Remove(context.WithoutCancel(ctx), view)
	s, err := oci.GenerateSpec(ctx, r.client, &containers.Container{ID: view, Snapshotter: r.cfg.Snapshotter, SnapshotKey: view},
		oci.WithImageConfig(img))
	if err != nil {
		return imageProcess{}, fmt.Errorf("image %s: config: %w: %w", img.Name(), errdefs.ErrFailedPrecondition, err)
	}
	p := imageProcess{env: s.Process.Env, args: s.Process.Args, cwd: s.Process.Cwd, user: s.Process.User}
	r.imageProcs.Store(key, p)
	return p, nil
}

// withImageProcess sets what imageProcess resolved, on a spec generated like
// the one it was resolved on.
func withImageProcess(p imageProcess) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.Env = slices.Clone(p.env)
		s.Process.Args = slices.Clone(p.args)
		s.Process.Cwd = p.cwd
		s.Process.User = p.user
		s.Process.User.AdditionalGids = slices.Clone(p.user.AdditionalGids)
		return nil
	}
}
