// Package hostinfo fingerprints the machine and the build a result was
// measured with, so divergent reruns can be told apart.
package hostinfo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// HostEnvPath holds the host's provisioning facts (KEY=VALUE lines).
const HostEnvPath = "/etc/forkfleet/host.env"

// Collect reads the host fingerprint. Missing sources leave fields empty
// rather than failing: a fingerprint is evidence, not a prerequisite.
func Collect(ctx context.Context) result.Host {
	h := result.Host{Cores: runtime.NumCPU(), HostEnv: map[string]string{}}
	h.Hostname, _ = os.Hostname()
	h.CPUModel, h.MHz = CPU()
	h.MemoryBytes = memTotal()
	h.Kernel = readTrim("/proc/sys/kernel/osrelease")
	h.DebianVersion = readTrim("/etc/debian_version")
	if env, err := ParseEnvFile(HostEnvPath); err == nil {
		h.HostEnv = env
	}
	h.ContainerdVersion = versionOf(ctx, "containerd", "--version")
	h.RuncVersion = versionOf(ctx, "runc", "--version")
	h.CRIUVersion = versionOf(ctx, CRIUBinary(), "--version")
	h.Hypervisor = Hypervisor()
	h.PageTouchNs = PageTouchNs()
	h.LoadBefore = LoadAvg()
	return h
}

// CRIUBinary is the criu the project uses: /usr/local/sbin/criu (the pinned
// 4.x) when present, else whatever PATH has.
func CRIUBinary() string {
	if _, err := os.Stat("/usr/local/sbin/criu"); err == nil {
		return "/usr/local/sbin/criu"
	}
	return "criu"
}

// CPU returns the model name and the mean current MHz over all cores.
func CPU() (model string, mhz float64) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "", 0
	}
	defer f.Close()
	var sum float64
	var n int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "model name":
			model = v
		case "cpu MHz":
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				sum += x
				n++
			}
		}
	}
	if n > 0 {
		mhz = sum / float64(n)
	}
	return model, mhz
}

func memTotal() uint64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// LoadAvg returns the 1, 5 and 15 minute load averages.
func LoadAvg() [3]float64 {
	var out [3]float64
	f := strings.Fields(readTrim("/proc/loadavg"))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return out
}

// ParseEnvFile reads KEY=VALUE lines (shell-style quotes stripped, comments
// and blank lines ignored).
func ParseEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		out[strings.TrimSpace(k)] = v
	}
	return out, nil
}

func versionOf(ctx context.Context, bin string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

func readTrim(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// Build identifies the code under test: the git commit of the repository
// containing dir, whether the work tree is dirty, and the running binary.
func Build(ctx context.Context, dir string) result.Build {
	b := result.Build{Commit: "none", GoVersion: runtime.Version()}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "HEAD").Output(); err == nil {
		b.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", dir, "status", "--porcelain").Output(); err == nil {
		b.Dirty = len(bytes.TrimSpace(out)) > 0
	}
	if exe, err := os.Executable(); err == nil {
		if f, err := os.Open(exe); err == nil {
			hsh := sha256.New()
			if _, err := io.Copy(hsh, f); err == nil {
				b.ExecutableSHA256 = hex.EncodeToString(hsh.Sum(nil))
			}
			f.Close()
		}
	}
	return b
}
