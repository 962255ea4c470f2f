//go:build linux

package containerdrt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
)

// CRIU options per image. An image names what its apps need from CRIU in
// its config labels; controld admits only the options below (anything else
// in a CRIU config runs on the host as root: action scripts, lib dirs), with
// bounds, and carries them in the sandbox's spec so its checkpoints and
// forks use the same CRIU config file:
//
//	org.forkfleet.criu.ghost-limit        bytes (K, M suffixes), at most 256M:
//	                                      deleted files a process still holds
//	                                      are copied into the images up to it
//	                                      (CRIU's default 1M; Chromium keeps
//	                                      shared memory of up to 4 MiB there)
//	org.forkfleet.criu.irmap-scan-paths   absolute paths, comma separated:
//	                                      where CRIU looks for the files of
//	                                      inotify watches it cannot open by
//	                                      handle (overlayfs cannot), in the
//	                                      sandbox's root
const (
	LabelCRIUGhostLimit     = "org.forkfleet.criu.ghost-limit"
	LabelCRIUIrmapScanPaths = "org.forkfleet.criu.irmap-scan-paths"
)

// criuOptionsAnnotation records the admitted image options in a sandbox's
// spec (one per line), so forks and later checkpoints of it find them
// without the image, which may have changed since.
const criuOptionsAnnotation = "forkfleet.dev/criu-options"

const (
	maxGhostLimit     = 256 << 20
	maxIrmapScanPaths = 16
)

// imageCRIUOptions returns the CRIU config lines an image's labels ask for,
// or an INVALID_ARGUMENT error naming the bad label.
func imageCRIUOptions(labels map[string]string) ([]string, error) {
	var out []string
	if v, ok := labels[LabelCRIUGhostLimit]; ok {
		n, err := parseBytes(v)
		if err != nil || n <= 0 || n > maxGhostLimit {
			return nil, errdefs.InvalidField("image.labels", "%s=%q: want a size of 1 byte to 256M", LabelCRIUGhostLimit, v)
		}
		out = append(out, "ghost-limit "+strconv.FormatInt(n, 10))
	}
	if v, ok := labels[LabelCRIUIrmapScanPaths]; ok {
		paths := strings.Split(v, ",")
		if len(paths) > maxIrmapScanPaths {
			return nil, errdefs.InvalidField("image.labels", "%s: at most %d paths", LabelCRIUIrmapScanPaths, maxIrmapScanPaths)
		}
		for _, p := range paths {
			if !cleanAbsPath(p) {
				return nil, errdefs.InvalidField("image.labels", "%s: %q is not a clean absolute path", LabelCRIUIrmapScanPaths, p)
			}
			out = append(out, "irmap-scan-path "+p)
		}
	}
	return out, nil
}

// parseCRIUOptions reads criuOptionsAnnotation back, admitting exactly what
// imageCRIUOptions produces: a spec may come from an imported checkpoint.
func parseCRIUOptions(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	labels := map[string]string{}
	var paths []string
	for _, line := range strings.Split(v, "\n") {
		key, val, _ := strings.Cut(line, " ")
		switch key {
		case "ghost-limit":
			if _, dup := labels[LabelCRIUGhostLimit]; dup {
				return nil, errdefs.InvalidField("spec.annotations", "%s: ghost-limit twice", criuOptionsAnnotation)
			}
			labels[LabelCRIUGhostLimit] = val
		case "irmap-scan-path":
			paths = append(paths, val)
		default:
			return nil, errdefs.InvalidField("spec.annotations", "%s: CRIU option %q is not admitted", criuOptionsAnnotation, key)
		}
	}
	if len(paths) > 0 {
		labels[LabelCRIUIrmapScanPaths] = strings.Join(paths, ",")
	}
	return imageCRIUOptions(labels)
}

func cleanAbsPath(p string) bool {
	return strings.HasPrefix(p, "/") && path.Clean(p) == p && !strings.ContainsAny(p, " \t\r\n\x00\"'\\#")
}

