//go:build linux

package sysops

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
)

func newRunner(t *testing.T) *Runner {
	t.Helper()
	rp, err := reaper.New(reaper.Own)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.Close)
	return &Runner{Reaper: rp, Env: []string{"PATH=/usr/bin:/bin", "FOO=base"}, Log: slog.New(slog.DiscardHandler)}
}

func code(err error) aciv1.ErrorCode {
	if err == nil {
		return aciv1.ErrorCode_ERROR_CODE_UNSPECIFIED
	}
	return acierr.From(err).Code
}

func TestExec(t *testing.T) {
	r := newRunner(t)
	ctx := context.Background()
	res, err := r.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; echo $FOO $BAR; pwd; exit 7"},
		Env: map[string]string{"BAR": "req"}, Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 || string(res.Stdout) != "out\nbase req\n/tmp\n" || string(res.Stderr) != "err\n" || res.TimedOut {
		t.Fatalf("exec: %+v", res)
	}
	// stdin.
	res, err = r.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from stdin")})
	if err != nil || string(res.Stdout) != "from stdin" {
		t.Fatalf("stdin: %+v %v", res, err)
	}
	// Truncation keeps the first bytes and still drains the rest.
	res, err = r.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sh", "-c", "head -c 100000 /dev/zero"}, MaxOutputBytes: 1000})
	if err != nil || len(res.Stdout) != 1000 || !res.StdoutTruncated || res.StderrTruncated || res.ExitCode != 0 {
		t.Fatalf("truncation: len %d %+v %v", len(res.Stdout), res.StdoutTruncated, err)
	}
	// Killed by a signal.
	res, err = r.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}})
	if err != nil || res.Signal != "SIGTERM" || res.ExitCode != -1 {
		t.Fatalf("signal: %+v %v", res, err)
	}
	// Errors are typed.
	for _, tc := range []struct {
		req  *aciv1.ExecRequest
		want aciv1.ErrorCode
	}{
		{&aciv1.ExecRequest{}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{&aciv1.ExecRequest{Argv: []string{"no-such-program-xyz"}}, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND},
		{&aciv1.ExecRequest{Argv: []string{"true"}, Cwd: "relative"}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{&aciv1.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, aciv1.ErrorCode_ERROR_CODE_NOT_FOUND},
		{&aciv1.ExecRequest{Argv: []string{"true"}, MaxOutputBytes: MaxOutput + 1}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
	} {
		if _, err := r.Exec(ctx, tc.req); code(err) != tc.want {
			t.Errorf("%v: got %v, want %v", tc.req, err, tc.want)
		}
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie is dead for our purposes.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	r := newRunner(t)
	start := time.Now()
	res, err := r.Exec(context.Background(), &aciv1.ExecRequest{
		Argv:      []string{"sh", "-c", "sleep 30 & echo $!; wait"},
		TimeoutMs: 300,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %+v after %v", res, time.Since(start))
	}
	bg, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatalf("stdout %q", res.Stdout)
	}
	deadline := time.Now().Add(2 * time.Second)
	for alive(bg) {
		if time.Now().After(deadline) {
			t.Fatalf("background child %d survived the group kill", bg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecCancel(t *testing.T) {
	r := newRunner(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	_, err := r.Exec(ctx, &aciv1.ExecRequest{Argv: []string{"sleep", "30"}})
	if code(err) != aciv1.ErrorCode_ERROR_CODE_CANCELED {
		t.Fatalf("cancel: %v", err)
	}
}

func TestExecBackgroundHoldsPipe(t *testing.T) {
	r := newRunner(t)
	start := time.Now()
	res, err := r.Exec(context.Background(), &aciv1.ExecRequest{Argv: []string{"sh", "-c", "echo started; sleep 5 &"}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "started") {
		t.Fatalf("%+v %v", res, err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("a background child held the reply for %v", time.Since(start))
	}
}

func TestLaunch(t *testing.T) {
	r := newRunner(t)
	res, err := r.Launch(&aciv1.LaunchRequest{Argv: []string{"sleep", "0.1"}})
	if err != nil || res.Pid <= 0 {
		t.Fatalf("launch: %v %v", res, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for alive(int(res.Pid)) {
		if time.Now().After(deadline) {
			t.Fatal("launched app not reaped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Reaped, not a zombie: /proc entry disappears.
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(int(res.Pid))); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("launched app left a zombie")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStopLaunched(t *testing.T) {
	r := newRunner(t)
	a, err := r.Launch(&aciv1.LaunchRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(t.TempDir(), "ready")
	b, err := r.Launch(&aciv1.LaunchRequest{Argv: []string{"sh", "-c", `trap "" TERM; touch ` + ready + `; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	// Stop only once the trap is installed, or SIGTERM would just work.
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i > 500 {
			t.Fatal("launched shell never got ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	r.StopLaunched(300 * time.Millisecond)
	if d := time.Since(t0); d < 300*time.Millisecond || d > 3*time.Second {
		t.Fatalf("stop took %v", d)
	}
	for _, pid := range []int32{a.Pid, b.Pid} {
		if _, err := os.Stat("/proc/" + strconv.Itoa(int(pid))); !os.IsNotExist(err) {
			t.Fatalf("pid %d survived", pid)
		}
	}
}

func TestSanitizedEnv(t *testing.T) {
	got := SanitizedEnv([]string{"A=1", "FORKFLEET_ACI_TOKEN=x", "FORKFLEET_ACI_TOKENX=y"}, "FORKFLEET_ACI_TOKEN")
	if strings.Join(got, ",") != "A=1,FORKFLEET_ACI_TOKENX=y" {
		t.Fatal(got)
	}
}

func newFiles(t *testing.T) *Files {
	f := NewFiles(FileLimits{MaxFileBytes: 1000, MaxReadBytes: 100, MaxUploads: 2, UploadIdle: time.Minute})
	t.Cleanup(f.Close)
	return f
}

func noTemps(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".forkfleet-") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
}

func TestFilePut(t *testing.T) {
	f := newFiles(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "a.txt")
	os.WriteFile(p, []byte("old content"), 0o600)
	res, err := f.Put(&aciv1.FilePutRequest{Path: p, Data: []byte("new"), Mode: 0o640})
	if err != nil || !res.Published || res.Size != 3 {
		t.Fatalf("put: %v %v", res, err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "new" || st.Mode().Perm() != 0o640 {
		t.Fatalf("content %q mode %v", b, st.Mode())
	}
	noTemps(t, dir)
	// Parents.
	deep := filepath.Join(dir, "x/y/z.bin")
	if _, err := f.Put(&aciv1.FilePutRequest{Path: deep, Data: []byte{1}}); code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("missing parent: %v", err)
	}
	if _, err := f.Put(&aciv1.FilePutRequest{Path: deep, Data: []byte{1}, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  *aciv1.FilePutRequest
		want aciv1.ErrorCode
	}{
		{&aciv1.FilePutRequest{Path: "rel/path"}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{&aciv1.FilePutRequest{Path: ""}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{&aciv1.FilePutRequest{Path: dir}, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION},
		{&aciv1.FilePutRequest{Path: p, Data: make([]byte, 1001)}, aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED},
		{&aciv1.FilePutRequest{Path: p, Mode: 0o10000}, aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
	} {
		if _, err := f.Put(tc.req); code(err) != tc.want {
			t.Errorf("%v: got %v want %v", tc.req, err, tc.want)
		}
	}
}

func TestFilePutChunked(t *testing.T) {
	f := newFiles(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "big.bin")
	put := func(off uint64, data string, last bool) (*aciv1.FilePutResponse, error) {
		return f.Put(&aciv1.FilePutRequest{Path: p, Data: []byte(data), UploadId: "u1", Offset: off, Last: last})
	}
	if r, err := put(0, "abc", false); err != nil || r.Size != 3 || r.Published {
		t.Fatalf("chunk 1: %v %v", r, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("published before last chunk")
	}
	if _, err := put(2, "x", false); code(err) != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		t.Fatalf("wrong offset: %v", err)
	}
	if _, err := put(3, "def", false); err != nil {
		t.Fatal(err)
	}
	if r, err := put(6, "g", true); err != nil || !r.Published || r.Size != 7 {
		t.Fatalf("last: %v %v", r, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "abcdefg" {
		t.Fatalf("content %q", b)
	}
	noTemps(t, dir)
	// Unknown upload at a non-zero offset.
	if _, err := put(5, "x", false); code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("unknown upload: %v", err)
	}
	// Size limit drops the upload.
	if _, err := put(0, strings.Repeat("a", 600), false); err != nil {
		t.Fatal(err)
	}
	if _, err := put(600, strings.Repeat("a", 600), false); code(err) != aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED {
		t.Fatalf("over limit: %v", err)
	}
	noTemps(t, dir)
	// Upload count limit and stale cleanup.
	for i := range 2 {
		if _, err := f.Put(&aciv1.FilePutRequest{Path: p, UploadId: "s" + strconv.Itoa(i), Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Put(&aciv1.FilePutRequest{Path: p, UploadId: "s3", Data: []byte("x")}); code(err) != aciv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED {
		t.Fatalf("upload limit: %v", err)
	}
	f.now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	if n := f.SweepStale(); n != 2 {
		t.Fatalf("swept %d", n)
	}
	noTemps(t, dir)
}

func TestFileGetStatListMkdirDelete(t *testing.T) {
	f := newFiles(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "data")
	content := strings.Repeat("0123456789", 30) // 300 bytes, > MaxReadBytes
	os.WriteFile(p, []byte(content), 0o644)
	r, err := f.Get(&aciv1.FileGetRequest{Path: p, Offset: 10, Length: 5})
	if err != nil || string(r.Data) != "01234" || r.Size != 300 || r.Eof {
		t.Fatalf("range: %v %v", r, err)
	}
	r, err = f.Get(&aciv1.FileGetRequest{Path: p})
	if err != nil || len(r.Data) != 100 || r.Eof {
		t.Fatalf("capped: %d %v", len(r.Data), err)
	}
	r, err = f.Get(&aciv1.FileGetRequest{Path: p, Offset: 250})
	if err != nil || string(r.Data) != content[250:] || !r.Eof {
		t.Fatalf("tail: %v %v", r, err)
	}
	if _, err := f.Get(&aciv1.FileGetRequest{Path: p, Offset: 301}); code(err) != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		t.Fatalf("beyond: %v", err)
	}
	if _, err := f.Get(&aciv1.FileGetRequest{Path: dir}); code(err) != aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
		t.Fatalf("dir: %v", err)
	}
	if _, err := f.Get(&aciv1.FileGetRequest{Path: filepath.Join(dir, "nope")}); code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("missing: %v", err)
	}
	if _, err := f.Get(&aciv1.FileGetRequest{Path: "data"}); code(err) != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		t.Fatalf("relative: %v", err)
	}

	os.Symlink(p, filepath.Join(dir, "link"))
	st, err := f.Stat(&aciv1.FileStatRequest{Path: filepath.Join(dir, "link")})
	if err != nil || !st.Info.IsSymlink || st.Info.Name != "link" {
		t.Fatalf("stat link: %v %v", st, err)
	}
	st, err = f.Stat(&aciv1.FileStatRequest{Path: p})
	if err != nil || st.Info.Size != 300 || st.Info.Mode != 0o644 || st.Info.IsDir {
		t.Fatalf("stat: %v %v", st, err)
	}

	sub := filepath.Join(dir, "sub")
	if _, err := f.Mkdir(&aciv1.FileMkdirRequest{Path: sub}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mkdir(&aciv1.FileMkdirRequest{Path: sub}); code(err) != aciv1.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		t.Fatalf("mkdir twice: %v", err)
	}
	if _, err := f.Mkdir(&aciv1.FileMkdirRequest{Path: filepath.Join(sub, "a/b"), Parents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mkdir(&aciv1.FileMkdirRequest{Path: filepath.Join(dir, "q/r")}); code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("mkdir no parents: %v", err)
	}
	ls, err := f.List(&aciv1.FileListRequest{Path: dir})
	if err != nil || len(ls.Entries) != 3 || ls.Entries[0].Name != "data" || !ls.Entries[2].IsDir {
		t.Fatalf("list: %v %v", ls, err)
	}
	if _, err := f.List(&aciv1.FileListRequest{Path: p}); code(err) != aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
		t.Fatalf("list file: %v", err)
	}
	if _, err := f.Delete(&aciv1.FileDeleteRequest{Path: sub}); code(err) != aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
		t.Fatalf("delete non-empty: %v", err)
	}
	if _, err := f.Delete(&aciv1.FileDeleteRequest{Path: sub, Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Delete(&aciv1.FileDeleteRequest{Path: sub}); code(err) != aciv1.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("delete missing: %v", err)
	}
	if _, err := f.Delete(&aciv1.FileDeleteRequest{Path: "/", Recursive: true}); code(err) != aciv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
		t.Fatalf("delete /: %v", err)
	}
}

func TestOthersCPUTime(t *testing.T) {
	// A child that spins makes the sum grow by about its run time. On a
	// host (not a sandbox) the sum covers every process of the machine,
	// and one that exits takes its time out of it: an interval where that
	// happened proves nothing, so a few are tried.
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var a, b time.Duration
	for range 20 {
		var err error
		if a, err = OthersCPUTime(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if b, err = OthersCPUTime(); err != nil {
			t.Fatal(err)
		}
		if a > 0 && b-a >= 10*time.Millisecond {
			return
		}
	}
	t.Fatalf("others' CPU time %v then %v: want the spinning child's run time added", a, b)
}

func TestEnsureDevShm(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	for range 2 { // the second call finds it
		if err := EnsureDevShm(dir); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModePerm | fs.ModeSticky); got != 0o777|fs.ModeSticky {
		t.Errorf("mode %v, want drwxrwxrwt", fi.Mode())
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := EnsureDevShm(file); err == nil {
		t.Error("a file in the way: no error")
	}
}

// TestFileGetNonRegular: file_get refuses what is not a regular file, and a
// FIFO does not block it (an open for reading waits for a writer).
func TestFileGetNonRegular(t *testing.T) {
	f := newFiles(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link-to-fifo")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{fifo: "FIFO", link: "FIFO", dir: "directory", "/dev/null": "device"} {
		done := make(chan error, 1)
		go func() {
			_, err := f.Get(&aciv1.FileGetRequest{Path: path})
			done <- err
		}()
		select {
		case err := <-done:
			if code(err) != aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION || !strings.Contains(err.Error(), kind) {
				t.Errorf("%s: %v", path, err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("file_get %s blocked", path)
		}
	}
}

// TestMergeMemory checks the KSM opt-in: on for the process and for a
// process it starts afterwards (what a replica's guestd needs after CRIU
// dropped the flag).
func TestMergeMemory(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_MEMORY_MERGE, 0, 0, 0, 0); err != nil {
		t.Skipf("no PR_SET_MEMORY_MERGE on this kernel: %v", err)
	}
	if merged, err := MemoryMerged(); err != nil || merged {
		t.Fatalf("MemoryMerged after turning it off = %v, %v", merged, err)
	}
	if err := MergeMemory(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_MEMORY_MERGE, 0, 0, 0, 0) })
	if merged, err := MemoryMerged(); err != nil || !merged {
		t.Fatalf("MemoryMerged after MergeMemory = %v, %v", merged, err)
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(stat), "ksm_merge_any: yes") {
		t.Fatalf("a process started after MergeMemory is not opted in:\n%s", stat)
	}
}

func TestUndumpable(t *testing.T) {
	if err := Undumpable(); err != nil {
		t.Fatal(err)
	}
	if d, err := Dumpable(); err != nil || d {
		t.Fatalf("Dumpable after Undumpable = %v, %v", d, err)
	}
	t.Setenv("FORKFLEET_TEST_SECRET", "x")
	ScrubEnv("FORKFLEET_TEST_SECRET")
	if _, ok := os.LookupEnv("FORKFLEET_TEST_SECRET"); ok {
		t.Fatal("ScrubEnv left the variable")
	}
}

func TestWithLocale(t *testing.T) {
	if got := WithLocale([]string{"PATH=/bin"}); !slices.Contains(got, "LANG=C.UTF-8") {
		t.Fatalf("no locale: %v", got)
	}
	for _, set := range []string{"LANG=de_DE.UTF-8", "LC_ALL=C", "LC_CTYPE=C.UTF-8"} {
		if got := WithLocale([]string{set}); len(got) != 1 {
			t.Fatalf("%s was overridden: %v", set, got)
		}
	}
	if got := WithLocale([]string{"LANG="}); !slices.Contains(got, "LANG=C.UTF-8") {
		t.Fatalf("empty LANG: %v", got)
	}
}

// TestRunnerAsUser: children run with the user's credentials and login
// variables, start in its home (or / without one), and cannot read what
// root keeps private.
func TestRunnerAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (setuid children)")
	}
	id, err := LookupIdentity("nobody")
	if err != nil {
		t.Skip(err)
	}
	if _, err := LookupIdentity("root"); err == nil {
		t.Fatal("LookupIdentity accepted root as the unprivileged user")
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("token"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t)
	r.User = id
	resp, err := r.Exec(context.Background(), &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c",
		`id -u; id -g; echo "$HOME $USER $LOGNAME"; pwd; cat ` + secret + ` || echo denied`}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d\n%d\n%s nobody nobody\n%s\ndenied\n", id.UID, id.GID, id.Home, id.Dir())
	if string(resp.GetStdout()) != want {
		t.Fatalf("as nobody: %q (stderr %q), want %q", resp.GetStdout(), resp.GetStderr(), want)
	}
	// Root: the runner's own credentials and environment.
	r.User = nil
	resp, err = r.Exec(context.Background(), &aciv1.ExecRequest{Argv: []string{"/bin/sh", "-c", "id -u; cat " + secret}})
	if err != nil || string(resp.GetStdout()) != "0\ntoken" {
		t.Fatalf("as root: %q %v", resp.GetStdout(), err)
	}
	if fc := id.FSCred(); fc.UID != int(id.UID) || fc.IsRoot() {
		t.Fatalf("FSCred %+v", fc)
	}
	var none *Identity
	if none.Credential() != nil || !none.FSCred().IsRoot() || none.Dir() != "" || len(none.Env([]string{"A=b"})) != 1 {
		t.Fatal("the nil identity is not guestd's own")
	}
}

func TestParseStat(t *testing.T) {
	// comm may hold spaces and parentheses; fields count from its last ')'.
	line := "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10"
	st, err := parseStat(line)
	if err != nil || st.State != 'S' || st.Start != 123456 {
		t.Fatalf("parseStat = %+v, %v; want state S, start 123456", st, err)
	}
	for _, bad := range []string{"", "42 (x", "42 (x) S 1 2", "42 (x) SS 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 9 1 1", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 -9 1 1"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

func TestReadStatSelf(t *testing.T) {
	a, err := ReadStat(0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadStat(os.Getpid())
	if err != nil || a.Start != b.Start || a.Start == 0 {
		t.Fatalf("self %+v, by pid %+v (%v)", a, b, err)
	}
	pids, err := PIDs()
	if err != nil || !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("PIDs() = %d entries, %v: want this process among them", len(pids), err)
	}
}
