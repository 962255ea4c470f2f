//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	cerrdefs "github.com/containerd/errdefs"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Snapshot name prefixes that exist only while a Checkpoint, an
// ImportCheckpoint or an ExportCheckpoint call runs (the committed layer of
// a checkpoint is "forkfleet-checkpoint-<hex>" and carries
// snapshotLabelCheckpoint).
var transientSnapshotPrefixes = []string{
	checkpointPreparePrefix,
	"forkfleet-export-view-",
}

// DumpWaitTimeout bounds how long RecoverCheckpoints waits for dumps a
// previous controld left running. A dump of a few hundred MB takes about a
// second; the bound only matters when runc or CRIU hang.
const DumpWaitTimeout = 2 * time.Minute

var _ runtime.CheckpointRecoverer = (*Runtime)(nil)

// RecoverCheckpoints implements runtime.CheckpointRecoverer. A controld killed
// during Checkpoint leaves work that outlives it: its CRIU (or runc and
// CRIU under containerd's shim) finishes the dump (CRIU then restores the
// freezer state it found, FROZEN, since the runtime froze the sandbox
// first), the uncommitted layer stays in containerd (GC-rooted by a label,
// like the empty layer prepared for the next checkpoint), and the dump's
// work directory stays in the state dir. A controld killed between the
// layer's commit and its record leaves a committed, GC-rooted layer nothing
// names. RecoverCheckpoints waits for those dumps (thawing or deleting the
// directory they write into before they end would leave the sandbox frozen
// again or the dump failed half way), then removes the rest. keep names the
// checkpoints controld has records of; their layers stay.
func (r *Runtime) RecoverCheckpoints(ctx context.Context, keep []runtime.CheckpointRef) error {
	ctx = r.ctx(ctx)
	cs, err := r.client.ContainerService().List(ctx, sandboxFilter)
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", convertErr(err))
	}
	ids := make(map[string]bool, len(cs))
	for _, c := range cs {
		ids[c.ID] = true
	}
	r.waitOrphanDumps(ctx, ids, DumpWaitTimeout)
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	if err := r.releaseTransientSnapshots(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := r.releaseUnreferencedLayers(ctx, keep); err != nil {
		errs = append(errs, err)
	}
	if err := r.removeDumpWorkDirs(ids); err != nil {
		errs = append(errs, err)
	}
	if err := r.releaseDevs(ids); err != nil {
		errs = append(errs, err)
	}
	if err := r.removeOrphanLayers(ids); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitOrphanDumps waits until no sandbox in ids is being dumped: no runc
// checkpoint of it runs and no process outside it ptraces its processes
// (CRIU seizes every task it dumps, and restores the freezer state before
// it lets them go). Past timeout it gives up with a warning: the caller's
// thaw may then be undone by the dump's end.
func (r *Runtime) waitOrphanDumps(ctx context.Context, ids map[string]bool, timeout time.Duration) {
	if len(ids) == 0 {
		return
	}
	start := time.Now()
	logged := map[string]bool{}
	for {
		busy := r.dumpsInFlight(ids)
		if len(busy) == 0 {
			if len(logged) > 0 {
				r.log.InfoContext(ctx, "interrupted checkpoint dumps finished", "waited", time.Since(start))
			}
			return
		}
		for id, why := range busy {
			if !logged[id] {
				logged[id] = true
				r.log.WarnContext(ctx, "waiting for a checkpoint dump a previous controld started", "sandbox", id, "evidence", why)
			}
		}
		if time.Since(start) > timeout {
			r.log.ErrorContext(ctx, "checkpoint dumps still running; recovering anyway", "waited", time.Since(start), "sandboxes", len(busy))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// dumpsInFlight returns the sandboxes of ids being dumped, with the
// evidence.
func (r *Runtime) dumpsInFlight(ids map[string]bool) map[string]string {
	busy := map[string]string{}
	for pid, argv := range processArgs() {
		if id, ok := runcCheckpointOf(argv, filepath.Base(r.cfg.RuncBinary)); ok && ids[id] {
			busy[id] = "runc checkpoint pid " + strconv.Itoa(pid)
		}
	}
	for id := range ids {
		if _, ok := busy[id]; ok {
			continue
		}
		if tracer, ok := tracedFromOutside(r.procsFile(id)); ok {
			busy[id] = "traced by pid " + strconv.Itoa(tracer)
		}
	}
	return busy
}

// runcCheckpointOf reports whether argv is `runc [global flags] checkpoint
// [flags] <id>` and returns the id.
func runcCheckpointOf(argv []string, runc string) (string, bool) {
	if len(argv) < 3 || filepath.Base(argv[0]) != runc {
		return "", false
	}
	for _, a := range argv[1 : len(argv)-1] {
		if a == "checkpoint" {
			return argv[len(argv)-1], true
		}
	}
	return "", false
}

// processArgs returns every process's argv by pid (processes that vanish
// while being read are skipped).
func processArgs() map[int][]string {
	out := map[int][]string{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		out[pid] = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	return out
}

// tracedFromOutside reports a tracer of any process listed in procs (a
// cgroup.procs file) that is not itself listed: a debugger inside the
// sandbox does not count.
func tracedFromOutside(procs string) (int, bool) {
	b, err := os.ReadFile(procs)
	if err != nil {
		return 0, false
	}
	members := map[int]bool{}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			members[pid] = true
		}
	}
	for pid := range members {
		tracer := tracerPid(pid)
		if tracer != 0 && !members[tracer] {
			return tracer, true
		}
	}
	return 0, false
}

func tracerPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("TracerPid:")); ok {
			n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
			return n
		}
	}
	return 0
}

