package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

// ctl runs one command line against target and returns its exit status and
// output.
func ctl(t *testing.T, target string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if target != "" {
		args = append([]string{"--address", target}, args...)
	}
	code := run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// ok runs a command that must succeed and decodes its -o json output into
// a new M.
func ok[M proto.Message](t *testing.T, target string, args ...string) M {
	t.Helper()
	code, out, errOut := ctl(t, target, append([]string{"-o", "json"}, args...)...)
	if code != exitOK {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	var m M
	m = m.ProtoReflect().Type().New().Interface().(M)
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("%v: output is not a %T: %v\n%s", args, m, err, out)
	}
	return m
}

// walk visits every command of the tree.
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
}

// Every RPC of controld's three services has a command, named in its
// short help as "(RpcName)": a new RPC without a command fails here.
func TestEveryRPCHasACommand(t *testing.T) {
	covered := map[string]bool{}
	rpc := regexp.MustCompile(`\(([A-Z][A-Za-z]+)\)`)
	walk(newRoot(&globals{}), func(c *cobra.Command) {
		for _, m := range rpc.FindAllStringSubmatch(c.Short, -1) {
			covered[m[1]] = true
		}
	})
	services := controldv1.File_forkfleet_controld_v1_controld_proto.Services()
	n := 0
	for i := range services.Len() {
		methods := services.Get(i).Methods()
		for j := range methods.Len() {
			name := string(methods.Get(j).Name())
			n++
			if !covered[name] {
				t.Errorf("no forkfleetctl command calls %s.%s", services.Get(i).Name(), name)
			}
		}
	}
	if n < 25 {
		t.Fatalf("only %d RPCs found", n)
	}
}

// --help (and help) exit 0 for every command and print its usage on stdout.
func TestHelpExitsZero(t *testing.T) {
	var paths [][]string
	walk(newRoot(&globals{}), func(c *cobra.Command) {
		p := strings.Fields(c.CommandPath())[1:]
		paths = append(paths, p)
	})
	for _, p := range paths {
		code, out, errOut := ctl(t, "", append(p, "--help")...)
		if code != exitOK || !strings.Contains(out, "Usage:") {
			t.Errorf("%v --help: exit %d, stdout %q, stderr %q", p, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"help"}, {"help", "sandbox", "create"}, {"-h"}, {"version"}, {"--version"}} {
		if code, out, _ := ctl(t, "", args...); code != exitOK || out == "" {
			t.Errorf("%v: exit %d, %q", args, code, out)
		}
	}
}

// Usage errors exit 2 and say what was wrong, before anything is dialled
// (the address does not exist).
func TestUsageErrorsExitTwo(t *testing.T) {
	nowhere := "unix:///nonexistent/controld.sock"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "needs a subcommand"},
		{[]string{"sandbox"}, "needs a subcommand"},
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"sandbox", "bogus"}, `unknown command "bogus"`},
		{[]string{"sandbox", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"sandbox", "get"}, "accepts 1 arg"},
		{[]string{"sandbox", "get", "a", "b"}, "accepts 1 arg"},
		{[]string{"sandbox", "delete"}, "requires at least 1 arg"},
		{[]string{"sandbox", "list", "--state", "running"}, `--state "running": want one of`},
		{[]string{"sandbox", "create", "--memory", "2G"}, "--memory"},
		{[]string{"sandbox", "create", "--screen", "800"}, "--screen"},
		{[]string{"sandbox", "create", "--label", "novalue"}, "KEY=VALUE"},
		{[]string{"sandbox", "create", "--allow", "10.0.0.0/8"}, "need --egress"},
		{[]string{"sandbox", "create", "--egress", "--allow", "10.0.0.0/8:icmp"}, "tcp or udp"},
		{[]string{"sandbox", "create", "--ttl", "soon"}, "--ttl"},
		{[]string{"sandbox", "expose", "sb-x", "0"}, "1..65535"},
		{[]string{"sandbox", "verify", "sb-x", "--level", "vibes"}, "--level"},
		{[]string{"checkpoint", "create", "sb-x", "--tier", "cold"}, "--tier"},
		{[]string{"checkpoint", "fork", "ck-x", "-n", "0"}, "at least 1"},
		{[]string{"checkpoint", "fork", "ck-x", "--restore", "sloth"}, "--restore"},
		{[]string{"pool", "create", "p", "--size", "2"}, "exactly one of --image and --checkpoint"},
		{[]string{"pool", "create", "p", "--size", "2", "--image", "i", "--checkpoint", "c"}, "exactly one"},
		{[]string{"pool", "create", "p", "--image", "i"}, "--size 0"},
		{[]string{"-o", "yaml", "sandbox", "list"}, `--output "yaml"`},
		{[]string{"sandbox", "extend", "sb-x"}, "--ttl"},
		{[]string{"pool", "resize", "pl-x"}, "--size 0"},
		{[]string{"sandbox", "list", "--page-size", "5000"}, "--page-size 5000"},
	} {
		code, out, errOut := ctl(t, nowhere, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d (want 2), stderr %q (want %q), stdout %q", tc.args, code, errOut, tc.want, out)
		}
	}
}

