package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/controld/internal/ocilayout"
)

type buildOpts struct {
	base       string
	adds       []ocilayout.TarEntry
	entrypoint []string
	cmd        []string
	env        []string
	workdir    string
	labels     map[string]string
	name       string
	out        string
	created    time.Time
}

func parseBuild(args []string) (buildOpts, error) {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	var (
		o                          buildOpts
		adds, ep, cmd, env, labels listFlag
		epoch                      int64
	)
	fs.StringVar(&o.base, "base", "", "base rootfs as an uncompressed tar (becomes the first layer as is)")
	fs.Var(&adds, "add", "DEST=SRC: add a host file or directory tree at DEST in a second layer (repeatable)")
	fs.Var(&ep, "entrypoint", "one entrypoint argv element (repeatable)")
	fs.Var(&cmd, "cmd", "one cmd argv element (repeatable)")
	fs.Var(&env, "env", "K=V environment entry (repeatable)")
	fs.StringVar(&o.workdir, "workdir", "/", "working directory")
	fs.Var(&labels, "label", "K=V image config label (repeatable)")
	fs.StringVar(&o.name, "name", "", "image reference, e.g. localhost/forkfleet/desktop:latest")
	fs.StringVar(&o.out, "out", "", "output OCI layout directory (must not exist or be empty)")
	fs.Int64Var(&epoch, "created", envEpoch(), "creation time and mtime of added files, Unix seconds (default $SOURCE_DATE_EPOCH or 0)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	if fs.NArg() != 0 {
		return o, fmt.Errorf("%w: build takes no positional arguments, got %q", errUsage, fs.Args())
	}
	switch {
	case o.base == "":
		return o, fmt.Errorf("%w: --base is required", errUsage)
	case o.name == "":
		return o, fmt.Errorf("%w: --name is required", errUsage)
	case o.out == "":
		return o, fmt.Errorf("%w: --out is required", errUsage)
	case len(ep) == 0 && len(cmd) == 0:
		return o, fmt.Errorf("%w: --entrypoint or --cmd is required", errUsage)
	case !strings.HasPrefix(o.workdir, "/"):
		return o, fmt.Errorf("%w: --workdir must be absolute", errUsage)
	}
	for _, a := range adds {
		dest, src, ok := strings.Cut(a, "=")
		if !ok || dest == "" || src == "" || !strings.HasPrefix(dest, "/") {
			return o, fmt.Errorf("%w: --add %q: want /ABS/DEST=SRC", errUsage, a)
		}
		o.adds = append(o.adds, ocilayout.TarEntry{Source: src, Dest: dest})
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return o, fmt.Errorf("%w: --env %q: want K=V", errUsage, e)
		}
	}
	o.labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return o, fmt.Errorf("%w: --label %q: want K=V", errUsage, l)
		}
		o.labels[k] = v
	}
	o.entrypoint, o.cmd, o.env = ep, cmd, env
	o.created = time.Unix(epoch, 0).UTC()
	return o, nil
}

// envEpoch honours SOURCE_DATE_EPOCH (reproducible-builds.org) for defaults.
func envEpoch() int64 {
	var n int64
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		if _, err := fmt.Sscan(v, &n); err == nil && n >= 0 {
			return n
		}
	}
	return 0
}

func cmdBuild(ctx context.Context, args []string) error {
	o, err := parseBuild(args)
	if err != nil {
		return err
	}
	res, err := buildImage(ctx, o)
	if err != nil {
		return err
	}
	for i, l := range res.layers {
		fmt.Printf("layer %d  %s  %s  %.1f MB\n", i, l.Descriptor.Digest, l.Descriptor.MediaType, float64(l.Descriptor.Size)/1e6)
	}
	fmt.Printf("config    %s\n", res.config)
	fmt.Printf("manifest  %s\n", res.manifest.Digest)
	fmt.Printf("image     %s  %.1f MB in %s  (layout %s)\n", o.name, float64(res.size)/1e6, res.took.Round(time.Millisecond), o.out)
	return nil
}

type buildResult struct {
	layers   []ocilayout.Layer
	config   string
	manifest ocispec.Descriptor
	size     int64
	took     time.Duration
}

func buildImage(ctx context.Context, o buildOpts) (buildResult, error) {
	start := time.Now()
	var res buildResult
	w, err := ocilayout.Create(o.out)
	if err != nil {
		return res, err
	}
	base, err := w.LayerFromFile(ctx, ocispec.MediaTypeImageLayer, o.base)
	if err != nil {
		return res, fmt.Errorf("base layer: %w", err)
	}
	res.layers = append(res.layers, base)
	if len(o.adds) > 0 {
		add, err := w.LayerFromTree(ctx, o.adds, ocilayout.TarOptions{ModTime: o.created})
		if err != nil {
			return res, fmt.Errorf("added files layer: %w", err)
		}
		res.layers = append(res.layers, add)
	}

	var cfg ocispec.Image
	created := o.created
	cfg.Created = &created
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint = o.entrypoint
	cfg.Config.Cmd = o.cmd
	cfg.Config.Env = o.env
	cfg.Config.WorkingDir = o.workdir
	if len(o.labels) > 0 {
		cfg.Config.Labels = o.labels
	}
	m, err := w.WriteImage(ctx, ocilayout.Image{
		Config:      cfg,
		Layers:      res.layers,
		Annotations: map[string]string{ocispec.AnnotationCreated: created.Format(time.RFC3339)},
	})
	if err != nil {
		return res, err
	}
	if err := w.Tag(m, o.name, nil); err != nil {
		return res, err
	}
	if err := w.Close(); err != nil {
		return res, err
	}
	var man ocispec.Manifest
	if err := ocilayout.ReadBlobJSON(o.out, m, &man); err != nil {
		return res, err
	}
	res.config = man.Config.Digest.String()
	res.size = m.Size + man.Config.Size
	for _, l := range man.Layers {
		res.size += l.Size
	}
	res.manifest = m
	res.took = time.Since(start)
	return res, nil
}

func cmdValidate(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%w: validate takes one layout directory", errUsage)
	}
	start := time.Now()
	n, err := ocilayout.Validate(args[0])
	if err != nil {
		return err
	}
	fmt.Printf("ok: %d blobs verified in %s\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}
