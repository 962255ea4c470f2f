package hostinfo

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestParseEnvFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "host.env")
	os.WriteFile(p, []byte("# c\nCRIU_VERSION=4.2\nexport RUNC='1.2.3'\nX=\"a b\"\n\nbad line\n"), 0o644)
	env, err := ParseEnvFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if env["CRIU_VERSION"] != "4.2" || env["RUNC"] != "1.2.3" || env["X"] != "a b" || len(env) != 3 {
		t.Fatalf("%v", env)
	}
}

func TestCollect(t *testing.T) {
	h := Collect(context.Background())
	if h.Cores < 1 || h.Kernel == "" || h.HostEnv == nil {
		t.Fatalf("%+v", h)
	}
}