// A remote controld gets the token over TLS or, explicitly, in plaintext;
// never in plaintext by default. Nothing here connects anywhere: the
// refusal comes before the first call.
func TestRemoteNeedsTLS(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("secret\n"), 0o600)
	g := &globals{ctx: context.Background(), stdout: io.Discard, stderr: io.Discard, address: "192.0.2.1:7443", tokenFile: tok}
	if _, err := g.client(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("remote without TLS: %v", err)
	}
	if code, _, errOut := ctl(t, "192.0.2.1:7443", "--token-file", tok, "--tls-ca", filepath.Join(dir, "none.pem"), "sandbox", "list"); code != exitUsage || !strings.Contains(errOut, "--tls-ca") {
		t.Fatalf("missing CA file: %d %s", code, errOut)
	}
	os.WriteFile(filepath.Join(dir, "empty.pem"), nil, 0o600)
	if code, _, errOut := ctl(t, "192.0.2.1:7443", "--token-file", tok, "--tls-ca", filepath.Join(dir, "empty.pem"), "sandbox", "list"); code != exitUsage || !strings.Contains(errOut, "no PEM") {
		t.Fatalf("empty CA file: %d %s", code, errOut)
	}
}

// Every command against the fake controld, in JSON (decoded into the RPC's
// response type) and as a table.
func TestCommandsAgainstFake(t *testing.T) {
	srv := controldfake.Start(t)
	target := srv.Target

	created := ok[*controldv1.CreateSandboxResponse](t, target, "sandbox", "create", "--label", "team=ops", "--ttl", "1h",
		"--memory", "2GiB", "--screen", "1024x768", "--env", "LANG=C.UTF-8")
	sb := created.GetSandbox()
	if sb.GetState() != controldv1.SandboxState_SANDBOX_STATE_READY || sb.GetLabels()["team"] != "ops" ||
		sb.GetResources().GetMemoryBytes() != 2<<30 || sb.GetScreen().GetWidth() != 1024 || created.GetEndpoint().GetToken() == "" {
		t.Fatalf("create: %v", created)
	}
	id := sb.GetId()
	if got := ok[*controldv1.GetSandboxResponse](t, target, "sandbox", "get", id); got.GetSandbox().GetId() != id {
		t.Fatalf("get: %v", got)
	}
	if got := ok[*controldv1.ListSandboxesResponse](t, target, "sandbox", "list", "--label", "team=ops", "--state", "ready"); len(got.GetSandboxes()) != 1 {
		t.Fatalf("list: %v", got)
	}
	if got := ok[*controldv1.ListSandboxesResponse](t, target, "sb", "list", "--label", "team=none"); len(got.GetSandboxes()) != 0 {
		t.Fatalf("list filtered: %v", got)
	}
	ok[*controldv1.WaitSandboxReadyResponse](t, target, "sandbox", "wait", id, "--timeout", "5s")
	if got := ok[*controldv1.GetSandboxEndpointResponse](t, target, "sandbox", "endpoint", id); got.GetEndpoint().GetToken() == "" {
		t.Fatalf("endpoint: %v", got)
	}
	if got := ok[*controldv1.SuspendSandboxResponse](t, target, "sandbox", "suspend", id); got.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED {
		t.Fatalf("suspend: %v", got)
	}
	if got := ok[*controldv1.ResumeSandboxResponse](t, target, "sandbox", "resume", id); got.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("resume: %v", got)
	}
	if got := ok[*controldv1.GetHostStatusResponse](t, target, "host", "status"); got.GetHost() != "fake" || got.GetSandboxes() != 1 ||
		got.GetAdmittedMemoryBytes() != 2<<30 || got.GetMaxMemoryBytes() == 0 {
		t.Fatalf("host status: %v", got)
	}
	ev := ok[*controldv1.WatchSandboxesResponse](t, target, "sandbox", "watch", id, "--count", "1")
	if ev.GetType() != controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_EXISTING || ev.GetSandbox().GetId() != id {
		t.Fatalf("watch: %v", ev)
	}

	ck := ok[*controldv1.CreateCheckpointResponse](t, target, "checkpoint", "create", id, "--name", "base", "--label", "k=v").GetCheckpoint()
	if ck.GetName() != "base" || ck.GetSourceSandboxId() != id {
		t.Fatalf("checkpoint create: %v", ck)
	}
	if got := ok[*controldv1.GetCheckpointResponse](t, target, "checkpoint", "get", "base"); got.GetCheckpoint().GetId() != ck.GetId() {
		t.Fatalf("checkpoint get by name: %v", got)
	}
	if got := ok[*controldv1.ListCheckpointsResponse](t, target, "ck", "list", "--root", ck.GetId()); len(got.GetCheckpoints()) != 1 {
		t.Fatalf("checkpoint list: %v", got)
	}
	fork := ok[*controldv1.ForkCheckpointResponse](t, target, "checkpoint", "fork", ck.GetId(), "-n", "2", "--label", "replica=yes")
	if len(fork.GetReplicas()) != 2 || fork.GetReplicas()[0].GetSandbox().GetLabels()["replica"] != "yes" {
		t.Fatalf("fork: %v", fork)
	}
	lazy := ok[*controldv1.ForkCheckpointResponse](t, target, "checkpoint", "fork", ck.GetId(), "--restore", "lazy")
	if m := lazy.GetReplicas()[0].GetRestoreMode(); m != controldv1.RestoreMode_RESTORE_MODE_LAZY {
		t.Fatalf("fork --restore lazy: replica restored %v", m)
	}
	replica := fork.GetReplicas()[0].GetSandbox().GetId()
	if got := ok[*controldv1.VerifySandboxResponse](t, target, "sandbox", "verify", replica); len(got.GetResults()) == 0 {
		t.Fatalf("verify: %v", got)
	}
	exp := ok[*controldv1.ExportCheckpointResponse](t, target, "checkpoint", "export", ck.GetId(), "registry.example/ck:v1")
	if exp.GetDigest() == "" {
		t.Fatalf("export: %v", exp)
	}
	// Through a registry: push, then fork by reference (one import, forked
	// again on the next fork).
	if pushed := ok[*controldv1.ExportCheckpointResponse](t, target, "checkpoint", "export", ck.GetId(), "registry.example/ck:remote", "--push"); pushed.GetPushedBytes() == 0 {
		t.Fatalf("export --push: %v", pushed)
	}
	remote := ok[*controldv1.ForkCheckpointResponse](t, target, "checkpoint", "fork", "--remote", "registry.example/ck:remote")
	if len(remote.GetReplicas()) != 1 || remote.GetCheckpointId() == ck.GetId() || remote.GetCheckpointId() == "" {
		t.Fatalf("fork --remote: %v", remote)
	}
	if again := ok[*controldv1.ForkCheckpointResponse](t, target, "checkpoint", "fork", "--remote", "registry.example/ck:remote"); again.GetCheckpointId() != remote.GetCheckpointId() {
		t.Fatalf("second fork --remote forked %s, want %s", again.GetCheckpointId(), remote.GetCheckpointId())
	}
	// An import keeps the checkpoint's name, taken here until it is gone.
	if code, _, errOut := ctl(t, target, "checkpoint", "import", "registry.example/ck:v1"); code != exitError || !strings.Contains(errOut, "exists") {
		t.Fatalf("import while the name is taken: %d %q", code, errOut)
	}
	again := ok[*controldv1.CreateCheckpointResponse](t, target, "checkpoint", "create", id, "--request-id", "cli-ck")
	if got := ok[*controldv1.CreateCheckpointResponse](t, target, "checkpoint", "create", id, "--request-id", "cli-ck"); got.GetCheckpoint().GetId() != again.GetCheckpoint().GetId() {
		t.Fatalf("checkpoint create with one request id twice: %v / %v", got, again)
	}
	ok[*controldv1.DeleteCheckpointResponse](t, target, "checkpoint", "delete", again.GetCheckpoint().GetId())

	egress := ok[*controldv1.CreateSandboxResponse](t, target, "sandbox", "create", "--egress", "--allow", "203.0.113.0/24:tcp:443,8000-8100").GetSandbox()
	if r := egress.GetNetwork().GetPolicy().GetAllow(); len(r) != 1 || r[0].GetPorts()[1].GetLast() != 8100 {
		t.Fatalf("egress create: %v", egress.GetNetwork())
	}
	if got := ok[*controldv1.UpdateSandboxNetworkResponse](t, target, "sandbox", "network", egress.GetId(), "--deny", "198.51.100.7"); len(got.GetSandbox().GetNetwork().GetPolicy().GetDeny()) != 1 {
		t.Fatalf("network: %v", got)
	}
	exposed := ok[*controldv1.ExposePortResponse](t, target, "sandbox", "expose", egress.GetId(), "8080")
	if !strings.Contains(exposed.GetUrl(), "/ports/8080/") || exposed.GetToken() == "" {
		t.Fatalf("expose: %v", exposed)
	}
	ok[*controldv1.UnexposePortResponse](t, target, "sandbox", "unexpose", egress.GetId(), "8080")
	if v := ok[*controldv1.CreateViewTicketResponse](t, target, "sandbox", "view", egress.GetId(), "--control", "--ttl", "2m"); !strings.Contains(v.GetUrl(), "/view?ticket=") || v.GetExpiresAt() == nil {
		t.Fatalf("view: %v", v)
	}
	rec := ok[*controldv1.StartRecordingResponse](t, target, "recording", "start", egress.GetId(), "--max-bytes", "2000000").GetRecording()
	if rec.GetMaxBytes() != 2000000 || rec.GetSandboxId() != egress.GetId() {
		t.Fatalf("recording start: %v", rec)
	}
	if got := ok[*controldv1.ListRecordingsResponse](t, target, "recording", "list", "--sandbox", egress.GetId()); len(got.GetRecordings()) != 1 {
		t.Fatalf("recording list: %v", got)
	}
	if got := ok[*controldv1.GetRecordingResponse](t, target, "recording", "get", rec.GetId()); got.GetRecording().GetId() != rec.GetId() {
		t.Fatalf("recording get: %v", got)
	}
	if got := ok[*controldv1.StopRecordingResponse](t, target, "recording", "stop", rec.GetId()); got.GetRecording().GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED {
		t.Fatalf("recording stop: %v", got)
	}
	dst := filepath.Join(t.TempDir(), "rec.mp4")
	if code, _, errOut := ctl(t, target, "recording", "download", rec.GetId(), "--file", "mp4", "-o", dst); code != exitError || !strings.Contains(errOut, "ExportRecording it first") {
		t.Fatalf("download of an MP4 not exported: exit %d: %s", code, errOut)
	}
	if code, _, errOut := ctl(t, target, "recording", "download", rec.GetId(), "--file", "../x", "-o", dst); code != exitUsage || !strings.Contains(errOut, "--file") {
		t.Fatalf("download of a bad file: exit %d: %s", code, errOut)
	}
	if code, _, errOut := ctl(t, target, "recording", "export", rec.GetId(), "--download", dst); code != exitError || !strings.Contains(errOut, "RECORDING_EMPTY") && !strings.Contains(errOut, "no frame") {
		t.Fatalf("export --download of an empty recording: exit %d: %s", code, errOut)
	}
	ok[*controldv1.DeleteRecordingResponse](t, target, "recording", "delete", rec.GetId())

	pl := ok[*controldv1.CreatePoolResponse](t, target, "pool", "create", "warm", "--size", "2", "--image", controldfake.DefaultImage).GetPool()
	if pl.GetSize() != 2 {
		t.Fatalf("pool create: %v", pl)
	}
	if got := ok[*controldv1.GetPoolResponse](t, target, "pool", "get", pl.GetId()); got.GetPool().GetName() != "warm" {
		t.Fatalf("pool get: %v", got)
	}
	if got := ok[*controldv1.ListPoolsResponse](t, target, "pool", "list"); len(got.GetPools()) != 1 {
		t.Fatalf("pool list: %v", got)
	}
	claim := ok[*controldv1.ClaimPoolResponse](t, target, "pool", "claim", pl.GetId(), "--label", "who=test")
	if claim.GetSandbox().GetId() == "" || claim.GetEndpoint() == nil {
		t.Fatalf("claim: %v", claim)
	}
	if again := ok[*controldv1.ClaimPoolResponse](t, target, "pool", "claim", pl.GetId(), "--request-id", "cli-claim"); again.GetSandbox().GetId() !=
		ok[*controldv1.ClaimPoolResponse](t, target, "pool", "claim", pl.GetId(), "--request-id", "cli-claim").GetSandbox().GetId() {
		t.Fatal("claim with one request id twice: two sandboxes")
	}
	if got := ok[*controldv1.UpdatePoolResponse](t, target, "pool", "resize", pl.GetId(), "--size", "3"); got.GetPool().GetSize() != 3 {
		t.Fatalf("resize: %v", got)
	}
	ok[*controldv1.DeletePoolResponse](t, target, "pool", "delete", pl.GetId())
	del := ok[*controldv1.DeleteCheckpointResponse](t, target, "checkpoint", "delete", ck.GetId(), "--cascade")
	if len(del.GetDeletedIds()) == 0 {
		t.Fatalf("checkpoint delete: %v", del)
	}
	if got := ok[*controldv1.ImportCheckpointResponse](t, target, "checkpoint", "import", "registry.example/ck:v1"); got.GetCheckpoint().GetName() != "base" {
		t.Fatalf("import: %v", got)
	}
	if got := ok[*controldv1.ExtendSandboxResponse](t, target, "sandbox", "extend", id, "--ttl", "2h"); got.GetSandbox().GetExpiresAt() == nil {
		t.Fatalf("extend: %v", got)
	}
	// One page, then the rest by its token.
	page := ok[*controldv1.ListSandboxesResponse](t, target, "sandbox", "list", "--page-size", "1")
	if len(page.GetSandboxes()) != 1 || page.GetNextPageToken() == "" {
		t.Fatalf("one page: %v", page)
	}
	rest := ok[*controldv1.ListSandboxesResponse](t, target, "sandbox", "list", "--page-token", page.GetNextPageToken(), "--page-size", "1000")
	all := ok[*controldv1.ListSandboxesResponse](t, target, "sandbox", "list")
	if len(rest.GetSandboxes())+1 != len(all.GetSandboxes()) || all.GetNextPageToken() != "" {
		t.Fatalf("pages %d+1, all %d", len(rest.GetSandboxes()), len(all.GetSandboxes()))
	}
	ok[*controldv1.DeleteSandboxResponse](t, target, "sandbox", "delete", id)

	// Tables: a header and a row per sandbox.
	code, out, errOut := ctl(t, target, "sandbox", "list")
	if code != exitOK || !strings.HasPrefix(out, "ID ") || !strings.Contains(out, egress.GetId()) {
		t.Fatalf("table: %d %q %q", code, out, errOut)
	}
	if code, out, _ := ctl(t, target, "checkpoint", "list"); code != exitOK || !strings.HasPrefix(out, "ID ") {
		t.Fatalf("checkpoint table: %d %q", code, out)
	}
	if code, out, _ := ctl(t, target, "sandbox", "get", egress.GetId()); code != exitOK || !strings.Contains(out, "egress deny 198.51.100.7") {
		t.Fatalf("detail: %d %q", code, out)
	}

	// What controld refuses exits 1 with its error.
	if code, _, errOut := ctl(t, target, "sandbox", "get", "sb-aaaaaaaaaaaaaaaa"); code != exitError || !strings.Contains(errOut, "not found") {
		t.Fatalf("not found: %d %q", code, errOut)
	}
}

