//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Checkpoint images move between hosts through OCI registries with
// containerd's own remotes (core/remotes/docker): the exported image is
// pushed from the content store, and pulled back into it blob by blob,
// each blob committed only when its bytes match its digest.

// RegistryConfig says how controld reaches registries.
type RegistryConfig struct {
	// DockerConfig is the docker config.json holding credentials
	// (DefaultDockerConfig when empty).
	DockerConfig string
	// PlainHTTP lists registries (host[:port]) reached over plain HTTP;
	// loopback registries always are. Any other registry is HTTPS only.
	PlainHTTP []string
	// PartSize bounds the blobs an export cuts the CRIU images into
	// (DefaultPartSize when 0): a push cut inside a blob sends that blob
	// again whole (containerd's pusher uploads a blob in one request, and a
	// registry such as docker-registry cannot resume an upload cut inside
	// a request), the parts the registry holds not.
	PartSize int64
}

// DefaultPartSize is RegistryConfig.PartSize's default: small enough that a
// cut costs little, large enough that a bare desktop (about 1.6 MB) is one
// blob and a 300 MB one (about 420 MB) a few dozen, pushed and pulled
// registryParallel at a time.
const DefaultPartSize = 16 << 20

func (c RegistryConfig) partSize() int64 {
	if c.PartSize > 0 {
		return c.PartSize
	}
	return DefaultPartSize
}

var _ runtime.CheckpointRegistry = (*Runtime)(nil)

const (
	// pullLeaseExpiry keeps the blobs of an interrupted pull that long, so
	// a retry resumes instead of starting over.
	pullLeaseExpiry = time.Hour
	pullLeasePrefix = "forkfleet-pull-"
	// registryParallel bounds the blobs moved at once.
	registryParallel = 4
	// registryHTTPTimeout bounds connecting and the headers of a registry
	// answer (bodies are as long as the blob takes).
	registryHTTPTimeout = 30 * time.Second
)

// registryHosts is the resolver's host configuration: the scheme (plain
// HTTP only for loopback or allowed hosts), the credentials and one HTTP
// client.
func (r *Runtime) registryHosts(host string) ([]docker.RegistryHost, error) {
	cfg := r.cfg.Registry
	path := cfg.DockerConfig
	if path == "" {
		path = DefaultDockerConfig()
	}
	client := r.registryClient()
	scheme := "https"
	if plainHTTPAllowed(host, cfg.PlainHTTP) {
		scheme = "http"
	}
	h := host
	if h == "docker.io" {
		h = "registry-1.docker.io"
	}
	return []docker.RegistryHost{{
		Client:       client,
		Authorizer:   docker.NewDockerAuthorizer(docker.WithAuthClient(client), docker.WithAuthCreds(registryCreds(path))),
		Host:         h,
		Scheme:       scheme,
		Path:         "/v2",
		Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve | docker.HostCapabilityPush,
	}}, nil
}

func (r *Runtime) registryClient() *http.Client {
	r.regOnce.Do(func() {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// Registries are reached directly: an HTTP(S)_PROXY in controld's
		// environment would take loopback registries' traffic elsewhere.
		tr.Proxy = nil
		tr.ResponseHeaderTimeout = registryHTTPTimeout
		tr.DialContext = (&net.Dialer{Timeout: registryHTTPTimeout, KeepAlive: 30 * time.Second}).DialContext
		r.regClient = &http.Client{Transport: tr}
	})
	return r.regClient
}

// plainHTTPAllowed reports whether host (host[:port]) may be reached over
// plain HTTP: a loopback name or address, or a host listed in allowed.
func plainHTTPAllowed(host string, allowed []string) bool {
	if slices.Contains(allowed, host) {
		return true
	}
	h := host
	if sh, _, err := net.SplitHostPort(host); err == nil {
		h = sh
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

func (r *Runtime) resolver() remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: r.registryHosts})
}

// registryErr classifies a registry failure with errdefs classes: an
// HTTPS request answered in plain HTTP is refused by name.
func registryErr(ref string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// net/http's own wording for an HTTP answer to a TLS hello: the only
	// sign of a registry that speaks plain HTTP.
	if strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		host := ref
		if n, perr := reference.ParseNamed(ref); perr == nil {
			host = reference.Domain(n)
		}
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "PLAIN_HTTP_REFUSED",
			"registry %s speaks plain HTTP: allowed only for loopback registries or those listed in controld's registry.plain_http", host)
	}
	var ue remoteerrors.ErrUnexpectedStatus
	if errors.As(err, &ue) {
		switch ue.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%s: %w: %v", ref, errdefs.ErrPermissionDenied, err)
		case http.StatusNotFound:
			return fmt.Errorf("%s: %w: %v", ref, errdefs.ErrNotFound, err)
		}
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", ref, convertErr(err))
}