// releaseTransientSnapshots removes the snapshots only an in-flight call
// holds, and the leases that hold them. Called when no call is in flight.
func (r *Runtime) releaseTransientSnapshots(ctx context.Context) error {
	var names []string
	if err := r.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if isTransientSnapshot(info.Name) {
			names = append(names, info.Name)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("walk snapshots: %w", convertErr(err))
	}
	var errs []error
	ls := r.client.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return fmt.Errorf("list leases: %w", convertErr(err))
	}
	snapType := "snapshots/" + r.cfg.Snapshotter
	for _, l := range all {
		res, err := ls.ListResources(ctx, l)
		if err != nil {
			if !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("lease %s: %w", l.ID, convertErr(err)))
			}
			continue
		}
		for _, rs := range res {
			if rs.Type == snapType && isTransientSnapshot(rs.ID) {
				r.log.WarnContext(ctx, "releasing the lease of an interrupted checkpoint", "lease", l.ID, "snapshot", rs.ID)
				if err := ls.Delete(ctx, leases.Lease{ID: l.ID}); err != nil && !cerrdefs.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete lease %s: %w", l.ID, convertErr(err)))
				}
				break
			}
		}
	}
	for _, n := range names {
		r.log.WarnContext(ctx, "removing the layer of an interrupted checkpoint", "snapshot", n)
		if err := r.sn.Remove(ctx, n); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove snapshot %s: %w", n, convertErr(err)))
		}
	}
	return errors.Join(errs...)
}

func isTransientSnapshot(name string) bool {
	for _, p := range transientSnapshotPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// releaseUnreferencedLayers releases committed checkpoint layers (still
// marked as a checkpoint's) that no kept ref names: a checkpoint committed
// in the runtime whose record was never written.
func (r *Runtime) releaseUnreferencedLayers(ctx context.Context, keep []runtime.CheckpointRef) error {
	kept := make(map[string]bool, len(keep))
	for _, k := range keep {
		if k.Snapshot != "" {
			kept[k.Snapshot] = true
		}
	}
	var orphans []string
	if err := r.sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindCommitted && info.Labels[snapshotLabelCheckpoint] != "" && !kept[info.Name] {
			orphans = append(orphans, info.Name)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("walk snapshots: %w", convertErr(err))
	}
	var errs []error
	for _, n := range orphans {
		r.log.WarnContext(ctx, "releasing a checkpoint layer no checkpoint names", "snapshot", n)
		if _, err := r.sn.Update(ctx, snapshots.Info{Name: n, Labels: map[string]string{}},
			"labels."+snapshotLabelGCRoot, "labels."+snapshotLabelCheckpoint); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("checkpoint layer %s: %w", n, convertErr(err)))
			continue
		}
		// With children (never, for a layer without a record) it goes with
		// the last of them, like a deleted checkpoint's.
		if err := r.sn.Remove(ctx, n); err != nil && !cerrdefs.IsNotFound(err) &&
			!cerrdefs.IsFailedPrecondition(err) && !cerrdefs.IsConflict(err) {
			errs = append(errs, fmt.Errorf("checkpoint layer %s: %w", n, convertErr(err)))
		}
	}
	return errors.Join(errs...)
}

// removeDumpWorkDirs removes the CRIU work directories of dumps of the
// sandboxes in ids (named <id>-dump-<hex> by dump). The state dir may be
// shared by several controlds: only these sandboxes' are ours.
func (r *Runtime) removeDumpWorkDirs(ids map[string]bool) error {
	dir := filepath.Join(r.cfg.StateDir, "work")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		id, _, ok := strings.Cut(e.Name(), "-dump-")
		if !ok || !ids[id] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