// Shell completion: the scripts, and ids completed from controld.
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		code, out, errOut := ctl(t, "", "completion", sh)
		if code != exitOK || !strings.Contains(out, "forkfleetctl") {
			t.Errorf("completion %s: %d %q", sh, code, errOut)
		}
	}
	srv := controldfake.Start(t)
	sb := ok[*controldv1.CreateSandboxResponse](t, srv.Target, "sandbox", "create").GetSandbox()
	code, out, _ := ctl(t, srv.Target, "__complete", "sandbox", "get", "")
	if code != exitOK || !strings.Contains(out, sb.GetId()+"\tready") {
		t.Fatalf("complete sandbox ids: %d %q", code, out)
	}
	code, out, _ = ctl(t, srv.Target, "__complete", "checkpoint", "create", sb.GetId(), "--tier", "")
	if code != exitOK || !strings.Contains(out, "memory") || !strings.Contains(out, "disk") {
		t.Fatalf("complete --tier: %d %q", code, out)
	}
	// An unreachable controld completes nothing, quietly.
	if code, out, _ := ctl(t, "unix:///nonexistent/controld.sock", "__complete", "sandbox", "get", ""); code != exitOK || strings.Contains(out, "sb-") {
		t.Fatalf("complete offline: %d %q", code, out)
	}
}