// PushCheckpoint pushes the exported image reference to its registry: the
// manifest's blobs first, those the registry lacks only, then the
// manifest. The base image's layers are named in annotations, never
// pushed. It returns the bytes of the blobs sent.
func (r *Runtime) PushCheckpoint(ctx context.Context, ref string) (int64, error) {
	if err := validateReference("reference", ref); err != nil {
		return 0, err
	}
	ctx = r.ctx(ctx)
	img, err := r.client.ImageService().Get(ctx, ref)
	if err != nil {
		return 0, fmt.Errorf("image %s: %w", ref, convertErr(err))
	}
	pushRef := ref
	if !strings.Contains(ref, "@") {
		pushRef = ref + "@" + img.Target.Digest.String()
	}
	pusher, err := r.resolver().Pusher(ctx, pushRef)
	if err != nil {
		return 0, registryErr(ref, err)
	}
	cs := r.client.ContentStore()
	p := &countingPusher{Pusher: pusher}
	if err := remotes.PushContent(ctx, p, img.Target, cs, semaphore.NewWeighted(registryParallel), platforms.All, nil); err != nil {
		return p.n.Load(), registryErr(ref, err)
	}
	if ck, err := readCheckpointImage(ctx, cs, ref, img.Target); err == nil {
		labelSource(ctx, cs, ref, ck.manifest)
	}
	return p.n.Load(), nil
}

// labelSource records on each blob of manifest that the repository of ref
// holds it (containerd's distribution source label): a later push of the
// blob to another repository of that registry asks the registry to mount
// it from there instead of uploading it again. A label that cannot be set
// only costs that upload.
func labelSource(ctx context.Context, cs content.Manager, ref string, manifest ocispec.Manifest) {
	h, err := docker.AppendDistributionSourceLabel(cs, ref)
	if err != nil {
		return
	}
	for _, d := range append([]ocispec.Descriptor{manifest.Config}, manifest.Layers...) {
		h(ctx, d)
	}
}

// countingPusher counts the bytes written to the registry (blobs it
// already has get no writer).
type countingPusher struct {
	remotes.Pusher
	n atomic.Int64
}

func (p *countingPusher) Push(ctx context.Context, d ocispec.Descriptor) (content.Writer, error) {
	w, err := p.Pusher.Push(ctx, d)
	if err != nil {
		return nil, err
	}
	return &countingContentWriter{Writer: w, n: &p.n}, nil
}

type countingContentWriter struct {
	content.Writer
	n *atomic.Int64
}

