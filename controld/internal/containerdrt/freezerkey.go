//go:build linux

package containerdrt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
)

// freezerKeyName starts the name of the empty cgroup, beside the
// sandboxes' cgroups under the cgroup parent (v1 freezer hierarchy), that a
// runtime holds FROZEN from New to Close: freezer-key.<pid>.<n>, one per
// runtime. Sandbox ids never take such a name.
const freezerKeyName = "freezer-key"

// freezerKeys numbers this process's runtimes' keys (tests make many).
var freezerKeys atomic.Uint64

// holdFreezerKey freezes an empty cgroup for as long as the runtime runs,
// and returns its directory ("" on a host without the v1 freezer).
//
// The kernel skips its freezing checks while no cgroup is frozen, behind a
// static key (freezer_active), and flips that key by patching its own
// code on every CPU: when the first cgroup of the host starts freezing
// and when the last one thaws. On these VMs each flip took 8 to 12 ms of
// kernel time against 0.02 ms for a freeze or thaw that flips nothing
// (an empty cgroup frozen and thawed, alone and beside another frozen
// one), and it holds the freezer's lock: the claim that thawed a frozen
// pool's last member paid it (a fifth of controld's CPU in a checkpoint
// pool's bursts of 4 and 8, perf), as did the refill's first freeze, and
// every dump's freeze and thaw on a host with nothing else frozen. A
// cgroup frozen without tasks keeps the key on and costs nothing else.
//
// Each runtime holds a key of its own, removed at its Close. With one key
// for the parent, the first of several runtimes sharing a parent to close
// removed the key the others relied on: every controld a real-stack test
// starts with the default parent (/forkfleet) took the shared controld's
// key with it, and its checkpoint pools' bursts of 4 and 8 flipped the
// static key again (perf, 2026-12-02 21:05: a quarter of controld's
// samples in those bursts; pools.md). A controld that crashes leaves its
// key behind: an empty frozen cgroup, which costs nothing but a directory.
func holdFreezerKey(root, parent string) (string, error) {
	hier := filepath.Join(root, "freezer")
	if isCgroupV2(root) {
		return "", nil
	}
	if st, err := os.Stat(hier); err != nil || !st.IsDir() {
		return "", nil
	}
	dir := filepath.Join(hier, parent, fmt.Sprintf("%s.%d.%d", freezerKeyName, os.Getpid(), freezerKeys.Add(1)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("containerdrt: freezer key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(freezerFrozen), 0); err != nil {
		return "", fmt.Errorf("containerdrt: freezer key: %w", err)
	}
	return dir, nil
}

// releaseFreezerKey removes the cgroup holdFreezerKey froze (it has no
// tasks, so it goes frozen).
func releaseFreezerKey(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("containerdrt: freezer key: %w", err)
	}
	return nil
}