// A comma-separated --address drives many hosts: placement by room,
// later commands routed to the sandbox's host, every host's status.
func TestManyHosts(t *testing.T) {
	a, b := controldfake.Start(t), controldfake.Start(t)
	a.Host, b.Host = "host-a", "host-b"
	lim := limits.Default()
	lim.MaxMemoryBytes = 8 << 30
	b.Limits = lim
	lim.MaxMemoryBytes = 2 << 30
	a.Limits = lim
	both := a.Target + "," + b.Target
	sb := ok[*controldv1.CreateSandboxResponse](t, both, "sandbox", "create").GetSandbox()
	if sb.GetHost() != "host-b" {
		t.Fatalf("placed on %q", sb.GetHost())
	}
	if got := ok[*controldv1.GetSandboxResponse](t, both, "sandbox", "get", sb.GetId()); got.GetSandbox().GetHost() != "host-b" {
		t.Fatalf("get: %v", got)
	}
	code, out, errOut := ctl(t, both, "host", "status")
	if code != exitOK || !strings.Contains(out, "host-a") || !strings.Contains(out, "host-b") {
		t.Fatalf("host status: exit %d\n%s%s", code, out, errOut)
	}
	// A fork over both hosts through their shared registry.
	reg := controldfake.NewRegistry()
	a.Registry, b.Registry = reg, reg
	ck := ok[*controldv1.CreateCheckpointResponse](t, both, "checkpoint", "create", sb.GetId()).GetCheckpoint()
	forked := ok[*controldv1.ForkCheckpointResponse](t, both, "--fork-registry", "127.0.0.1:5000/ff/ck", "checkpoint", "fork", ck.GetId(), "--count", "8")
	hosts := map[string]int{}
	for _, r := range forked.GetReplicas() {
		hosts[r.GetSandbox().GetHost()]++
	}
	if hosts["host-a"] == 0 || hosts["host-b"] == 0 || len(forked.GetReplicas()) != 8 {
		t.Fatalf("replicas per host %v", hosts)
	}
}