func (c *countingContentWriter) Write(b []byte) (int, error) {
	n, err := c.Writer.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// ResolveCheckpoint returns the manifest digest ref names in its registry:
// the digest a reference pinned by digest carries (no request: a cached
// import of it forks with the registry unreachable), else the registry's
// answer for the tag.
func (r *Runtime) ResolveCheckpoint(ctx context.Context, ref string) (string, error) {
	if err := validateReference("reference", ref); err != nil {
		return "", err
	}
	if n, err := reference.ParseNamed(ref); err == nil {
		if d, ok := n.(reference.Digested); ok {
			return d.Digest().String(), nil
		}
	}
	_, desc, err := r.resolver().Resolve(r.ctx(ctx), ref)
	if err != nil {
		return "", registryErr(ref, err)
	}
	if desc.MediaType != ocispec.MediaTypeImageManifest {
		return "", notCheckpointImage(ref, "media type %s", desc.MediaType)
	}
	return desc.Digest.String(), nil
}

// PullCheckpoint fetches the checkpoint image ref into the content store
// as the image named local. It fetches the manifest and the metadata blob,
// refuses a checkpoint this host cannot restore (checkRestorable), then
// fetches the rest. Blobs already in the store are not fetched again; the
// blobs of an interrupted pull stay under a lease for pullLeaseExpiry and
// a retry resumes a partial blob with a range request. It runs as named
// steps over one pullOp (see steps.go); finish ends the lease unless a
// retry may use what it holds.
func (r *Runtime) PullCheckpoint(ctx context.Context, ref, local string) (_ int64, retErr error) {
	if err := validateReference("reference", ref); err != nil {
		return 0, err
	}
	if err := validateReference("local", local); err != nil {
		return 0, err
	}
	op := &pullOp{r: r, ref: ref, local: local, resolver: r.resolver()}
	ctx = r.ctx(ctx)
	defer func() { op.finish(ctx, retErr) }()
	if err := runSteps(ctx,
		op.resolve, // the manifest's descriptor, and a fetcher of its blobs
		op.lease,   // the lease of pulls of that manifest, for what follows
	); err != nil {
		return op.fetched(), err
	}
	err := runSteps(op.ctx,
		op.fetchMeta,     // the manifest and the metadata: small, all the check needs
		op.checkHost,     // refused unless this host can restore it
		op.fetchBulk,     // the rest, a few blobs at a time
		op.labelManifest, // its gc references keep the blobs past the lease
		op.nameImage,     // the image local, on the manifest
	)
	return op.fetched(), err
}

// pullOp is one PullCheckpoint in progress.
type pullOp struct {
	r          *Runtime
	ref, local string
	resolver   remotes.Resolver

	// resolve
	target  ocispec.Descriptor
	fetcher *countingFetcher
	// lease: the context of the steps that follow, under the pull's lease
	ctx    context.Context
	leased bool
	// fetchMeta
	ck *checkpointImage
}

// fetched is how many bytes the pull fetched.
func (op *pullOp) fetched() int64 {
	if op.fetcher == nil {
		return 0
	}
	return op.fetcher.n.Load()
}

// finish ends the pull's lease once the image record holds the blobs, or
// when the pull failed for good: only a transfer that may succeed on retry
// keeps its blobs waiting; a refused checkpoint has nothing to resume.
func (op *pullOp) finish(ctx context.Context, err error) {
	if !op.leased {
		return
	}
	if err != nil && (errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return
	}
	if l, ok := leases.FromContext(op.ctx); ok {
		op.r.client.LeasesService().Delete(context.WithoutCancel(ctx), leases.Lease{ID: l})
	}
}

// resolve asks the registry for ref's manifest, which must be an image
// manifest of a sane size, and a fetcher of its blobs.
func (op *pullOp) resolve(ctx context.Context) error {
	name, target, err := op.resolver.Resolve(ctx, op.ref)
	if err != nil {
		return registryErr(op.ref, err)
	}
	if target.MediaType != ocispec.MediaTypeImageManifest {
		return notCheckpointImage(op.ref, "media type %s", target.MediaType)
	}
	if target.Size > maxManifestBytes {
		return notCheckpointImage(op.ref, "manifest of %d bytes", target.Size)
	}
	fetcher, err := op.resolver.Fetcher(ctx, name)
	if err != nil {
		return registryErr(op.ref, err)
	}
	op.target, op.fetcher = target, &countingFetcher{Fetcher: fetcher}
	return nil
}

// lease puts the steps that follow under the lease of pulls of the
// manifest.
func (op *pullOp) lease(ctx context.Context) (err error) {
	if op.ctx, err = op.r.pullLease(ctx, op.target); err != nil {
		return err
	}
	op.leased = true
	return nil
}

// fetch fetches one blob unless the store has it.
func (op *pullOp) fetch(ctx context.Context, d ocispec.Descriptor) error {
	return op.r.fetchBlob(ctx, op.r.client.ContentStore(), op.fetcher, op.ref, d)
}

// fetchMeta fetches and reads the manifest and the metadata blob.
func (op *pullOp) fetchMeta(ctx context.Context) error {
	cs := op.r.client.ContentStore()
	if err := op.fetch(ctx, op.target); err != nil {
		return err
	}
	mb, err := content.ReadBlob(ctx, cs, op.target)
	if err != nil {
		return blobErr(op.ref, "manifest", err)
	}
	ck, err := parseCheckpointManifest(op.ref, mb)
	if err != nil {
		return err
	}
	md := ck.manifest.Layers[len(ck.manifest.Layers)-1]
	if md.Size > maxMetaBytes {
		return notCheckpointImage(op.ref, "metadata of %d bytes", md.Size)
	}
	if err := op.fetch(ctx, md); err != nil {
		return err
	}
	op.ck, err = readCheckpointImage(ctx, cs, op.ref, op.target)
	return err
}

// checkHost refuses a checkpoint this host cannot restore, before the bulk
// is fetched.
func (op *pullOp) checkHost(ctx context.Context) error {
	return checkRestorable(ctx, op.ref, op.ck)
}

// fetchBulk fetches the config and the layers, a few at a time.
func (op *pullOp) fetchBulk(ctx context.Context) error {
	m := op.ck.manifest
	rest := append([]ocispec.Descriptor{m.Config}, m.Layers[:len(m.Layers)-1]...)
	sem := semaphore.NewWeighted(registryParallel)
	return images.Dispatch(ctx, images.HandlerFunc(func(ctx context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		return nil, op.fetch(ctx, d)
	}), sem, rest...)
}

// labelManifest gives the manifest the gc references that keep its blobs
// once the lease is gone (as export writes them).
func (op *pullOp) labelManifest(ctx context.Context) error {
	m := op.ck.manifest
	labels := map[string]string{gcRefContentPrefix + "config": m.Config.Digest.String()}
	for i, l := range m.Layers {
		labels[gcRefContentPrefix+"l."+strconv.Itoa(i)] = l.Digest.String()
	}
	paths := make([]string, 0, len(labels))
	for k := range labels {
		paths = append(paths, "labels."+k)
	}
	if _, err := op.r.client.ContentStore().Update(ctx, content.Info{Digest: op.target.Digest, Labels: labels}, paths...); err != nil {
		return fmt.Errorf("label manifest: %w", convertErr(err))
	}
	return nil
}

// nameImage creates (or points) the image local at the manifest, and
// labels the blobs with their source.
func (op *pullOp) nameImage(ctx context.Context) error {
	is := op.r.client.ImageService()
	img := images.Image{Name: op.local, Target: op.target}
	if _, err := is.Create(ctx, img); err != nil {
		if !cerrdefs.IsAlreadyExists(err) {
			return fmt.Errorf("image %s: %w", op.local, convertErr(err))
		}
		if _, err := is.Update(ctx, img, "target", "labels"); err != nil {
			return fmt.Errorf("image %s: %w", op.local, convertErr(err))
		}
	}
	labelSource(ctx, op.r.client.ContentStore(), op.ref, op.ck.manifest)
	return nil
}

// RemoveCheckpointImage deletes the image name; the garbage collector
// takes the blobs no other image holds.
func (r *Runtime) RemoveCheckpointImage(ctx context.Context, name string) error {
	if err := validateReference("name", name); err != nil {
		return err
	}
	if err := r.client.ImageService().Delete(r.ctx(ctx), name); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("image %s: %w", name, convertErr(err))
	}
	return nil
}

