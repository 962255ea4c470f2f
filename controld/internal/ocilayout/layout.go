// Package ocilayout writes OCI image layouts (image-spec v1.1 "image-layout")
// on disk: oci-layout, index.json and content-addressed blobs/sha256/...
//
// It is deliberately generic: blobs of any media type, layers, image configs,
// manifests (image or artifact) and index annotations. Blobs are always
// streamed to disk while being hashed, so a multi-GB layer is never held in
// memory. The same writer serves the desktop image build and the export of
// CRIU checkpoints as OCI artifacts.
package ocilayout

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Annotation keys written on index.json entries by Tag.
const (
	// AnnotationContainerdImageName is the full image reference containerd's
	// importer uses as the image name.
	AnnotationContainerdImageName = "io.containerd.image.name"
	// AnnotationRefName is the OCI reference name: the tag part of the name,
	// as docker/buildkit write it.
	AnnotationRefName = ocispec.AnnotationRefName
)

// Errors returned (wrapped) by this package.
var (
	ErrNotEmpty         = errors.New("ocilayout: directory is not empty")
	ErrClosed           = errors.New("ocilayout: writer is closed")
	ErrUnsupportedMedia = errors.New("ocilayout: unsupported media type")
	ErrInvalidName      = errors.New("ocilayout: invalid image name")
	ErrInvalidLayout    = errors.New("ocilayout: invalid layout")
)

// Layer is a layer blob written to the layout and the digest of its
// uncompressed content (the image config's rootfs.diff_ids entry).
type Layer struct {
	Descriptor ocispec.Descriptor
	DiffID     digest.Digest
}

// Writer writes one OCI image layout directory. It is safe for concurrent
// use: blobs may be written from several goroutines.
type Writer struct {
	dir string

	mu        sync.Mutex
	manifests []ocispec.Descriptor
	indexAnn  map[string]string
	closed    bool
}

// Create starts a new layout in dir, which must not exist or be empty.
// Nothing is valid until Close writes index.json.
func Create(dir string) (*Writer, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case err == nil && len(entries) > 0:
		return nil, fmt.Errorf("%w: %s", ErrNotEmpty, dir)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("ocilayout: read %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ocispec.ImageBlobsDir, string(digest.SHA256)), 0o755); err != nil {
		return nil, fmt.Errorf("ocilayout: create layout: %w", err)
	}
	return &Writer{dir: dir}, nil
}

// Dir is the layout's root directory.
func (w *Writer) Dir() string { return w.dir }

// BlobPath is where the blob with digest d lives in the layout rooted at dir.
func BlobPath(dir string, d digest.Digest) string {
	return filepath.Join(dir, ocispec.ImageBlobsDir, d.Algorithm().String(), d.Encoded())
}

func (w *Writer) checkOpen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	return nil
}

// WriteBlob streams r into the layout and returns its descriptor. Any media
// type is accepted; content already present (same digest) is kept as is.
func (w *Writer) WriteBlob(ctx context.Context, mediaType string, r io.Reader) (ocispec.Descriptor, error) {
	if err := w.checkOpen(); err != nil {
		return ocispec.Descriptor{}, err
	}
	if mediaType == "" {
		return ocispec.Descriptor{}, fmt.Errorf("%w: empty", ErrUnsupportedMedia)
	}
	tmp, err := os.CreateTemp(filepath.Join(w.dir, ocispec.ImageBlobsDir, string(digest.SHA256)), ".tmp-")
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: blob temp file: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()

	dg := digest.SHA256.Digester()
	n, err := io.Copy(io.MultiWriter(tmp, dg.Hash()), ctxReader{ctx: ctx, r: r})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: write blob: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: sync blob: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: close blob: %w", err)
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: dg.Digest(), Size: n}
	// Blobs are immutable and read-only in a layout.
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: chmod blob: %w", err)
	}
	if err := os.Rename(tmp.Name(), BlobPath(w.dir, desc.Digest)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: commit blob: %w", err)
	}
	committed = true
	return desc, nil
}

// WriteJSON marshals v and writes it as a blob of the given media type.
func (w *Writer) WriteJSON(ctx context.Context, mediaType string, v any) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: marshal %s: %w", mediaType, err)
	}
	return w.WriteBlob(ctx, mediaType, bytes.NewReader(b))
}

