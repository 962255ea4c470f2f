package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tests never read this host's /etc/forkfleet/controld.toml.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "config-test")
	if err != nil {
		panic(err)
	}
	DefaultFile = filepath.Join(dir, "absent.toml")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Without --config, DefaultFile is read when it exists; absent, the
// built-in defaults apply; present but unreadable, or a missing --config
// file, is an error.
func TestDefaultFile(t *testing.T) {
	saved := DefaultFile
	t.Cleanup(func() { DefaultFile = saved })
	dir := t.TempDir()
	DefaultFile = filepath.Join(dir, "controld.toml")
	none := func(string) string { return "" }

	c, fl, err := LoadArgs(nil, none)
	if err != nil || fl.ConfigFile != "" || c.Boot.Precreate != Default().Boot.Precreate {
		t.Fatalf("absent default file: %v %+v", err, fl)
	}
	os.WriteFile(DefaultFile, []byte("[boot]\nprecreate = 3\n"), 0o600)
	c, fl, err = LoadArgs(nil, none)
	if err != nil || fl.ConfigFile != DefaultFile || c.Boot.Precreate != 3 {
		t.Fatalf("default file: %v %+v %d", err, fl, c.Boot.Precreate)
	}
	// --config wins over the default file, which is then not read.
	other := filepath.Join(dir, "other.toml")
	os.WriteFile(other, []byte("[boot]\nprecreate = 2\n"), 0o600)
	if c, _, err = LoadArgs([]string{"--config", other}, none); err != nil || c.Boot.Precreate != 2 {
		t.Fatalf("--config: %v %d", err, c.Boot.Precreate)
	}
	if _, _, err := LoadArgs([]string{"--config", filepath.Join(dir, "missing.toml")}, none); err == nil {
		t.Fatal("missing --config file accepted")
	}
	os.Remove(DefaultFile)
	os.Mkdir(DefaultFile, 0o700) // exists, cannot be read as a file
	if _, _, err := LoadArgs(nil, none); err == nil {
		t.Fatal("unreadable default file ignored")
	}
}

func TestDefaults(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.GRPC.UnixSocket != "/run/forkfleet/controld.sock" || c.GRPC.TCPAddress != "127.0.0.1:7443" ||
		c.Gateway.Listen != "127.0.0.1:7480" || c.Metrics.Listen != "127.0.0.1:7490" ||
		c.StateDir != "/var/lib/forkfleet/controld" || c.CheckpointDir != "/var/lib/forkfleet/checkpoints" ||
		c.Containerd.Address != "/run/forkfleet/containerd/containerd.sock" || c.Containerd.Namespace != "forkfleet" ||
		c.Containerd.CgroupParent != "/forkfleet" || c.DefaultImage != "localhost/forkfleet/desktop:latest" || c.DefaultScreen != (Screen{1280, 800, 24}) ||
		c.Tracing.OTLPEndpoint != "" || c.BootTimeout.D() != time.Minute || c.Boot.Precreate != 1 {
		t.Fatalf("defaults %+v", c)
	}
	if c.TokenPath() != "/var/lib/forkfleet/controld/api.token" {
		t.Fatal(c.TokenPath())
	}
}

func TestFileEnvFlagsOrder(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(f, []byte("default_image = \"from-file\"\nboot_timeout = \"9s\"\n[gateway]\nlisten = \"127.0.0.1:1\"\n"), 0o600)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "FORKFLEET_CONTAINERD_NAMESPACE": "ns2"}
	c, fl, err := LoadArgs([]string{"--gateway-listen", "127.0.0.1:2", "--config", f}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if fl.ConfigFile != f || c.DefaultImage != "from-file" || c.BootTimeout.D() != 9*time.Second ||
		c.Gateway.Listen != "127.0.0.1:2" || c.Tracing.OTLPEndpoint != "collector:4317" || c.Containerd.Namespace != "ns2" ||
		c.Metrics.Listen != "127.0.0.1:7490" {
		t.Fatalf("effective %+v", c)
	}
	out, err := c.Marshal()
	if err != nil || !strings.Contains(string(out), `default_image = 'from-file'`) || !strings.Contains(string(out), `boot_timeout = '9s'`) {
		t.Fatalf("marshal: %s %v", out, err)
	}
}

func TestRejects(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(f, []byte("no_such_key = 1\n"), 0o600)
	if _, _, err := LoadArgs([]string{"--config", f}, func(string) string { return "" }); err == nil {
		t.Fatal("unknown key accepted")
	}
	if _, _, err := LoadArgs([]string{"--state-dir", "relative"}, func(string) string { return "" }); err == nil {
		t.Fatal("relative state dir accepted")
	}
	if _, _, err := LoadArgs([]string{"--boot-timeout", "soon"}, func(string) string { return "" }); err == nil {
		t.Fatal("bad duration accepted")
	}
	for _, v := range []string{"-1", "17", "x"} {
		if _, _, err := LoadArgs([]string{"--boot-precreate", v}, func(string) string { return "" }); err == nil {
			t.Fatalf("boot.precreate %s accepted", v)
		}
	}
	if _, _, err := LoadArgs([]string{"--grpc-unix", "", "--grpc-tcp", ""}, func(string) string { return "" }); err == nil {
		t.Fatal("no gRPC listener accepted")
	}
	for _, v := range []string{"forkfleet", "/", ""} {
		os.WriteFile(f, []byte("[containerd]\ncgroup_parent = \""+v+"\"\n"), 0o600)
		if _, _, err := LoadArgs([]string{"--config", f}, func(string) string { return "" }); err == nil {
			t.Fatalf("containerd.cgroup_parent %q accepted", v)
		}
	}
}