// pullLease returns ctx under the lease of pulls of target: one per
// manifest digest, kept (until it expires) when the pull fails so that
// its finished and partial blobs wait for the retry.
func (r *Runtime) pullLease(ctx context.Context, target ocispec.Descriptor) (context.Context, error) {
	id := pullLeasePrefix + target.Digest.Encoded()
	ls := r.client.LeasesService()
	_, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(pullLeaseExpiry))
	if err != nil && !cerrdefs.IsAlreadyExists(err) {
		return ctx, fmt.Errorf("pull lease: %w", convertErr(err))
	}
	return leases.WithLease(ctx, id), nil
}

// fetchBlob fetches one blob unless the store has it. A blob whose bytes
// do not match its digest is refused, and its partial copy dropped so that
// a retry fetches it anew.
func (r *Runtime) fetchBlob(ctx context.Context, cs content.Store, f remotes.Fetcher, ref string, d ocispec.Descriptor) error {
	// A blob the store has already (left by an earlier, refused pull, or
	// held by something else) joins this pull's lease before it counts as
	// fetched: otherwise a garbage collection before the manifest is
	// labelled removes it, and the pull failed with "label manifest: not
	// found" once in a fresh-clone CI run.
	if l, ok := leases.FromContext(ctx); ok {
		if err := r.client.LeasesService().AddResource(ctx, leases.Lease{ID: l}, leases.Resource{ID: d.Digest.String(), Type: "content"}); err != nil {
			return fmt.Errorf("pull lease: %w", convertErr(err))
		}
	}
	if _, err := cs.Info(ctx, d.Digest); err == nil {
		return nil
	}
	err := remotes.Fetch(ctx, cs, f, d)
	if err == nil || cerrdefs.IsAlreadyExists(err) {
		return nil
	}
	if cerrdefs.IsFailedPrecondition(err) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		// Commit refuses bytes that do not hash to the digest, and Copy
		// more bytes than the size: the registry (or a man in the middle)
		// served other content.
		cs.Abort(context.WithoutCancel(ctx), remotes.MakeRefKey(ctx, d))
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "DIGEST_MISMATCH",
			"%s: blob %s served by the registry does not match its digest (refused): %v", ref, d.Digest, err)
	}
	return fmt.Errorf("fetch blob %s: %w", d.Digest, registryErr(ref, err))
}

// countingFetcher counts the bytes fetched; its readers keep the Seek of
// containerd's (ranged requests: a resumed blob fetches only its rest).
type countingFetcher struct {
	remotes.Fetcher
	n atomic.Int64
}

func (f *countingFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.Fetcher.Fetch(ctx, d)
	if err != nil {
		return nil, err
	}
	if s, ok := rc.(io.ReadSeekCloser); ok {
		return &countingReadSeeker{ReadSeekCloser: s, n: &f.n}, nil
	}
	return &countingReader{ReadCloser: rc, n: &f.n}, nil
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countingReadSeeker struct {
	io.ReadSeekCloser
	n *atomic.Int64
}

func (c *countingReadSeeker) Read(p []byte) (int, error) {
	n, err := c.ReadSeekCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}
