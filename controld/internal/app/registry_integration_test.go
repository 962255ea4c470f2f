package app_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// blobProxy sits between controld and a real registry on loopback: it
// counts the bytes of each blob it serves and the ranges asked for, and can
// serve one blob with a byte changed (alter), or cut its connection midway
// and then answer 503 for it (cut: a registry gone mid-transfer, beyond
// the reconnects containerd's fetcher makes by itself).
type blobProxy struct {
	rp *httputil.ReverseProxy

	mu       sync.Mutex
	alter    string // digest served with one byte flipped
	cut      string // digest whose next GET is cut after cutAfter bytes
	cutAfter int64
	down     string           // digest answered 503 (after its cut)
	cutPut   string           // digest whose next upload is cut after cutAfter bytes
	uploads  map[string]int64 // digest -> upload bytes received (PUT and PATCH bodies)
	inflight int              // uploads being forwarded
	served   map[string]int64
	ranges   map[string][]string
}

func newBlobProxy(registry string) *blobProxy {
	p := &blobProxy{served: map[string]int64{}, ranges: map[string][]string{}, uploads: map[string]int64{}}
	p.rp = &httputil.ReverseProxy{
		// The Host header stays the proxy's, so the registry's upload
		// locations point back here.
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", registry
			r.Out.Host = r.In.Host
		},
		Transport: &http.Transport{Proxy: nil},
		ModifyResponse: func(resp *http.Response) error {
			dg := blobDigest(resp.Request)
			if dg == "" || resp.StatusCode/100 != 2 {
				return nil
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			p.ranges[dg] = append(p.ranges[dg], resp.Request.Header.Get("Range"))
			b := &proxyBody{ReadCloser: resp.Body, p: p, dg: dg, limit: -1}
			if dg == p.alter {
				b.flipAt = 0
			} else {
				b.flipAt = -1
			}
			if dg == p.cut {
				b.limit, p.cut, p.down = p.cutAfter, "", dg
			}
			resp.Body = b
			return nil
		},
	}
	return p
}

func (p *blobProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := ""
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blobs/uploads/") {
		up = r.URL.Query().Get("digest")
	}
	p.mu.Lock()
	down := p.down != "" && blobDigest(r) == p.down
	// Every upload of the part is cut until reset: containerd's transport
	// retries an upload whose connection ended in EOF (no response yet, as
	// when all its bytes were already read), so cutting only the first
	// attempt let a cut push succeed now and then.
	cut := up != "" && up == p.cutPut
	limit := p.cutAfter
	p.mu.Unlock()
	if down {
		http.Error(w, "registry down", http.StatusServiceUnavailable)
		return
	}
	if cut {
		// Take part of the upload, let the uploads in flight arrive (a
		// connection lost after them: the case a retry can save), then
		// drop the connection.
		n, _ := io.CopyN(io.Discard, r.Body, limit)
		p.count(p.uploads, up, n)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			p.mu.Lock()
			idle := p.inflight == 0
			p.mu.Unlock()
			if idle {
				break
			}
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	if up != "" {
		r.Body = &countingBody{ReadCloser: r.Body, count: func(n int64) { p.count(p.uploads, up, n) }}
		p.mu.Lock()
		p.inflight++
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.inflight--
			p.mu.Unlock()
		}()
	}
	p.rp.ServeHTTP(w, r)
}

func (p *blobProxy) count(m map[string]int64, dg string, n int64) {
	p.mu.Lock()
	m[dg] += n
	p.mu.Unlock()
}

type countingBody struct {
	io.ReadCloser
	count func(int64)
}

func (b *countingBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	b.count(int64(n))
	return n, err
}

// reset clears the counters and sets what to alter or cut next.
func (p *blobProxy) reset(alter, cut string, cutAfter int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.alter, p.cut, p.cutAfter, p.down, p.cutPut = alter, cut, cutAfter, "", ""
	p.served, p.ranges, p.uploads = map[string]int64{}, map[string][]string{}, map[string]int64{}
}

// cutUpload makes every upload of digest dg stop after n bytes, until reset.
func (p *blobProxy) cutUpload(dg string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutPut, p.cutAfter = dg, n
	p.uploads = map[string]int64{}
}

func (p *blobProxy) uploaded() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int64{}
	for k, v := range p.uploads {
		out[k] = v
	}
	return out
}

func (p *blobProxy) stats() (map[string]int64, map[string][]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, r := map[string]int64{}, map[string][]string{}
	for k, v := range p.served {
		s[k] = v
	}
	for k, v := range p.ranges {
		r[k] = append([]string(nil), v...)
	}
	return s, r
}

// blobDigest is the digest of a blob GET, "" for anything else.
func blobDigest(r *http.Request) string {
	if r.Method != http.MethodGet {
		return ""
	}
	_, dg, ok := strings.Cut(r.URL.Path, "/blobs/")
	if !ok || strings.Contains(dg, "/") {
		return ""
	}
	return dg
}

type proxyBody struct {
	io.ReadCloser
	p      *blobProxy
	dg     string
	n      int64
	flipAt int64 // byte offset to flip; -1: none
	limit  int64 // bytes before the connection is cut; -1: none
}

func (b *proxyBody) Read(buf []byte) (int, error) {
	if b.limit >= 0 && b.n >= b.limit {
		// ReverseProxy aborts the response on a body error: the client
		// sees its connection closed mid-blob.
		return 0, errors.New("blobProxy: connection cut")
	}
	if b.limit >= 0 && int64(len(buf)) > b.limit-b.n {
		buf = buf[:b.limit-b.n]
	}
	n, err := b.ReadCloser.Read(buf)
	if b.flipAt >= b.n && b.flipAt < b.n+int64(n) {
		buf[b.flipAt-b.n] ^= 0xff
	}
	b.n += int64(n)
	b.p.mu.Lock()
	b.p.served[b.dg] += int64(n)
	b.p.mu.Unlock()
	return n, err
}

