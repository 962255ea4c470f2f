package ocilayout

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ReadIndex reads and decodes index.json of the layout at dir.
func ReadIndex(dir string) (ocispec.Index, error) {
	var idx ocispec.Index
	if err := readJSONFile(filepath.Join(dir, ocispec.ImageIndexFile), &idx); err != nil {
		return idx, err
	}
	return idx, nil
}

// ReadBlobJSON decodes the JSON blob desc from the layout at dir after
// checking its size and digest.
func ReadBlobJSON(dir string, desc ocispec.Descriptor, v any) error {
	if desc.Size > maxJSONBlob {
		return fmt.Errorf("%w: %s blob %s is %d bytes, larger than %d", ErrInvalidLayout, desc.MediaType, desc.Digest, desc.Size, maxJSONBlob)
	}
	b, err := os.ReadFile(BlobPath(dir, desc.Digest))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidLayout, err)
	}
	if int64(len(b)) != desc.Size || digest.SHA256.FromBytes(b) != desc.Digest {
		return fmt.Errorf("%w: blob %s does not match its descriptor", ErrInvalidLayout, desc.Digest)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: decode %s: %v", ErrInvalidLayout, desc.Digest, err)
	}
	return nil
}

// maxJSONBlob bounds manifests, indexes and configs read into memory.
const maxJSONBlob = 4 << 20

func readJSONFile(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidLayout, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSONBlob+1))
	if err != nil {
		return fmt.Errorf("%w: read %s: %v", ErrInvalidLayout, path, err)
	}
	if len(b) > maxJSONBlob {
		return fmt.Errorf("%w: %s larger than %d bytes", ErrInvalidLayout, path, maxJSONBlob)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: decode %s: %v", ErrInvalidLayout, path, err)
	}
	return nil
}

// Validate checks the layout at dir: the oci-layout version, index.json, and
// every manifest, index and blob reachable from it (existence, size, sha256
// digest, media types, and for images that rootfs.diff_ids matches the layers,
// equal to the digest for uncompressed tar layers). Blobs are streamed, not
// loaded. It returns the number of blobs checked.
func Validate(dir string) (int, error) {
	var lay ocispec.ImageLayout
	if err := readJSONFile(filepath.Join(dir, ocispec.ImageLayoutFile), &lay); err != nil {
		return 0, err
	}
	if lay.Version != ocispec.ImageLayoutVersion {
		return 0, fmt.Errorf("%w: oci-layout version %q, want %q", ErrInvalidLayout, lay.Version, ocispec.ImageLayoutVersion)
	}
	idx, err := ReadIndex(dir)
	if err != nil {
		return 0, err
	}
	v := validator{dir: dir, checked: map[digest.Digest]bool{}}
	if err := v.index(idx); err != nil {
		return len(v.checked), err
	}
	return len(v.checked), nil
}

type validator struct {
	dir     string
	checked map[digest.Digest]bool
}

func (v *validator) index(idx ocispec.Index) error {
	if idx.SchemaVersion != 2 {
		return fmt.Errorf("%w: index schemaVersion %d", ErrInvalidLayout, idx.SchemaVersion)
	}
	if idx.MediaType != "" && idx.MediaType != ocispec.MediaTypeImageIndex {
		return fmt.Errorf("%w: index mediaType %q", ErrInvalidLayout, idx.MediaType)
	}
	for _, m := range idx.Manifests {
		switch m.MediaType {
		case ocispec.MediaTypeImageManifest:
			if err := v.manifest(m); err != nil {
				return err
			}
		case ocispec.MediaTypeImageIndex:
			var child ocispec.Index
			if err := ReadBlobJSON(v.dir, m, &child); err != nil {
				return err
			}
			v.checked[m.Digest] = true
			if err := v.index(child); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: index entry %s has media type %q", ErrInvalidLayout, m.Digest, m.MediaType)
		}
	}
	return nil
}

func (v *validator) manifest(desc ocispec.Descriptor) error {
	var m ocispec.Manifest
	if err := ReadBlobJSON(v.dir, desc, &m); err != nil {
		return err
	}
	v.checked[desc.Digest] = true
	if m.SchemaVersion != 2 || m.MediaType != ocispec.MediaTypeImageManifest {
		return fmt.Errorf("%w: manifest %s: schemaVersion %d mediaType %q", ErrInvalidLayout, desc.Digest, m.SchemaVersion, m.MediaType)
	}
	for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if err := v.blob(d); err != nil {
			return err
		}
	}
	if m.Config.MediaType != ocispec.MediaTypeImageConfig {
		return nil // artifact: nothing more to cross-check
	}
	var cfg ocispec.Image
	if err := ReadBlobJSON(v.dir, m.Config, &cfg); err != nil {
		return err
	}
	if cfg.RootFS.Type != "layers" {
		return fmt.Errorf("%w: config %s: rootfs.type %q", ErrInvalidLayout, m.Config.Digest, cfg.RootFS.Type)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("%w: manifest %s has %d layers, config %d diff_ids", ErrInvalidLayout, desc.Digest, len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	for i, l := range m.Layers {
		switch l.MediaType {
		case ocispec.MediaTypeImageLayer:
			if cfg.RootFS.DiffIDs[i] != l.Digest {
				return fmt.Errorf("%w: layer %d: diff_id %s != digest %s of an uncompressed layer", ErrInvalidLayout, i, cfg.RootFS.DiffIDs[i], l.Digest)
			}
		case ocispec.MediaTypeImageLayerGzip, ocispec.MediaTypeImageLayerZstd,
			ocispec.MediaTypeImageLayerNonDistributable, ocispec.MediaTypeImageLayerNonDistributableGzip, //nolint:staticcheck // still valid in layouts
			ocispec.MediaTypeImageLayerNonDistributableZstd: //nolint:staticcheck
		default:
			return fmt.Errorf("%w: image layer %d has media type %q", ErrInvalidLayout, i, l.MediaType)
		}
	}
	return nil
}

// blob streams a blob and checks its size and digest.
func (v *validator) blob(d ocispec.Descriptor) error {
	if v.checked[d.Digest] {
		return nil
	}
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidLayout, err)
	}
	if d.MediaType == "" {
		return fmt.Errorf("%w: blob %s has no media type", ErrInvalidLayout, d.Digest)
	}
	f, err := os.Open(BlobPath(v.dir, d.Digest))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidLayout, err)
	}
	defer f.Close()
	vr := d.Digest.Verifier()
	n, err := io.Copy(vr, f)
	if err != nil {
		return fmt.Errorf("%w: read %s: %v", ErrInvalidLayout, d.Digest, err)
	}
	if n != d.Size {
		return fmt.Errorf("%w: blob %s is %d bytes, descriptor says %d", ErrInvalidLayout, d.Digest, n, d.Size)
	}
	if !vr.Verified() {
		return fmt.Errorf("%w: blob %s content does not match its digest", ErrInvalidLayout, d.Digest)
	}
	v.checked[d.Digest] = true
	return nil
}
