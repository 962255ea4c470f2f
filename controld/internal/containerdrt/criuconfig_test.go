//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestImageCRIUOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string
		bad    bool
	}{
		{"none", map[string]string{"org.forkfleet.base": "x"}, nil, false},
		{"ghost limit", map[string]string{LabelCRIUGhostLimit: "64M"}, []string{"ghost-limit 67108864"}, false},
		{"ghost limit bytes", map[string]string{LabelCRIUGhostLimit: "1048576"}, []string{"ghost-limit 1048576"}, false},
		{"ghost limit K", map[string]string{LabelCRIUGhostLimit: "512K"}, []string{"ghost-limit 524288"}, false},
		{"irmap paths", map[string]string{LabelCRIUIrmapScanPaths: "/usr/share/zoneinfo,/opt/app"},
			[]string{"irmap-scan-path /usr/share/zoneinfo", "irmap-scan-path /opt/app"}, false},
		{"ghost limit over the cap", map[string]string{LabelCRIUGhostLimit: "257M"}, nil, true},
		{"ghost limit zero", map[string]string{LabelCRIUGhostLimit: "0"}, nil, true},
		{"ghost limit negative", map[string]string{LabelCRIUGhostLimit: "-1"}, nil, true},
		{"ghost limit garbage", map[string]string{LabelCRIUGhostLimit: "64M\naction-script /bin/sh"}, nil, true},
		{"relative path", map[string]string{LabelCRIUIrmapScanPaths: "usr/share"}, nil, true},
		{"unclean path", map[string]string{LabelCRIUIrmapScanPaths: "/usr/../etc"}, nil, true},
		{"path with a newline", map[string]string{LabelCRIUIrmapScanPaths: "/usr\naction-script /x"}, nil, true},
		{"too many paths", map[string]string{LabelCRIUIrmapScanPaths: strings.Repeat("/a,", 16) + "/a"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := imageCRIUOptions(tc.labels)
			if tc.bad {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("got %v, %v; want INVALID_ARGUMENT", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
			// What a spec records reads back the same.
			back, err := parseCRIUOptions(strings.Join(got, "\n"))
			if err != nil || !slices.Equal(back, got) {
				t.Fatalf("annotation round trip: %q, %v", back, err)
			}
		})
	}
}

// A spec's annotation (an imported checkpoint's, say) admits only what an
// image label could have produced.
func TestParseCRIUOptionsRefusesOthers(t *testing.T) {
	for _, v := range []string{
		"action-script /tmp/x",
		"ghost-limit 1\nghost-limit 2",
		"ghost-limit 300000000",
		"irmap-scan-path relative",
		"lib /tmp",
		"ghost-limit 1\n",
	} {
		if _, err := parseCRIUOptions(v); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: got %v, want INVALID_ARGUMENT", v, err)
		}
	}
}

func TestCRIUConfigFor(t *testing.T) {
	r := &Runtime{cfg: Config{StateDir: t.TempDir()}, criuConfig: "/base.conf", criuOptions: []string{"tcp-close", "ghost-limit 1"}}
	if p, err := r.criuConfigFor(nil); err != nil || p != "/base.conf" {
		t.Fatalf("no image options: %q %v", p, err)
	}
	p, err := r.criuConfigFor([]string{"ghost-limit 67108864"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	// The image's line comes last: CRIU keeps the last value of an option.
	if err != nil || string(b) != "tcp-close\nghost-limit 1\nghost-limit 67108864\n" {
		t.Fatalf("config %s: %q %v", p, b, err)
	}
	p2, err := r.criuConfigFor([]string{"ghost-limit 67108864"})
	if err != nil || p2 != p {
		t.Fatalf("same options, other file: %q %q %v", p, p2, err)
	}
	p3, _ := r.criuConfigFor([]string{"ghost-limit 1048576"})
	if p3 == p {
		t.Fatal("different options share a file")
	}
}

// specCountingImage is a containerd image whose config counts its reads.
type specCountingImage struct {
	client.Image // unused methods panic
	digest       digest.Digest
	labels       map[string]string
	reads        int
}

func (i *specCountingImage) Name() string               { return "img" }
func (i *specCountingImage) Target() ocispec.Descriptor { return ocispec.Descriptor{Digest: i.digest} }
func (i *specCountingImage) Spec(context.Context) (ocispec.Image, error) {
	i.reads++
	return ocispec.Image{Config: ocispec.ImageConfig{Labels: i.labels}}, nil
}

// A cold boot reads its image's CRIU options once per image digest, not
// from containerd's content store on every boot; another digest (the same
// name pushed again) is read anew.
func TestImageCRIUOptionsOncePerDigest(t *testing.T) {
	r := &Runtime{}
	a := &specCountingImage{digest: digest.FromString("a"), labels: map[string]string{LabelCRIUGhostLimit: "64M"}}
	for range 3 {
		opts, err := r.imageCRIUOptions(context.Background(), a)
		if err != nil || !slices.Equal(opts, []string{"ghost-limit 67108864"}) {
			t.Fatalf("options %q (%v)", opts, err)
		}
	}
	if a.reads != 1 {
		t.Fatalf("image config read %d times for one digest, want 1", a.reads)
	}
	b := &specCountingImage{digest: digest.FromString("b")}
	if opts, err := r.imageCRIUOptions(context.Background(), b); err != nil || len(opts) != 0 || b.reads != 1 {
		t.Fatalf("second digest: options %q (%v), %d reads", opts, err, b.reads)
	}
	bad := &specCountingImage{digest: digest.FromString("c"), labels: map[string]string{LabelCRIUGhostLimit: "lots"}}
	for range 2 {
		if _, err := r.imageCRIUOptions(context.Background(), bad); err == nil {
			t.Fatal("a bad label was admitted")
		}
	}
	if bad.reads != 2 {
		t.Fatalf("a refused config was cached (%d reads)", bad.reads)
	}
}
