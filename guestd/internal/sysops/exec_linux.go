//go:build linux

// Package sysops serves the ACI's operating-system requests: running
// commands (exec, launch) and file transfer. Every child is started through
// the reaper so guestd's single wait loop stays the only caller of wait4.
package sysops

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
)

// Exec limits from the protocol.
const (
	DefaultExecTimeout   = 30 * time.Second
	DefaultMaxOutput     = 1 << 20
	MaxOutput            = 16 << 20
	maxExecTimeout       = 24 * time.Hour
	pipeDrainGrace       = 200 * time.Millisecond
	maxArgvEnvTotalBytes = 1 << 20
)

// Runner starts commands for the ACI.
type Runner struct {
	Reaper *reaper.Reaper
	// Env is the base environment of every child (guestd's own minus its
	// secrets, plus DISPLAY). User's login variables and then request env
	// entries override it.
	Env []string
	// User is who children run as (nil: guestd's own user, root).
	User *Identity
	Log  *slog.Logger

	mu       sync.Mutex
	launched map[int]chan struct{} // pid -> closed when reaped
}

// StopLaunched stops every app started by Launch that is still running:
// SIGTERM to its process group, SIGKILL after grace.
func (r *Runner) StopLaunched(grace time.Duration) {
	r.mu.Lock()
	apps := make(map[int]chan struct{}, len(r.launched))
	for pid, done := range r.launched {
		apps[pid] = done
		_ = unix.Kill(-pid, unix.SIGTERM)
	}
	r.mu.Unlock()
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	killed := false
	for _, done := range apps {
		select {
		case <-done:
		case <-deadline.C:
			killed = true
		}
		if killed {
			break
		}
	}
	if killed {
		for pid := range apps {
			killGroup(pid)
		}
		for _, done := range apps {
			<-done
		}
	}
}

// SanitizedEnv returns environ without the variables that carry guestd's
// secrets, so no child (and no agent running exec) can read the tokens.
func SanitizedEnv(environ []string, drop ...string) []string {
	out := make([]string, 0, len(environ))
next:
	for _, kv := range environ {
		for _, d := range drop {
			if strings.HasPrefix(kv, d+"=") {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// SessionLocale is the locale children get when guestd's environment names
// none: UTF-8 text (what agents type, file names) must reach applications
// as UTF-8, and C.UTF-8 ships with glibc itself (no locales package).
const SessionLocale = "C.UTF-8"

// WithLocale sets LANG=SessionLocale in env unless it already chooses a
// character set (LC_ALL, LC_CTYPE or LANG).
func WithLocale(env []string) []string {
	for _, kv := range env {
		for _, k := range []string{"LC_ALL=", "LC_CTYPE=", "LANG="} {
			if strings.HasPrefix(kv, k) && len(kv) > len(k) {
				return env
			}
		}
	}
	return setEnv(env, "LANG", SessionLocale)
}

func (r *Runner) command(argv []string, env map[string]string, cwd string) (*exec.Cmd, *acierr.Error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, acierr.Invalid("argv", "argv is empty")
	}
	total := 0
	for _, a := range argv {
		total += len(a) + 1
		if strings.IndexByte(a, 0) >= 0 {
			return nil, acierr.Invalid("argv", "argv contains a NUL byte")
		}
	}
	merged := r.User.Env(r.Env)
	if len(env) > 0 {
		keys := make([]string, 0, len(env))
		for k := range env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(env[k], 0) >= 0 {
				return nil, acierr.Invalid("env", "bad environment entry %q", k)
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			merged = setEnv(merged, k, env[k])
			total += len(k) + len(env[k]) + 2
		}
	}
	if total > maxArgvEnvTotalBytes {
		return nil, acierr.Invalid("argv", "argv and env exceed %d bytes", maxArgvEnvTotalBytes)
	}
	if cwd != "" {
		if !filepath.IsAbs(cwd) {
			return nil, acierr.Invalid("cwd", "cwd %q is not absolute", cwd)
		}
		st, err := os.Stat(cwd)
		if err != nil {
			return nil, acierr.WithField(err, "cwd")
		}
		if !st.IsDir() {
			return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "cwd", "cwd %q is not a directory", cwd)
		}
	}
	path, err := lookPath(argv[0], merged)
	if err != nil {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "argv[0]", "%s: %v", argv[0], err)
	}
	if cwd == "" {
		cwd = r.User.Dir()
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: merged, Dir: cwd}
	// Own process group: a timeout or cancel kills the whole tree the
	// command spawned, and a launched app is not hit by signals meant for
	// guestd's group. The user's credentials: the agent never runs as root
	// unless the sandbox was created so (r.User nil).
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true, Credential: r.User.Credential()}
	return cmd, nil
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// lookPath resolves name against the PATH of the child's environment.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return "", errors.New("relative program path")
		}
		return name, executable(name)
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = p
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}

