//go:build linux

package suites

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/suite"
)

// ensurePeerTools installs, with apt, the Debian packages of peer binaries
// that are absent (bin -> package). It returns the binaries still missing;
// each is recorded as a note so the absent peer rows are explained.
func ensurePeerTools(ctx context.Context, env *suite.Env, want map[string]string) map[string]bool {
	missing := map[string]bool{}
	pkgs := map[string]bool{}
	for bin, pkg := range want {
		if _, err := exec.LookPath(bin); err != nil {
			missing[bin] = true
			pkgs[pkg] = true
		}
	}
	if len(pkgs) == 0 {
		return missing
	}
	var list []string
	for p := range pkgs {
		list = append(list, p)
	}
	if os.Geteuid() != 0 {
		env.Notef("peer packages %s absent and benchd is not root: those peer rows are not measured", strings.Join(list, ", "))
		return missing
	}
	env.Progressf("installing peer packages with apt: %s", strings.Join(list, " "))
	// Another process may hold the dpkg lock for a while: retry.
	for attempt := 0; attempt < 10; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		cmd := exec.CommandContext(actx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, list...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "lock") || ctx.Err() != nil {
			env.Notef("apt-get install %s failed: %v", strings.Join(list, " "), err)
			break
		}
		time.Sleep(15 * time.Second)
	}
	for bin := range missing {
		if _, err := exec.LookPath(bin); err == nil {
			delete(missing, bin)
		} else {
			env.Notef("peer %s unavailable: its rows are not measured", bin)
		}
	}
	return missing
}