// parseBytes reads "67108864", "64M" or "512K".
func parseBytes(v string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "M"):
		mult, v = 1<<20, strings.TrimSuffix(v, "M")
	case strings.HasSuffix(v, "K"):
		mult, v = 1<<10, strings.TrimSuffix(v, "K")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > maxGhostLimit {
		return 0, fmt.Errorf("bad size %q", v)
	}
	return n * mult, nil
}

// imageCRIUOptions reads the CRIU options of img's config labels, once per
// image digest: the config is content-addressed, and reading it is a few
// round trips to containerd's content store (manifest, config) on every
// cold boot's path to its container.
func (r *Runtime) imageCRIUOptions(ctx context.Context, img client.Image) ([]string, error) {
	key := img.Target().Digest
	if v, ok := r.imageCRIUOpts.Load(key); ok {
		return v.([]string), nil
	}
	ispec, err := img.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", img.Name(), convertErr(err))
	}
	opts, err := imageCRIUOptions(ispec.Config.Labels)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Name(), err)
	}
	r.imageCRIUOpts.Store(key, opts)
	return opts, nil
}

// withImageCRIUOptions records the image's CRIU options in the spec.
func withImageCRIUOptions(opts []string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		if len(opts) == 0 {
			delete(s.Annotations, criuOptionsAnnotation)
			return nil
		}
		s.Annotations[criuOptionsAnnotation] = strings.Join(opts, "\n")
		return nil
	}
}

// criuConfigFor returns the CRIU config file for a sandbox with the given
// image options: the runtime's own file when there are none, else one file
// per distinct set (named by its hash, written once), the runtime's options
// first: CRIU lets a later line override an earlier one.
func (r *Runtime) criuConfigFor(imageOpts []string) (string, error) {
	if len(imageOpts) == 0 {
		return r.criuConfig, nil
	}
	body := strings.Join(slices.Concat(r.criuOptions, imageOpts), "\n") + "\n"
	sum := sha256.Sum256([]byte(body))
	p := filepath.Join(r.cfg.StateDir, "criu-"+hex.EncodeToString(sum[:8])+".conf")
	if b, err := os.ReadFile(p); err == nil && string(b) == body {
		return p, nil
	}
	if err := atomicfile.Write(p, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("containerdrt: criu config: %w: %w", errdefs.ErrInternal, err)
	}
	return p, nil
}

// A lazy restore's CRIU config is its eager one's twin with lazy-pages
// added, named after it: runc hands it to the restore, and a dump of the
// replica (criuDumpRequest) takes the eager one back (a dump with
// lazy-pages would leave the pages out of the images).
const lazyConfigSuffix = ".lazy.conf"

// lazyCRIUConfig writes (once) and returns eager's lazy twin.
func (r *Runtime) lazyCRIUConfig(eager string) (string, error) {
	if filepath.Dir(eager) != r.cfg.StateDir || !strings.HasSuffix(eager, ".conf") {
		return "", fmt.Errorf("containerdrt: criu config %s is not this runtime's: %w", eager, errdefs.ErrInternal)
	}
	b, err := os.ReadFile(eager)
	if err != nil {
		return "", fmt.Errorf("containerdrt: criu config: %w: %w", errdefs.ErrInternal, err)
	}
	body := string(b) + "lazy-pages\n"
	p := strings.TrimSuffix(eager, ".conf") + lazyConfigSuffix
	if old, err := os.ReadFile(p); err == nil && string(old) == body {
		return p, nil
	}
	if err := atomicfile.Write(p, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("containerdrt: criu config: %w: %w", errdefs.ErrInternal, err)
	}
	return p, nil
}

// eagerCRIUConfig is the eager config of a lazy one (else p itself).
func eagerCRIUConfig(p string) string {
	if base, ok := strings.CutSuffix(p, lazyConfigSuffix); ok {
		return base + ".conf"
	}
	return p
}
