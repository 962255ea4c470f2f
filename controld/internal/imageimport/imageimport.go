// Package imageimport imports the images of an OCI layout into containerd
// and unpacks them, skipping what containerd already has. forkfleet-image
// and the real-stack tests share it.
package imageimport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/controld/internal/ocilayout"
)

// GCExpireLabel is what containerd puts on images imported with an index
// name; such images are collected at once (see host-stack.md).
const GCExpireLabel = "containerd.io/gc.expire"

// DefaultDesktopLayout is where images/desktop/build.sh keeps the desktop
// image's OCI layout.
const DefaultDesktopLayout = "/var/cache/forkfleet/images/desktop-oci"

// Options says what to import where.
type Options struct {
	Namespace   string
	Snapshotter string
	Unpack      bool
	Force       bool // import even if containerd has the same manifest already
	Layout      string
}

// Result is one image's outcome, printed one line each.
type Result struct {
	Name     string
	Manifest string
	Action   string // "imported", "skipped (same manifest, unpacked)", ...
	Size     int64
	ImportT  time.Duration
	UnpackT  time.Duration
}

func (r Result) String() string {
	s := fmt.Sprintf("%s  %s  %s  %.1f MB", r.Name, r.Manifest, r.Action, float64(r.Size)/1e6)
	if r.ImportT > 0 {
		s += fmt.Sprintf("  import %s", r.ImportT.Round(time.Millisecond))
	}
	if r.UnpackT > 0 {
		s += fmt.Sprintf("  unpack %s", r.UnpackT.Round(time.Millisecond))
	}
	return s
}

// Import imports the named images of an OCI layout into containerd
// and unpacks them, skipping any image containerd already has at the same
// manifest digest (and, when unpacking, already unpacked).
func Import(ctx context.Context, c *containerd.Client, o Options) ([]Result, error) {
	ctx = namespaces.WithNamespace(ctx, o.Namespace)
	idx, err := ocilayout.ReadIndex(o.Layout)
	if err != nil {
		return nil, err
	}
	want := map[string]ocispec.Descriptor{}
	for _, m := range idx.Manifests {
		if name := m.Annotations[ocilayout.AnnotationContainerdImageName]; name != "" {
			want[name] = m
		}
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("%s: no index entry has an %s annotation: nothing would be named", o.Layout, ocilayout.AnnotationContainerdImageName)
	}

	var results []Result
	if !o.Force {
		done := true
		for name, desc := range want {
			r, ok, err := upToDate(ctx, c, name, desc, o)
			if err != nil {
				return nil, err
			}
			if !ok {
				done = false
				break
			}
			results = append(results, r)
		}
		if done {
			return results, nil
		}
		results = nil
	}

	if _, err := ocilayout.Validate(o.Layout); err != nil {
		return nil, err
	}
	start := time.Now()
	imgs, err := c.Import(ctx, layoutTar(ctx, o.Layout))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", o.Layout, err)
	}
	importT := time.Since(start)

	for _, img := range imgs {
		desc, ok := want[img.Name]
		if !ok {
			continue
		}
		if img.Target.Digest != desc.Digest {
			return results, fmt.Errorf("image %s points at %s after import, layout has %s", img.Name, img.Target.Digest, desc.Digest)
		}
		if _, bad := img.Labels[GCExpireLabel]; bad {
			return results, fmt.Errorf("image %s carries %s: containerd would collect it", img.Name, GCExpireLabel)
		}
		r := Result{Name: img.Name, Manifest: desc.Digest.String(), Action: "imported", ImportT: importT}
		ci := containerd.NewImage(c, img)
		if r.Size, err = ci.Size(ctx); err != nil {
			return results, fmt.Errorf("size of %s: %w", img.Name, err)
		}
		if o.Unpack {
			t := time.Now()
			if err := unpack(ctx, ci, o.Snapshotter); err != nil {
				return results, fmt.Errorf("unpack %s into %s: %w", img.Name, o.Snapshotter, err)
			}
			r.UnpackT = time.Since(t)
			r.Action = "imported+unpacked(" + o.Snapshotter + ")"
		}
		results = append(results, r)
		delete(want, img.Name)
	}
	if len(want) > 0 {
		for name := range want {
			return results, fmt.Errorf("containerd created no image %s from the layout", name)
		}
	}
	return results, nil
}

// unpack unpacks img, again when containerd's garbage collector raced it:
// an image imported over an older version unreferences the older one's
// layers until the new one is unpacked, and the unpacker does not hold the
// layers it finds already there, so the collector may remove one between
// the unpacker's look and its use ("parent snapshot ... does not exist").
// The content stays (the image references it); a retry extracts the layer
// again.
func unpack(ctx context.Context, img containerd.Image, snapshotter string) error {
	var err error
	for range 3 {
		if err = img.Unpack(ctx, snapshotter); err == nil || !errdefs.IsNotFound(err) {
			return err
		}
	}
	return err
}

// upToDate reports whether containerd already has name at desc's digest
// (and unpacked, when asked to unpack). Anything else means import.
func upToDate(ctx context.Context, c *containerd.Client, name string, desc ocispec.Descriptor, o Options) (Result, bool, error) {
	r := Result{Name: name, Manifest: desc.Digest.String()}
	img, err := c.ImageService().Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("look up image %s: %w", name, err)
	}
	if img.Target.Digest != desc.Digest {
		return r, false, nil
	}
	ci := containerd.NewImage(c, img)
	// Content may have been collected or removed under the record.
	if ok, _, _, _, err := images.Check(ctx, c.ContentStore(), img.Target, platforms.Default()); err != nil || !ok {
		return r, false, nil
	}
	if r.Size, err = ci.Size(ctx); err != nil {
		return r, false, nil
	}
	r.Action = "skipped (containerd has this manifest)"
	if o.Unpack {
		unpacked, err := ci.IsUnpacked(ctx, o.Snapshotter)
		if err != nil {
			return r, false, fmt.Errorf("check unpack of %s: %w", name, err)
		}
		if !unpacked {
			// Content is there: unpack only.
			t := time.Now()
			if err := unpack(ctx, ci, o.Snapshotter); err != nil {
				return r, false, fmt.Errorf("unpack %s into %s: %w", name, o.Snapshotter, err)
			}
			r.UnpackT = time.Since(t)
			r.Action = "content present, unpacked(" + o.Snapshotter + ")"
		} else {
			r.Action = "skipped (same manifest, already unpacked in " + o.Snapshotter + ")"
		}
	}
	return r, true, nil
}

// layoutTar streams the layout directory as the tar containerd's importer
// reads, without staging it anywhere.
func layoutTar(ctx context.Context, dir string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		err := ocilayout.WriteTar(ctx, pw, []ocilayout.TarEntry{{Source: dir, Dest: "/"}}, ocilayout.TarOptions{NoParents: true})
		if err != nil && !errors.Is(err, io.ErrClosedPipe) {
			err = fmt.Errorf("stream layout %s: %w", dir, err)
		}
		pw.CloseWithError(err)
	}()
	return pr
}
