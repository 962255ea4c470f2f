package containerdrt

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	criurpc "github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/desktoptest"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// criuWrapper builds deploy/criu/wrapper.c the way host-setup does
// (build_criu_wrapper), answering VERSION from cache, with the preload
// library when one is given.
func criuWrapper(t *testing.T, dir, name, cache string, preload ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	hostSetup(t, "build_criu_wrapper", out, strings.Join(preload, ""), cache)
	return out
}

// hostSetup runs one function of deploy/host-setup.sh with args.
func hostSetup(t *testing.T, fn string, args ...string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", append([]string{"-c", `. "$1/deploy/host-setup.sh" && shift && "$@"`, "bash", desktoptest.RepoRoot(wd), fn}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", fn, err, b)
	}
}

// needPrivateCRIU skips t on a host whose CRIU is not forkfleet's private
// one (host-setup then installs no wrapper or preload).
func needPrivateCRIU(t *testing.T) {
	t.Helper()
	testenv.RealStack(t)
	if _, err := os.Stat("/opt/forkfleet/criu/usr/sbin/criu"); err != nil {
		t.Skip("no private CRIU in /opt/forkfleet/criu (host-setup used the host's CRIU)")
	}
}

// swrk runs bin as runc runs CRIU (`criu swrk <fd>`), sends each request
// and returns the responses and the exit status. A nil response is a
// closed socket.
func swrk(t *testing.T, bin string, reqs ...[]byte) ([][]byte, error) {
	t.Helper()
	return swrkWith(t, bin, nil, 0, reqs...)
}

// swrkWith is swrk with extra environment variables and a delay before the
// first request.
func swrkWith(t *testing.T, bin string, env []string, delay time.Duration, reqs ...[]byte) ([][]byte, error) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cln := os.NewFile(uintptr(fds[0]), "cln")
	defer cln.Close()
	srv := os.NewFile(uintptr(fds[1]), "srv")
	cmd := exec.Command(bin, "swrk", "3")
	cmd.ExtraFiles = []*os.File{srv}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, criuWrapperExecVar+"=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	time.Sleep(delay)
	var resps [][]byte
	for _, req := range reqs {
		if _, err := cln.Write(req); err != nil {
			resps = append(resps, nil)
			continue
		}
		if err := cln.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil && !errors.Is(err, os.ErrNoDeadline) {
			t.Fatal(err)
		}
		buf := make([]byte, 8192)
		n, err := cln.Read(buf)
		if err != nil || n == 0 {
			resps = append(resps, nil)
			continue
		}
		resps = append(resps, buf[:n])
	}
	cln.Close()
	return resps, cmd.Wait()
}

