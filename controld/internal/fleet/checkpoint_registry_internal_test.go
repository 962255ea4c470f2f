package fleet

import (
	"errors"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestPinnedName(t *testing.T) {
	const dg = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for ref, want := range map[string]string{
		"127.0.0.1:5000/forkfleet/ck:v1": "127.0.0.1:5000/forkfleet/ck@" + dg,
		"registry.lab/ck":                "registry.lab/ck@" + dg,
		"registry.lab:443/a/b/ck@" + dg:  "registry.lab:443/a/b/ck@" + dg,
		"registry.lab/ck:v1@" + dg:       "registry.lab/ck@" + dg,
	} {
		got, err := pinnedName(ref, dg)
		if err != nil || got != want {
			t.Errorf("pinnedName(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	if _, err := pinnedName("ck:v1", dg); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("short name: %v", err)
	}
	if _, err := pinnedName("registry.lab/ck:v1", "md5:abc"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("bad digest from the registry: %v", err)
	}
}