// TestRealStackRegistry moves a memory checkpoint through a real registry
// (Debian's docker-registry on loopback, behind blobProxy): push (a second
// push sends nothing), a pull of altered bytes refused, a pull cut midway
// resumed without fetching again what it had, and forks of the registry
// reference (two at once: one pull) passing every verification level.
func TestRealStackRegistry(t *testing.T) {
	// Small parts: the bare desktop's CRIU images (about 1.4 MB) export as
	// several blobs, so a push cut inside one has others to keep.
	s := newStackIn(t, "forkfleet-registry-it", func(c *config.Config) { c.Registry.PartSize = 512 << 10 })
	ctx := s.ctx
	regAddr := testenv.Registry(t)
	proxy := newBlobProxy(regAddr)
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	if h, _, _ := net.SplitHostPort(host); h != "127.0.0.1" {
		t.Fatalf("proxy on %s, want loopback", host)
	}
	s.launch(0)
	var created, cks []string
	t.Cleanup(func() {
		for _, id := range created {
			s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id})
		}
		for _, id := range cks {
			s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: id, Cascade: true})
		}
	})

	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	created = append(created, cr.Sandbox.Id)
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: cr.Sandbox.Id})
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	cks = append(cks, ck.Checkpoint.Id)

	// Push: the checkpoint's own blobs, compressed; again: nothing.
	ref := host + "/forkfleet/registry-it:v1"
	ex, err := s.ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Checkpoint.Id, Reference: ref, Push: true})
	if err != nil {
		t.Fatalf("export and push: %v", err)
	}
	dumped := ck.Checkpoint.MemoryBytes + ck.Checkpoint.LayerBytes
	t.Logf("pushed %d B of a %d B image (dumped %d B)", ex.PushedBytes, ex.SizeBytes, dumped)
	if ex.PushedBytes <= 0 || ex.PushedBytes > ex.SizeBytes {
		t.Fatalf("pushed %d B of a %d B image", ex.PushedBytes, ex.SizeBytes)
	}
	again, err := s.ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Checkpoint.Id, Reference: ref, Push: true})
	if err != nil || again.PushedBytes != 0 || again.Digest != ex.Digest {
		t.Fatalf("second push: %v, sent %d B (digest %s, first %s)", err, again.GetPushedBytes(), again.GetDigest(), ex.Digest)
	}

	// The registry's manifest: which blobs are the CRIU images' parts.
	manifest, mb := registryManifest(t, host, "forkfleet/registry-it", "v1")
	criu := manifest.Layers[0]
	if !strings.HasSuffix(criu.MediaType, "+zstd") {
		t.Fatalf("CRIU layer media type %s, want zstd", criu.MediaType)
	}
	var parts []ocispec.Descriptor
	var partBytes int64
	for _, l := range manifest.Layers {
		if l.MediaType == criu.MediaType {
			parts, partBytes = append(parts, l), partBytes+l.Size
		}
	}
	if len(parts) < 2 || parts[0].Size != 512<<10 {
		t.Fatalf("CRIU images in %d parts (%d B, the first %d B), want 512 KiB parts", len(parts), partBytes, parts[0].Size)
	}

	// Another repository of the registry: its blobs are mounted from the
	// first, only the manifest is sent.
	mounted, err := s.ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Checkpoint.Id, Reference: host + "/forkfleet/registry-it-mounted:v1", Push: true})
	if err != nil || mounted.PushedBytes <= 0 || mounted.PushedBytes > int64(len(mb)) {
		t.Fatalf("push to another repository: %v, sent %d B (the manifest is %d B)", err, mounted.GetPushedBytes(), len(mb))
	}

	// A push cut inside the CRIU images' last part (through another name
	// of the registry, so that nothing is mounted): the retry sends that
	// part again and none of the parts that reached the registry before,
	// less than the CRIU images.
	_, port, _ := net.SplitHostPort(host)
	ref2 := "localhost:" + port + "/forkfleet/registry-it-cut:v1"
	cutPart := parts[len(parts)-1]
	proxy.cutUpload(cutPart.Digest.String(), cutPart.Size/2)
	if _, err := s.ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Checkpoint.Id, Reference: ref2, Push: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("push with its connection cut: %v, want UNAVAILABLE; cut part %s (%d B, cut after %d B); uploaded %v",
			err, cutPart.Digest, cutPart.Size, cutPart.Size/2, proxy.uploaded())
	}
	before := proxy.uploaded()
	// What the registry committed before the cut (an upload cancelled
	// midway by the cut does not count: it must be sent again).
	had := map[string]bool{}
	for _, d := range append([]ocispec.Descriptor{manifest.Config}, manifest.Layers...) {
		resp, err := http.Head(fmt.Sprintf("http://%s/v2/forkfleet/registry-it-cut/blobs/%s", regAddr, d.Digest))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		had[d.Digest.String()] = resp.StatusCode == http.StatusOK
	}
	proxy.reset("", "", 0)
	retried, err := s.ckc.ExportCheckpoint(ctx, &controldv1.ExportCheckpointRequest{Id: ck.Checkpoint.Id, Reference: ref2, Push: true})
	if err != nil {
		t.Fatalf("push again: %v", err)
	}
	after := proxy.uploaded()
	t.Logf("cut push uploaded %v; the retry %v (%d B)", before, after, retried.PushedBytes)
	finished := 0
	for dg, ok := range had {
		if !ok {
			continue
		}
		finished++
		if n := after[dg]; n > 0 {
			t.Errorf("the retried push sent %s again (%d B), which the registry had", dg, n)
		}
	}
	if after[cutPart.Digest.String()] != cutPart.Size {
		t.Errorf("the retried push sent %d B of the cut part (%d B)", after[cutPart.Digest.String()], cutPart.Size)
	}
	var resent int64
	for _, p := range parts {
		resent += after[p.Digest.String()]
	}
	if finished == 0 || resent >= partBytes {
		t.Errorf("the retried push sent %d B of the %d B of CRIU images (%d blobs had arrived before the cut)", resent, partBytes, finished)
	}

	// Nothing of the image stays in this containerd: a pull fetches it all.
	nsCtx := namespaces.WithNamespace(ctx, s.cfg.Containerd.Namespace)
	for _, name := range []string{ref, ref2, host + "/forkfleet/registry-it-mounted:v1"} {
		if err := s.rt.Client().ImageService().Delete(nsCtx, name, images.SynchronousDelete()); err != nil {
			t.Fatalf("delete local image %s: %v", name, err)
		}
	}

	// A registry serving other bytes than the digest names is refused.
	proxy.reset(criu.Digest.String(), "", 0)
	_, err = s.ckc.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: ref, Pull: true})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "DIGEST_MISMATCH") && !strings.Contains(err.Error(), "does not match its digest") {
		t.Fatalf("pull of altered bytes: %v, want FAILED_PRECONDITION digest mismatch", err)
	}

	// Cut midway, then resumed: the retry fetches the rest of the cut blob
	// (a range request) and nothing it had.
	proxy.reset("", criu.Digest.String(), criu.Size/2)
	if _, err := s.ckc.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: ref, Pull: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("pull with its connection cut: %v, want UNAVAILABLE", err)
	} else {
		t.Logf("cut pull: %v", err)
	}
	first, _ := proxy.stats()
	// The blobs the cut pass completed (the other parts, fetched alongside,
	// may have been cut too: those resume like the cut one).
	kept := map[string]bool{}
	for dg := range first {
		if _, err := s.rt.Client().ContentStore().Info(nsCtx, digest.Digest(dg)); err == nil {
			kept[dg] = true
		}
	}
	proxy.reset("", "", 0)
	im, err := s.ckc.ImportCheckpoint(ctx, &controldv1.ImportCheckpointRequest{Reference: ref, Pull: true})
	if err != nil {
		t.Fatalf("resumed pull: %v", err)
	}
	cks = append(cks, im.Checkpoint.Id)
	second, ranges := proxy.stats()
	t.Logf("cut pass served %v; resumed pass served %v, ranges %v; pulled %d B", first, second, ranges, im.PulledBytes)
	// One ranged request from where the first pass's copy stopped (bytes
	// still in flight when the connection was cut are asked again), and
	// only the rest of the blob.
	rs := ranges[criu.Digest.String()]
	var from int64
	if len(rs) != 1 {
		t.Fatalf("resumed pull asked the cut blob %d times (%q), want once", len(rs), rs)
	}
	if _, err := fmt.Sscanf(rs[0], "bytes=%d-", &from); err != nil || from <= 0 || from > first[criu.Digest.String()] {
		t.Errorf("resumed pull asked the cut blob with range %q, want one from the offset reached (%d B served before the cut)", rs[0], first[criu.Digest.String()])
	}
	if got := second[criu.Digest.String()]; got != criu.Size-from {
		t.Errorf("resumed pull fetched %d B of the cut blob (%d B, resumed at %d)", got, criu.Size, from)
	}
	for dg, n := range second {
		if dg != criu.Digest.String() && kept[dg] {
			t.Errorf("resumed pull fetched %s again (%d B)", dg, n)
		}
	}
	if im.Checkpoint.MemoryBytes != ck.Checkpoint.MemoryBytes || im.Checkpoint.Tier != ck.Checkpoint.Tier {
		t.Errorf("imported %v, pushed %v", im.Checkpoint, ck.Checkpoint)
	}

	// Two forks of the registry reference at once: one pull and import,
	// every level verified on each replica.
	type forkOut struct {
		resp *controldv1.ForkCheckpointResponse
		err  error
	}
	outs := make(chan forkOut, 2)
	for range 2 {
		go func() {
			r, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointReference: ref, Count: 1})
			outs <- forkOut{r, err}
		}()
	}
	var remoteCk string
	for range 2 {
		o := <-outs
		if o.err != nil {
			t.Fatalf("fork of %s: %v", ref, o.err)
		}
		if remoteCk == "" {
			remoteCk = o.resp.CheckpointId
			cks = append(cks, remoteCk)
		} else if o.resp.CheckpointId != remoteCk {
			t.Errorf("concurrent forks of one reference forked %s and %s: two pulls", remoteCk, o.resp.CheckpointId)
		}
		checkReplicas(t, o.resp, &created)
	}
	if remoteCk == im.Checkpoint.Id || remoteCk == "" {
		t.Errorf("fork of the reference forked %q", remoteCk)
	}
	// The forks' pulled image is gone once imported (nothing unowned stays).
	pinned := host + "/forkfleet/registry-it@" + ex.Digest
	if _, err := s.rt.Client().ImageService().Get(nsCtx, pinned); err == nil {
		t.Errorf("the forks' pulled image %s is still in the namespace", pinned)
	}
	later, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointReference: ref, Count: 1})
	if err != nil {
		t.Fatalf("second fork of %s: %v", ref, err)
	}
	checkReplicas(t, later, &created)
	if later.CheckpointId != remoteCk {
		t.Errorf("a later fork of the reference forked %s, want the cached %s", later.CheckpointId, remoteCk)
	}

	// The transfers in the metrics: bytes pushed as answered, pulls by
	// outcome, and the three forks' ways to their checkpoint.
	if got := s.metric(`forkfleet_controld_registry_bytes_total{direction="push"}`); got < float64(ex.PushedBytes+retried.PushedBytes) {
		t.Errorf("registry_bytes_total push %v, want at least the pushes' %d B", got, ex.PushedBytes+retried.PushedBytes)
	}
	for series, want := range map[string]float64{
		`forkfleet_controld_registry_transfer_seconds_count{code="FailedPrecondition",direction="pull"}`: 1, // the altered bytes
		`forkfleet_controld_registry_transfer_seconds_count{code="Unavailable",direction="pull"}`:        1, // the cut
		`forkfleet_controld_registry_transfer_seconds_count{code="OK",direction="pull"}`:                 2, // the import, the forks' one pull
		`forkfleet_controld_remote_checkpoint_total{result="cached"}`:                                    1,
	} {
		if got := s.metric(series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := s.metric(`forkfleet_controld_remote_checkpoint_total{result="pulled"}`) + s.metric(`forkfleet_controld_remote_checkpoint_total{result="shared"}`); got != 2 {
		t.Errorf("remote_checkpoint_total pulled+shared %v, want 2 (one pull, two forks)", got)
	}
}

// checkReplicas fails t unless every replica is usable and passed all four
// verification levels.
func checkReplicas(t *testing.T, resp *controldv1.ForkCheckpointResponse, created *[]string) {
	t.Helper()
	for i, r := range resp.Replicas {
		if r.ErrorCode != 0 {
			t.Fatalf("replica %d failed (%d): %s", i, r.ErrorCode, r.ErrorMessage)
		}
		*created = append(*created, r.Sandbox.Id)
		if len(r.Verification) != 4 {
			t.Errorf("replica %d verified %d levels, want 4 (marker, memory, pixels, network)", i, len(r.Verification))
		}
		for _, v := range r.Verification {
			if !v.Ok {
				t.Errorf("replica %d: %s: %s", i, v.Level, v.Detail)
			}
		}
	}
}

// registryManifest reads an image manifest straight from a registry.
func registryManifest(t *testing.T, host, repo, tag string) (ocispec.Manifest, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v2/%s/manifests/%s", host, repo, tag), nil)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil || len(m.Layers) < 2 {
		t.Fatalf("manifest of %s/%s:%s: %v (%d layers)", host, repo, tag, err, len(m.Layers))
	}
	return m, b
}