// WriteLayer streams a layer blob and computes its diff ID. Supported media
// types: uncompressed tar (diff ID = digest) and gzip tar (diff ID = digest of
// the decompressed stream, computed on the fly).
func (w *Writer) WriteLayer(ctx context.Context, mediaType string, r io.Reader) (Layer, error) {
	switch mediaType {
	case ocispec.MediaTypeImageLayer:
		desc, err := w.WriteBlob(ctx, mediaType, r)
		if err != nil {
			return Layer{}, err
		}
		return Layer{Descriptor: desc, DiffID: desc.Digest}, nil
	case ocispec.MediaTypeImageLayerGzip:
		// Tee the compressed bytes to a decompressor that hashes the diff.
		pr, pw := io.Pipe()
		diffc := make(chan digest.Digest, 1)
		errc := make(chan error, 1)
		go func() {
			zr, err := gzip.NewReader(pr)
			if err != nil {
				pr.CloseWithError(err)
				errc <- err
				return
			}
			dg := digest.SHA256.Digester()
			if _, err := io.Copy(dg.Hash(), zr); err != nil {
				pr.CloseWithError(err)
				errc <- err
				return
			}
			// Drain trailing bytes so the writer side never blocks.
			_, _ = io.Copy(io.Discard, pr)
			diffc <- dg.Digest()
		}()
		desc, err := w.WriteBlob(ctx, mediaType, io.TeeReader(r, pw))
		pw.CloseWithError(err)
		if err != nil {
			return Layer{}, err
		}
		select {
		case d := <-diffc:
			return Layer{Descriptor: desc, DiffID: d}, nil
		case err := <-errc:
			return Layer{}, fmt.Errorf("ocilayout: decompress gzip layer: %w", err)
		}
	default:
		return Layer{}, fmt.Errorf("%w: %q is not a tar layer type (write it with WriteBlob)", ErrUnsupportedMedia, mediaType)
	}
}

// LayerFromFile writes the file at path as a layer.
func (w *Writer) LayerFromFile(ctx context.Context, mediaType, path string) (Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return Layer{}, fmt.Errorf("ocilayout: open layer: %w", err)
	}
	defer f.Close()
	return w.WriteLayer(ctx, mediaType, f)
}

// LayerFromTree writes a reproducible uncompressed tar layer of entries
// (see WriteTar), streamed straight into the layout.
func (w *Writer) LayerFromTree(ctx context.Context, entries []TarEntry, opts TarOptions) (Layer, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteTar(ctx, pw, entries, opts)) }()
	l, err := w.WriteLayer(ctx, ocispec.MediaTypeImageLayer, pr)
	pr.CloseWithError(err) // unblock the tar writer if the blob write failed
	return l, err
}

// Image describes a runnable image to write with WriteImage.
type Image struct {
	// Config is the image config. RootFS is filled in from Layers; Platform
	// fields (OS, Architecture) must be set.
	Config ocispec.Image
	Layers []Layer
	// Annotations go on the manifest.
	Annotations map[string]string
}

