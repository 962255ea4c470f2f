package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/controld/internal/ocilayout"
)

// tinyBase writes a small rootfs tar (a config file and a directory).
func tinyBase(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc", "forkfleet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "forkfleet", "guestd.json"), []byte(`{"display":":0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "base.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ocilayout.WriteTar(context.Background(), f, []ocilayout.TarEntry{{Source: root, Dest: "/"}}, ocilayout.TarOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func tinyBin(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "guestd")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func buildArgs(base, bin, out string) []string {
	return []string{
		"--base", base, "--add", "/usr/local/bin/guestd=" + bin,
		"--entrypoint", "/usr/local/bin/guestd",
		"--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "--env", "HOME=/root", "--env", "DISPLAY=:0",
		"--workdir", "/root", "--label", "org.forkfleet.image=desktop",
		"--name", "localhost/forkfleet/test:latest", "--out", out,
	}
}

func TestBuildCommand(t *testing.T) {
	base, bin := tinyBase(t), tinyBin(t, "guestd v1")
	out := filepath.Join(t.TempDir(), "layout")
	o, err := parseBuild(buildArgs(base, bin, out))
	if err != nil {
		t.Fatal(err)
	}
	res, err := buildImage(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.layers) != 2 {
		t.Fatalf("%d layers", len(res.layers))
	}
	if _, err := ocilayout.Validate(out); err != nil {
		t.Fatal(err)
	}
	idx, _ := ocilayout.ReadIndex(out)
	var man ocispec.Manifest
	if err := ocilayout.ReadBlobJSON(out, idx.Manifests[0], &man); err != nil {
		t.Fatal(err)
	}
	var cfg ocispec.Image
	if err := ocilayout.ReadBlobJSON(out, man.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.Entrypoint[0] != "/usr/local/bin/guestd" || cfg.Config.WorkingDir != "/root" ||
		len(cfg.Config.Env) != 3 || cfg.Config.Labels["org.forkfleet.image"] != "desktop" || cfg.OS != "linux" {
		t.Fatalf("config %+v", cfg)
	}
	// The same inputs give the same manifest.
	out2 := filepath.Join(t.TempDir(), "layout")
	o2, _ := parseBuild(buildArgs(base, bin, out2))
	res2, err := buildImage(context.Background(), o2)
	if err != nil {
		t.Fatal(err)
	}
	if res2.manifest.Digest != res.manifest.Digest {
		t.Fatalf("rebuild changed the manifest: %s vs %s", res.manifest.Digest, res2.manifest.Digest)
	}
}

func TestBuildFlagErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no base":      {"--name", "x:1", "--out", "/tmp/x", "--entrypoint", "/x"},
		"no name":      {"--base", "b", "--out", "/tmp/x", "--entrypoint", "/x"},
		"no out":       {"--base", "b", "--name", "x:1", "--entrypoint", "/x"},
		"no cmd":       {"--base", "b", "--name", "x:1", "--out", "/tmp/x"},
		"bad add":      {"--base", "b", "--name", "x:1", "--out", "/tmp/x", "--entrypoint", "/x", "--add", "rel=src"},
		"bad env":      {"--base", "b", "--name", "x:1", "--out", "/tmp/x", "--entrypoint", "/x", "--env", "NOEQUALS"},
		"rel workdir":  {"--base", "b", "--name", "x:1", "--out", "/tmp/x", "--entrypoint", "/x", "--workdir", "root"},
		"unknown flag": {"--bogus"},
		"positional":   {"--base", "b", "--name", "x:1", "--out", "/tmp/x", "--entrypoint", "/x", "extra"},
	} {
		if _, err := parseBuild(args); !errors.Is(err, errUsage) {
			t.Errorf("%s: %v, want usage error", name, err)
		}
	}
	if err := run(context.Background(), []string{"frobnicate"}); !errors.Is(err, errUsage) {
		t.Errorf("unknown command: %v", err)
	}
	if _, err := parseImport([]string{}); !errors.Is(err, errUsage) {
		t.Errorf("import without layout: %v", err)
	}
}