// Exec runs req to completion. ctx ending (a CancelRequest or the session
// closing) kills the process group and returns CANCELED.
func (r *Runner) Exec(ctx context.Context, req *aciv1.ExecRequest) (*aciv1.ExecResponse, error) {
	timeout := DefaultExecTimeout
	if req.GetTimeoutMs() > 0 {
		timeout = time.Duration(req.GetTimeoutMs()) * time.Millisecond
		if timeout > maxExecTimeout {
			return nil, acierr.Invalid("exec.timeout_ms", "timeout exceeds %s", maxExecTimeout)
		}
	}
	limit := DefaultMaxOutput
	if m := req.GetMaxOutputBytes(); m > 0 {
		if m > MaxOutput {
			return nil, acierr.Invalid("exec.max_output_bytes", "max_output_bytes %d exceeds %d", m, MaxOutput)
		}
		limit = int(m)
	}
	cmd, aerr := r.command(req.GetArgv(), req.GetEnv(), req.GetCwd())
	if aerr != nil {
		aerr.Field = "exec." + aerr.Field
		return nil, aerr
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	var inW *os.File
	if len(req.GetStdin()) > 0 {
		var inR *os.File
		if inR, inW, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, err
		}
		cmd.Stdin = inR
		defer inR.Close()
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	start := time.Now()
	done, err := r.Reaper.Start(cmd)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if inW != nil {
			inW.Close()
		}
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "exec.argv", "start %s: %v", cmd.Path, err)
	}
	pid := cmd.Process.Pid

	var wg sync.WaitGroup
	stdout := &capBuffer{limit: limit}
	stderr := &capBuffer{limit: limit}
	wg.Add(2)
	go stdout.drain(&wg, outR)
	go stderr.drain(&wg, errR)
	if inW != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// EPIPE when the command does not read its stdin is fine.
			_, _ = inW.Write(req.GetStdin())
			inW.Close()
		}()
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var st reaper.Status
	var timedOut, canceled bool
	select {
	case st = <-done:
	case <-timer.C:
		timedOut = true
		killGroup(pid)
		st = <-done
	case <-ctx.Done():
		canceled = true
		killGroup(pid)
		st = <-done
	}
	cmd.Process.Release()
	// Background children may keep the pipes open; give them a moment to
	// flush, then stop reading so the reply is not held hostage.
	deadline := time.Now().Add(pipeDrainGrace)
	outR.SetReadDeadline(deadline)
	errR.SetReadDeadline(deadline)
	if inW != nil {
		inW.SetWriteDeadline(deadline)
	}
	wg.Wait()
	outR.Close()
	errR.Close()

	if canceled {
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_CANCELED, "", "exec canceled; process group killed")
	}
	resp := &aciv1.ExecResponse{
		ExitCode:        int32(st.ExitCode()),
		Stdout:          stdout.buf.Bytes(),
		Stderr:          stderr.buf.Bytes(),
		StdoutTruncated: stdout.truncated,
		StderrTruncated: stderr.truncated,
		TimedOut:        timedOut,
		DurationNs:      uint64(time.Since(start)),
	}
	if sig := st.Signal(); sig != 0 {
		resp.Signal = unix.SignalName(sig)
	}
	return resp, nil
}

// Launch starts an app detached: guestd reaps it and logs its exit, and its
// output goes to guestd's log.
func (r *Runner) Launch(req *aciv1.LaunchRequest) (*aciv1.LaunchResponse, error) {
	cmd, aerr := r.command(req.GetArgv(), req.GetEnv(), req.GetCwd())
	if aerr != nil {
		aerr.Field = "launch." + aerr.Field
		return nil, aerr
	}
	name := filepath.Base(cmd.Path)
	// An explicit pipe rather than an io.Writer: exec.Cmd's copy goroutines
	// are only cleaned up by cmd.Wait, which guestd never calls.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	done, err := r.Reaper.Start(cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "launch.argv", "start %s: %v", cmd.Path, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	r.mu.Lock()
	if r.launched == nil {
		r.launched = make(map[int]chan struct{})
	}
	r.launched[pid] = exited
	r.mu.Unlock()
	go func() {
		lw := &logWriter{log: r.Log, name: name}
		_, _ = io.Copy(lw, pr)
		pr.Close()
	}()
	go func() {
		st := <-done
		cmd.Process.Release()
		r.mu.Lock()
		delete(r.launched, pid)
		r.mu.Unlock()
		close(exited)
		r.Log.Info("launched app exited", "app", name, "pid", pid, "status", st.String())
	}()
	return &aciv1.LaunchResponse{Pid: int32(pid)}, nil
}

func killGroup(pid int) {
	// The group may already be gone; ESRCH is fine.
	_ = unix.Kill(-pid, unix.SIGKILL)
}

// capBuffer keeps the first limit bytes of a stream and drains the rest so
// the child never blocks on a full pipe.
type capBuffer struct {
	buf       bytes.Buffer
	limit     int
	truncated bool
}

func (c *capBuffer) drain(wg *sync.WaitGroup, f *os.File) {
	defer wg.Done()
	var chunk [32 << 10]byte
	for {
		n, err := f.Read(chunk[:])
		if n > 0 {
			room := c.limit - c.buf.Len()
			if n > room {
				c.truncated = true
				n = room
			}
			c.buf.Write(chunk[:n])
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// Still open (a background child holds it): output beyond this
				// point is lost, which is what truncated means.
				c.truncated = true
			}
			return
		}
	}
}

// logWriter forwards a launched app's output to guestd's log, line by line.
type logWriter struct {
	mu   sync.Mutex
	log  *slog.Logger
	name string
	part []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		w.log.Info("app output", "app", w.name, "line", string(w.part[:i]))
		w.part = w.part[i+1:]
	}
	if len(w.part) > 4096 {
		w.log.Info("app output", "app", w.name, "line", string(w.part))
		w.part = w.part[:0]
	}
	return len(p), nil
}