func versionReq(t *testing.T, keepOpen bool) []byte {
	t.Helper()
	req := &criurpc.CriuReq{Type: criurpc.CriuReqType_VERSION.Enum()}
	if keepOpen {
		req.KeepOpen = proto.Bool(true)
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCRIUWrapperAnswersVersionLikeCRIU: the CRIU wrapper's own answer to
// runc's VERSION probe is the real CRIU's, byte for byte; it comes from the
// cache only while the cache's key is the binary's; and every other request
// reaches the real CRIU untouched (the wrapper only peeks at it).
func TestCRIUWrapperAnswersVersionLikeCRIU(t *testing.T) {
	needPrivateCRIU(t)
	dir := t.TempDir()
	cache := filepath.Join(dir, "criu-version.cache")
	wrapper := criuWrapper(t, dir, "criu", cache)
	// The same wrapper without a cache: the real CRIU answers everything.
	plain := criuWrapper(t, dir, "criu-plain", filepath.Join(dir, "absent"))

	real, err := swrk(t, plain, versionReq(t, false))
	if err != nil || real[0] == nil {
		t.Fatalf("the real CRIU's VERSION: %q, exit %v", real, err)
	}
	var resp criurpc.CriuResp
	if err := proto.Unmarshal(real[0], &resp); err != nil || resp.GetType() != criurpc.CriuReqType_VERSION || !resp.GetSuccess() || resp.GetVersion().GetMajorNumber() < 3 {
		t.Fatalf("the real CRIU's VERSION answer %x: %v %v", real[0], &resp, err)
	}

	if out, err := exec.Command(wrapper, "forkfleet-record-version", cache).CombinedOutput(); err != nil {
		t.Fatalf("forkfleet-record-version: %v\n%s", err, out)
	}
	got, err := swrk(t, wrapper, versionReq(t, false))
	if err != nil || !bytes.Equal(got[0], real[0]) {
		t.Fatalf("the wrapper's VERSION answer %x (exit %v), the real CRIU's %x", got[0], err, real[0])
	}
	// go-criu's probe, as runc's checkCriuVersion makes it.
	c := criu.MakeCriu()
	c.SetCriuPath(wrapper)
	v, err := c.GetCriuVersion()
	c.SetCriuPath(plain)
	want, werr := c.GetCriuVersion()
	if err != nil || werr != nil || v != want {
		t.Fatalf("go-criu's GetCriuVersion: %d (%v) through the cache, %d (%v) from CRIU", v, err, want, werr)
	}

	// The answer comes from the cache: a cache whose response was changed
	// (key still the binary's) is what the wrapper sends...
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	nl := bytes.IndexByte(b, '\n')
	key, recorded := b[:nl+1], b[nl+1:]
	marked := append(append([]byte{}, recorded...), 0x58, 0x07) // status = 7
	if err := os.WriteFile(cache, append(append([]byte{}, key...), marked...), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := swrk(t, wrapper, versionReq(t, false)); err != nil || !bytes.Equal(got[0], marked) {
		t.Fatalf("with a changed cache the wrapper answered %x (exit %v), want the cache's %x", got[0], err, marked)
	}
	// A client that starts CRIU ahead of its request (controld's dumps)
	// gets CRIU at once when it says so, and after the wrapper's wait (10
	// ms) when it does not.
	if got, err := swrkWith(t, wrapper, []string{criuWrapperExecVar + "=1"}, 0, versionReq(t, false)); err != nil || !bytes.Equal(got[0], real[0]) {
		t.Fatalf("with %s set the wrapper answered %x (exit %v), want CRIU's %x", criuWrapperExecVar, got[0], err, real[0])
	}
	if got, err := swrkWith(t, wrapper, nil, 200*time.Millisecond, versionReq(t, false)); err != nil || !bytes.Equal(got[0], real[0]) {
		t.Fatalf("a request 200 ms after the start: the wrapper answered %x (exit %v), want CRIU's %x", got[0], err, real[0])
	}
	// ...and a key that is not the binary's (CRIU replaced) leaves the answer to CRIU.
	stale := append([]byte("1 "), key...)
	if err := os.WriteFile(cache, append(stale, marked...), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := swrk(t, wrapper, versionReq(t, false)); err != nil || !bytes.Equal(got[0], real[0]) {
		t.Fatalf("with a stale key the wrapper answered %x (exit %v), want CRIU's %x", got[0], err, real[0])
	}
	if err := os.WriteFile(cache, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// Any other request goes to CRIU unread: VERSION with keep_open is
	// answered by CRIU, which then serves the next request on the socket.
	got, err = swrk(t, wrapper, versionReq(t, true), versionReq(t, false))
	if err != nil || !bytes.Equal(got[0], real[0]) || !bytes.Equal(got[1], real[0]) {
		t.Fatalf("keep_open VERSION then VERSION through the wrapper: %x (exit %v), want CRIU's %x twice", got, err, real[0])
	}
	// A request CRIU refuses is refused by CRIU, as without the wrapper.
	bad := []byte{0x08, 0x63} // type 99
	viaPlain, perr := swrk(t, plain, bad)
	viaWrapper, werr := swrk(t, wrapper, bad)
	if !bytes.Equal(viaPlain[0], viaWrapper[0]) || exitCode(perr) != exitCode(werr) {
		t.Fatalf("an invalid request: %x (exit %v) through the wrapper, %x (exit %v) from CRIU", viaWrapper[0], werr, viaPlain[0], perr)
	}
	// Other commands pass through with their arguments.
	out, err := exec.Command(wrapper, "--version").CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Version: "+strconv.Itoa(int(resp.GetVersion().GetMajorNumber()))+".")) {
		t.Fatalf("criu --version through the wrapper: %v\n%s", err, out)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// criuPreload builds the preload library the way host-setup does
// (build_criu_preload).
func criuPreload(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "criu-preload.so")
	hostSetup(t, "build_criu_preload", out)
	return out
}

// TestCRIUPreloadLowersRestoreLogLevel: runc asks CRIU for a debug log on
// every restore; the preload lowers a restore request's level to the one
// its CRIU config file names (criuRestoreLogLine, written by controld), or
// to 2 without one, and leaves dumps' levels as they were. Each request
// fails (no images), and its log says at which level CRIU ran: only
// warnings and errors at 2, CRIU's debug lines at 4.
func TestCRIUPreloadLowersRestoreLogLevel(t *testing.T) {
	needPrivateCRIU(t)
	dir := t.TempDir()
	wrapper := criuWrapper(t, dir, "criu", filepath.Join(dir, "absent"), criuPreload(t, dir))
	config := func(name string, lines ...string) string {
		p := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(p, []byte(strings.Join(append(slices.Clone(DefaultCRIUOptions), lines...), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// logLines runs one request of type typ at runc's level 4 with the given
	// CRIU config file and returns CRIU's log.
	logLines := func(name string, typ criurpc.CriuReqType, configFile string) []string {
		t.Helper()
		images := filepath.Join(dir, name+"-images")
		if err := os.Mkdir(images, 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(images)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		opts := &criurpc.CriuOpts{
			ImagesDirFd: proto.Int32(int32(f.Fd())),
			LogLevel:    proto.Int32(criuLogDebug),
			LogFile:     proto.String("criu.log"),
		}
		if configFile != "" {
			opts.ConfigFile = proto.String(configFile)
		}
		if typ == criurpc.CriuReqType_DUMP {
			opts.Pid = proto.Int32(1 << 30) // no such process: the dump fails
		}
		req, err := proto.Marshal(&criurpc.CriuReq{Type: typ.Enum(), Opts: opts})
		if err != nil {
			t.Fatal(err)
		}
		resps, _ := swrk(t, wrapper, req)
		var resp criurpc.CriuResp
		if len(resps) != 1 || resps[0] == nil || proto.Unmarshal(resps[0], &resp) != nil || resp.GetSuccess() {
			t.Fatalf("%s: want CRIU's failure answer, got %x", name, resps)
		}
		b, err := os.ReadFile(filepath.Join(images, "criu.log"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	// At level 2 CRIU writes warnings and errors only; at 4 it stamps every
	// line with the time, "(00.000123) ", and writes its debug lines too.
	debug := func(lines []string) int {
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "(") {
				n++
			}
		}
		return n
	}
	plain := config("plain")
	verbose := config("debug", criuRestoreLogLine(criuLogDebug))
	for _, c := range []struct {
		name      string
		typ       criurpc.CriuReqType
		config    string
		wantDebug bool
	}{
		{"restore", criurpc.CriuReqType_RESTORE, plain, false},
		{"restore-no-config", criurpc.CriuReqType_RESTORE, "", false},
		{"restore-config-absent", criurpc.CriuReqType_RESTORE, filepath.Join(dir, "absent.conf"), false},
		{"restore-debug", criurpc.CriuReqType_RESTORE, verbose, true},
		{"dump", criurpc.CriuReqType_DUMP, plain, true},
	} {
		lines := logLines(c.name, c.typ, c.config)
		if d := debug(lines); (d > 0) != c.wantDebug {
			t.Errorf("%s: %d debug lines, want debug %v:\n%s", c.name, d, c.wantDebug, strings.Join(lines, "\n"))
		}
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "Error") }) {
			t.Errorf("%s: the failed request's log has no error line:\n%s", c.name, strings.Join(lines, "\n"))
		}
	}

	// Messages that are not well-formed requests reach CRIU as they were:
	// it answers them as it does without the library.
	bare := criuWrapper(t, dir, "criu-bare", filepath.Join(dir, "absent"))
	for _, msg := range [][]byte{
		{0x08, 0x02, 0x12, 0x05, 0x48, 0x04},             // restore, opts cut short
		{0x08, 0x02, 0x12, 0x01, 0x48},                   // restore, log_level without its value
		{0x08, 0x02, 0x12, 0x03, 0x4b, 0x04, 0x00},       // restore, a group in opts
		{0x08, 0x02, 0x12, 0x02, 0x48, 0x84},             // restore, an unterminated varint
		{0x08, 0x02, 0x12, 0x04, 0x09, 0x01, 0x02, 0x03}, // restore, a 64-bit field cut short
		{0x08, 0x02, 0x12, 0x03, 0x0d, 0x01, 0x02},       // restore, a 32-bit field cut short
		{0x08}, // a type without its value
	} {
		want, werr := swrk(t, bare, msg)
		got, gerr := swrk(t, wrapper, msg)
		if len(got) != 1 || len(want) != 1 || !bytes.Equal(got[0], want[0]) || exitCode(gerr) != exitCode(werr) {
			t.Errorf("message %x: %x (exit %v) with the library, %x (exit %v) without", msg, got, gerr, want, werr)
		}
	}
}