func TestBootPrecreate(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(f, []byte("[boot]\nprecreate = 3\n"), 0o600)
	c, _, err := LoadArgs([]string{"--config", f}, func(string) string { return "" })
	if err != nil || c.Boot.Precreate != 3 {
		t.Fatalf("file: %v %v", c, err)
	}
	c, _, err = LoadArgs([]string{"--config", f, "--boot-precreate", "0"}, func(string) string { return "" })
	if err != nil || c.Boot.Precreate != 0 {
		t.Fatalf("flag over file: %v %v", c, err)
	}
}

func TestLimitsConfig(t *testing.T) {
	c := Default()
	h := c.HostLimits(24 << 30)
	if h.Default.GetMemoryBytes() != 1<<30 || h.Default.GetDiskBytes() != 4<<30 || h.Default.GetLogBytes() != 8<<20 ||
		h.Default.GetPidsMax() != 2048 || h.Default.GetCpuWeight() != 100 || h.Max.GetMemoryBytes() != 16<<30 ||
		h.MaxSandboxes != 128 || h.MaxMemoryBytes != 48<<30 {
		t.Fatalf("host limits %+v", h)
	}
	f := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(f, []byte("[limits]\nmemory = \"512MiB\"\n[limits.max]\ndisk = \"1TiB\"\n[admission]\nmax_memory = \"20GiB\"\n"), 0o600)
	c, _, err := LoadArgs([]string{"--config", f}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	h = c.HostLimits(24 << 30)
	if h.Default.GetMemoryBytes() != 512<<20 || h.Max.GetDiskBytes() != 1<<40 || h.MaxMemoryBytes != 20<<30 || h.Default.GetPidsMax() != 2048 {
		t.Fatalf("from file %+v", h)
	}
	out, _ := c.Marshal()
	if !strings.Contains(string(out), "memory = '512MiB'") || !strings.Contains(string(out), "max_memory = '20GiB'") {
		t.Fatalf("marshal: %s", out)
	}
	for _, bad := range []string{
		"[limits]\nmemory = \"1G\"\n",        // unit
		"[limits]\ndisk = \"-1GiB\"\n",       // sign
		"[limits]\npids = 10\n",              // below the floor
		"[limits]\nlog = \"1GiB\"\n",         // above the maximum
		"[admission]\nmax_memory = \"0%\"\n", // no room
		"[admission]\nmax_sandboxes = 0\n",   // no room
	} {
		os.WriteFile(f, []byte(bad), 0o600)
		if _, _, err := LoadArgs([]string{"--config", f}, func(string) string { return "" }); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if ram, err := HostRAM(); err != nil || ram < 64<<20 {
		t.Fatalf("HostRAM = %d, %v", ram, err)
	}
}

// The standard OTEL_* variables configure traces over the file (the
// signal's own variable first); OTEL_TRACES_EXPORTER=none and
// OTEL_SDK_DISABLED turn them off.
func TestOTelEnvironment(t *testing.T) {
	load := func(env map[string]string) (*Config, error) {
		c, _, err := LoadArgs(nil, func(k string) string { return env[k] })
		return c, err
	}
	c, err := load(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://general:4318",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL":        "http/protobuf",
		"OTEL_EXPORTER_OTLP_INSECURE":        "true",
		"OTEL_SERVICE_NAME":                  "controld-eu1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if tr := c.Tracing; tr.OTLPEndpoint != "https://traces:4318" || tr.OTLPProtocol != "http/protobuf" || !tr.OTLPInsecure || tr.ServiceName != "controld-eu1" {
		t.Fatalf("tracing %+v", tr)
	}
	if d := Default().Tracing; d.OTLPInsecure || d.OTLPEndpoint != "" || d.OTLPProtocol != "grpc" {
		t.Fatalf("defaults %+v: plaintext must be asked for", d)
	}
	for _, off := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_SDK_DISABLED": "true"},
	} {
		if c, err := load(off); err != nil || c.Tracing.OTLPEndpoint != "" {
			t.Errorf("%v: endpoint %q, %v", off, c.Tracing.OTLPEndpoint, err)
		}
	}
	for _, bad := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"},
		{"OTEL_EXPORTER_OTLP_INSECURE": "maybe"},
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://collector"},
	} {
		if _, err := load(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