// WriteImage writes the image config and manifest and returns the manifest
// descriptor (with the config's platform), ready for Tag.
func (w *Writer) WriteImage(ctx context.Context, img Image) (ocispec.Descriptor, error) {
	if img.Config.OS == "" || img.Config.Architecture == "" {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: image config needs os and architecture")
	}
	cfg := img.Config
	cfg.RootFS = ocispec.RootFS{Type: "layers", DiffIDs: make([]digest.Digest, 0, len(img.Layers))}
	layers := make([]ocispec.Descriptor, 0, len(img.Layers))
	for i, l := range img.Layers {
		if err := l.DiffID.Validate(); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("ocilayout: layer %d diff id: %w", i, err)
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
		layers = append(layers, l.Descriptor)
	}
	cdesc, err := w.WriteJSON(ctx, ocispec.MediaTypeImageConfig, cfg)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	mdesc, err := w.WriteManifest(ctx, ocispec.Manifest{
		Config:      cdesc,
		Layers:      layers,
		Annotations: img.Annotations,
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	mdesc.Platform = &ocispec.Platform{
		OS:           cfg.OS,
		Architecture: cfg.Architecture,
		Variant:      cfg.Variant,
		OSVersion:    cfg.OSVersion,
	}
	return mdesc, nil
}

// WriteManifest writes an image or artifact manifest (config and layers of
// any media type, already written as blobs) and returns its descriptor.
// SchemaVersion and MediaType are set; ArtifactType is carried to the
// returned descriptor as the spec asks.
func (w *Writer) WriteManifest(ctx context.Context, m ocispec.Manifest) (ocispec.Descriptor, error) {
	m.Versioned = specs.Versioned{SchemaVersion: 2}
	m.MediaType = ocispec.MediaTypeImageManifest
	if m.Config.MediaType == "" || m.Config.Digest == "" {
		return ocispec.Descriptor{}, fmt.Errorf("ocilayout: manifest needs a config descriptor (use ocispec.DescriptorEmptyJSON for artifacts)")
	}
	if m.Layers == nil {
		m.Layers = []ocispec.Descriptor{}
	}
	for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if err := w.checkBlob(d); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	desc, err := w.WriteJSON(ctx, ocispec.MediaTypeImageManifest, m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc.ArtifactType = m.ArtifactType
	return desc, nil
}

// checkBlob makes sure a descriptor names a blob of that size in the layout,
// writing the spec's empty JSON blob on demand.
func (w *Writer) checkBlob(d ocispec.Descriptor) error {
	if d.Digest == ocispec.DescriptorEmptyJSON.Digest {
		p := BlobPath(w.dir, d.Digest)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(p, ocispec.DescriptorEmptyJSON.Data, 0o444); err != nil {
				return fmt.Errorf("ocilayout: write empty json blob: %w", err)
			}
		}
	}
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("%w: descriptor %q: %v", ErrInvalidLayout, d.Digest, err)
	}
	fi, err := os.Stat(BlobPath(w.dir, d.Digest))
	if err != nil {
		return fmt.Errorf("%w: blob %s not in layout: %v", ErrInvalidLayout, d.Digest, err)
	}
	if fi.Size() != d.Size {
		return fmt.Errorf("%w: blob %s is %d bytes, descriptor says %d", ErrInvalidLayout, d.Digest, fi.Size(), d.Size)
	}
	return nil
}

// Tag adds desc (a manifest or index written to this layout) to index.json
// under name, a full reference such as "localhost/forkfleet/desktop:latest".
// The entry carries io.containerd.image.name = name and, when name has a tag,
// org.opencontainers.image.ref.name = the tag. An empty name adds an untagged
// entry. Extra annotations are merged in.
func (w *Writer) Tag(desc ocispec.Descriptor, name string, extra map[string]string) error {
	if err := w.checkOpen(); err != nil {
		return err
	}
	if err := w.checkBlob(desc); err != nil {
		return err
	}
	ann := make(map[string]string, len(extra)+2)
	for k, v := range extra {
		ann[k] = v
	}
	if name != "" {
		tag, err := tagOf(name)
		if err != nil {
			return err
		}
		ann[AnnotationContainerdImageName] = name
		if tag != "" {
			ann[AnnotationRefName] = tag
		}
	}
	if len(ann) > 0 {
		desc.Annotations = ann
	} else {
		desc.Annotations = nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.manifests = append(w.manifests, desc)
	return nil
}

// SetIndexAnnotations sets annotations on index.json itself.
func (w *Writer) SetIndexAnnotations(ann map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.indexAnn = ann
}

// tagOf validates a reference loosely (no scheme, no spaces, no empty path
// components) and returns its tag, or "" for a digest-only or untagged name.
func tagOf(name string) (string, error) {
	if strings.ContainsAny(name, " \t\n") || strings.Contains(name, "://") || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") || strings.Contains(name, "//") {
		return "", fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	ref := name
	if i := strings.Index(ref, "@"); i >= 0 {
		if _, err := digest.Parse(ref[i+1:]); err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrInvalidName, name, err)
		}
		ref = ref[:i]
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		tag := last[i+1:]
		if tag == "" || len(tag) > 128 {
			return "", fmt.Errorf("%w: %q: bad tag", ErrInvalidName, name)
		}
		return tag, nil
	}
	return "", nil
}

// Close writes oci-layout and index.json (atomically) and finishes the
// layout. The writer cannot be used afterwards.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.closed = true
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(w.dir, ocispec.ImageLayoutFile), layout); err != nil {
		return err
	}
	manifests := w.manifests
	if manifests == nil {
		manifests = []ocispec.Descriptor{}
	}
	idx, err := json.Marshal(ocispec.Index{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageIndex,
		Manifests:   manifests,
		Annotations: w.indexAnn,
	})
	if err != nil {
		return fmt.Errorf("ocilayout: marshal index: %w", err)
	}
	return writeFileAtomic(filepath.Join(w.dir, ocispec.ImageIndexFile), idx)
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return fmt.Errorf("ocilayout: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("ocilayout: write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("ocilayout: sync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("ocilayout: close %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("ocilayout: chmod %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("ocilayout: commit %s: %w", path, err)
	}
	return nil
}

// ctxReader stops a long copy when ctx is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
