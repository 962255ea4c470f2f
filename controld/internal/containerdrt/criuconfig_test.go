//go:build linux

package containerdrt

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

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
