//go:build linux

package suites

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// runTimed runs argv to completion with env and returns its stdout and the
// wall time from spawn to exit: a fresh process per action, the way
// OSWorld-style servers drive a desktop.
func runTimed(ctx context.Context, env []string, argv ...string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return nil, d, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), d, nil
}

// runPipeTimed runs a | b (stdout of a into stdin of b) and times spawn of a
// to exit of b.
func runPipeTimed(ctx context.Context, env []string, a, b []string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ca := exec.CommandContext(ctx, a[0], a[1:]...)
	cb := exec.CommandContext(ctx, b[0], b[1:]...)
	ca.Env, cb.Env = env, env
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	var out, errb bytes.Buffer
	ca.Stdout, ca.Stderr = pw, &errb
	cb.Stdin, cb.Stdout, cb.Stderr = pr, &out, &errb
	t0 := time.Now()
	if err := ca.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, 0, err
	}
	if err := cb.Start(); err != nil {
		pr.Close()
		pw.Close()
		ca.Wait()
		return nil, 0, err
	}
	pw.Close()
	pr.Close()
	ea, eb := ca.Wait(), cb.Wait()
	d := time.Since(t0)
	if ea != nil || eb != nil {
		return nil, d, fmt.Errorf("%s | %s: %v / %v: %s", a[0], b[0], ea, eb, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), d, nil
}

// isPNG and isJPEG verify a peer really produced an image.
func isPNG(b []byte) bool  { return len(b) > 8 && bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) }
func isJPEG(b []byte) bool { return len(b) > 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff }
