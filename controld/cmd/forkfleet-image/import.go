package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/controld/internal/ocilayout"
)

const (
	defaultAddress     = "/run/forkfleet/containerd/containerd.sock"
	defaultNamespace   = "forkfleet"
	defaultSnapshotter = "overlayfs"
	// gcExpireLabel is what containerd puts on images imported with an index
	// name; such images are collected at once (see host-stack.md).
	gcExpireLabel = "containerd.io/gc.expire"
)

type importOpts struct {
	address     string
	namespace   string
	snapshotter string
	unpack      bool
	force       bool
	layout      string
}

func parseImport(args []string) (importOpts, error) {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	o := importOpts{}
	def := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS")
	if def == "" {
		def = defaultAddress
	}
	noUnpack := false
	fs.StringVar(&o.address, "address", def, "containerd socket (default $FORKFLEET_CONTAINERD_ADDRESS or "+defaultAddress+")")
	fs.StringVar(&o.namespace, "namespace", defaultNamespace, "containerd namespace")
	fs.StringVar(&o.snapshotter, "snapshotter", defaultSnapshotter, "snapshotter to unpack into")
	fs.BoolVar(&noUnpack, "no-unpack", false, "import content only, do not unpack")
	fs.BoolVar(&o.force, "force", false, "import even if containerd has the same manifest already")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	if fs.NArg() != 1 {
		return o, fmt.Errorf("%w: import takes one layout directory", errUsage)
	}
	o.layout = fs.Arg(0)
	o.unpack = !noUnpack
	return o, nil
}

func cmdImport(ctx context.Context, args []string) error {
	o, err := parseImport(args)
	if err != nil {
		return err
	}
	c, err := containerd.New(o.address, containerd.WithDefaultNamespace(o.namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", o.address, err)
	}
	defer c.Close()
	res, err := importLayout(ctx, c, o)
	for _, r := range res {
		fmt.Println(r)
	}
	return err
}

// importResult is one image's outcome, printed one line each.
type importResult struct {
	name     string
	manifest string
	action   string // "imported", "skipped (same manifest, unpacked)", ...
	size     int64
	importT  time.Duration
	unpackT  time.Duration
}

func (r importResult) String() string {
	s := fmt.Sprintf("%s  %s  %s  %.1f MB", r.name, r.manifest, r.action, float64(r.size)/1e6)
	if r.importT > 0 {
		s += fmt.Sprintf("  import %s", r.importT.Round(time.Millisecond))
	}
	if r.unpackT > 0 {
		s += fmt.Sprintf("  unpack %s", r.unpackT.Round(time.Millisecond))
	}
	return s
}

// importLayout imports the named images of an OCI layout into containerd
// and unpacks them, skipping any image containerd already has at the same
// manifest digest (and, when unpacking, already unpacked).
func importLayout(ctx context.Context, c *containerd.Client, o importOpts) ([]importResult, error) {
	ctx = namespaces.WithNamespace(ctx, o.namespace)
	idx, err := ocilayout.ReadIndex(o.layout)
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
		return nil, fmt.Errorf("%s: no index entry has an %s annotation: nothing would be named", o.layout, ocilayout.AnnotationContainerdImageName)
	}

	var results []importResult
	if !o.force {
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

	if _, err := ocilayout.Validate(o.layout); err != nil {
		return nil, err
	}
	start := time.Now()
	imgs, err := c.Import(ctx, layoutTar(ctx, o.layout))
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", o.layout, err)
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
		if _, bad := img.Labels[gcExpireLabel]; bad {
			return results, fmt.Errorf("image %s carries %s: containerd would collect it", img.Name, gcExpireLabel)
		}
		r := importResult{name: img.Name, manifest: desc.Digest.String(), action: "imported", importT: importT}
		ci := containerd.NewImage(c, img)
		if r.size, err = ci.Size(ctx); err != nil {
			return results, fmt.Errorf("size of %s: %w", img.Name, err)
		}
		if o.unpack {
			t := time.Now()
			if err := ci.Unpack(ctx, o.snapshotter); err != nil {
				return results, fmt.Errorf("unpack %s into %s: %w", img.Name, o.snapshotter, err)
			}
			r.unpackT = time.Since(t)
			r.action = "imported+unpacked(" + o.snapshotter + ")"
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

// upToDate reports whether containerd already has name at desc's digest
// (and unpacked, when asked to unpack). Anything else means import.
func upToDate(ctx context.Context, c *containerd.Client, name string, desc ocispec.Descriptor, o importOpts) (importResult, bool, error) {
	r := importResult{name: name, manifest: desc.Digest.String()}
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
	if r.size, err = ci.Size(ctx); err != nil {
		return r, false, nil
	}
	r.action = "skipped (containerd has this manifest)"
	if o.unpack {
		unpacked, err := ci.IsUnpacked(ctx, o.snapshotter)
		if err != nil {
			return r, false, fmt.Errorf("check unpack of %s: %w", name, err)
		}
		if !unpacked {
			// Content is there: unpack only.
			t := time.Now()
			if err := ci.Unpack(ctx, o.snapshotter); err != nil {
				return r, false, fmt.Errorf("unpack %s into %s: %w", name, o.snapshotter, err)
			}
			r.unpackT = time.Since(t)
			r.action = "content present, unpacked(" + o.snapshotter + ")"
		} else {
			r.action = "skipped (same manifest, already unpacked in " + o.snapshotter + ")"
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
