//go:build linux

package containerdrt

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	criuseccomp "github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/oci"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// A memory-tier restore recreates processes as CRIU dumped them: their
// credentials (capability sets) and seccomp filters come from the images,
// not from the OCI spec (runc applies neither on restore). The host's spec
// is rebuilt for every restore, but an imported checkpoint's images are
// whatever their writer wanted, so ImportCheckpoint checks them against
// this host's policy before anything is restored:
//
//   - every thread's capability sets (permitted, effective, inheritable,
//     bounding) lie within the bounding set this host gives sandboxes;
//   - every thread runs under seccomp filter mode, and the first filter of
//     its chain (the one runc installed; later ones only restrict further,
//     the kernel applying every filter of the chain) is one this host
//     installs: the filters found in this host's own memory checkpoints,
//     kept in <StateDir>/seccomp-roots.v2. With none known yet, import takes
//     a throwaway checkpoint of a sandbox of the base image to learn it.
//
// Libseccomp compiles the same profile to the same program, and runc puts
// a stub in front whose order varies run to run (filterDigest leaves it
// out), so checkpoints exported by hosts with the same runtime pass; others
// are refused with CHECKPOINT_POLICY.

// Limits on the images read here: they come from another host.
const (
	maxPolicyImageBytes = 4 << 20
	maxPolicyThreads    = 1 << 16
)

// seccompRootsFile keeps the digests (filterDigest); v2 leaves runc's stub
// out, so a v1 file is not read.
const seccompRootsFile = "seccomp-roots.v2"

// processPolicy is what a restored process may hold on this host.
type processPolicy struct {
	caps  uint64          // bounding set of the host's sandbox spec
	roots map[string]bool // sha256 of the first seccomp filters the host installs
	// userns: the host runs sandboxes in user namespaces of their own, and
	// so must the images (CRIU makes the one the images say, and the host's
	// sandboxes without one otherwise run in the host's).
	userns bool
}

// seccompRoots is the set of first seccomp filters this host's sandboxes
// run under, learned from its own dumps and persisted.
type seccompRoots struct {
	mu    sync.Mutex
	path  string
	known map[string]bool
}

func loadSeccompRoots(path string) *seccompRoots {
	s := &seccompRoots{path: path, known: map[string]bool{}}
	b, err := os.ReadFile(path)
	if err != nil {
		return s
	}
	for _, l := range strings.Fields(string(b)) {
		if len(l) == sha256.Size*2 {
			s.known[l] = true
		}
	}
	return s
}

func (s *seccompRoots) snapshot() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.known))
	for k := range s.known {
		out[k] = true
	}
	return out
}

// learn adds the first filters of a dump this host made (trusted) and
// persists the set when it grew.
func (s *seccompRoots) learn(imageDir string) error {
	filters, err := readSeccompFilters(imageDir)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	grew := false
	for _, f := range filters {
		if f.Prev == nil {
			if d := filterDigest(f); !s.known[d] {
				s.known[d] = true
				grew = true
			}
		}
	}
	if !grew {
		return nil
	}
	lines := slices.Sorted(func(yield func(string) bool) {
		for k := range s.known {
			if !yield(k) {
				return
			}
		}
	})
	return atomicfile.Write(s.path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// filterDigest names a filter program by what it lets through: the sha256
// of the program after runc's ENOSYS stub (see enosysStubLen).
func filterDigest(f *criuseccomp.SeccompFilter) string {
	prog := f.GetFilter()
	sum := sha256.Sum256(prog[enosysStubLen(prog)*bpfInsnSize:])
	return hex.EncodeToString(sum[:])
}

// Classic BPF as seccomp runs it (linux/filter.h, linux/seccomp.h).
const (
	bpfInsnSize   = 8 // struct sock_filter: code u16, jt u8, jf u8, k u32
	bpfLdWAbs     = 0x20
	bpfClassMask  = 0x07
	bpfJmp        = 0x05
	bpfOpMask     = 0xf0
	bpfSrcX       = 0x08
	bpfJA         = 0x00
	bpfRetK       = 0x06
	seccompENOSYS = 0x00050000 | 38 // SECCOMP_RET_ERRNO | ENOSYS
)

// enosysStubLen is the number of instructions of the stub runc puts before
// libseccomp's program (it answers ENOSYS to syscalls newer than the
// profile), 0 when prog does not start with one. runc orders the stub's
// per-architecture blocks by a Go map walk, so one profile gives programs
// that differ only there, run to run. Leaving the stub out of the digest is
// sound for any prefix accepted here: loads of seccomp_data, forward jumps
// that stay inside it or land just past it, and one ENOSYS return at its
// end. Such a prefix can only refuse a call or hand it, registers holding
// nothing but a load, to the rest of the program, which the digest covers.
func enosysStubLen(prog []byte) int {
	n := len(prog) / bpfInsnSize
	insn := func(i int) (code uint16, jt, jf int, k uint32) {
		in := prog[i*bpfInsnSize:]
		return binary.LittleEndian.Uint16(in), int(in[2]), int(in[3]), binary.LittleEndian.Uint32(in[4:])
	}
	end := 0 // the first return, which must be the stub's ENOSYS
	for ; end < n; end++ {
		if code, _, _, _ := insn(end); code&bpfClassMask == bpfRetK {
			break
		}
	}
	if end == n {
		return 0
	}
	if code, _, _, k := insn(end); code != bpfRetK || k != seccompENOSYS {
		return 0
	}
	for i := 0; i < end; i++ {
		code, jt, jf, k := insn(i)
		switch {
		case code == bpfLdWAbs:
		case code&bpfClassMask == bpfJmp && code&bpfSrcX == 0:
			far := max(jt, jf)
			if code&bpfOpMask == bpfJA {
				far = int(k)
			}
			if i+1+far > end+1 {
				return 0
			}
		default:
			return 0
		}
	}
	return end + 1
}

// checkProcessState refuses CRIU images whose threads would hold more than
// pol allows once restored.
func checkProcessState(imageDir string, pol processPolicy) error {
	if _, err := checkImagesLayout(imageDir, pol.userns); err != nil {
		return err
	}
	filters, err := readSeccompFilters(imageDir)
	if err != nil {
		return err
	}
	cores, err := filepath.Glob(filepath.Join(imageDir, "core-*.img"))
	if err != nil {
		return err
	}
	if len(cores) == 0 {
		return policyErr("no process in the CRIU images")
	}
	if len(cores) > maxPolicyThreads {
		return policyErr("%d threads in the CRIU images", len(cores))
	}
	// Credentials in images of their own (CRIU before 1.x) would bypass
	// the per-thread ones checked here.
	if legacy, _ := filepath.Glob(filepath.Join(imageDir, "creds-*.img")); len(legacy) > 0 {
		return policyErr("legacy credential images (%s)", filepath.Base(legacy[0]))
	}
	allowed, _ := cap.FromBitmap(pol.caps)
	for _, path := range cores {
		var core criucore.CoreEntry
		if err := readSingleEntry(path, magic.LoadMagic().ByName["CORE"], &core); err != nil {
			return err
		}
		tc := core.GetThreadCore()
		cr := tc.GetCreds()
		if cr == nil {
			return policyErr("%s: a thread without credentials", filepath.Base(path))
		}
		for name, set := range map[string][]uint32{"permitted": cr.GetCapPrm(), "effective": cr.GetCapEff(),
			"inheritable": cr.GetCapInh(), "bounding": cr.GetCapBnd()} {
			if extra := capBits(set) &^ pol.caps; extra != 0 {
				names, unknown := cap.FromBitmap(extra)
				return policyErr("%s: %s capabilities %v%v beyond this host's sandbox set %v",
					filepath.Base(path), name, names, unknownCaps(unknown), allowed)
			}
		}
		// A process's main thread records its seccomp state; its other
		// threads only when it differs (CRIU gives them the main thread's
		// otherwise, as the kernel did at clone).
		leader := core.GetTc() != nil
		if tc.SeccompMode == nil && !leader {
			continue
		}
		if old := core.GetTc().OldSeccompMode; old != nil && *old != criucore.SeccompMode_filter {
			return policyErr("%s: a process in seccomp mode %s", filepath.Base(path), *old)
		}
		if tc.GetSeccompMode() != criucore.SeccompMode_filter {
			return policyErr("%s: a thread in seccomp mode %s (this host runs every sandbox process under its filter)",
				filepath.Base(path), tc.GetSeccompMode())
		}
		if tc.SeccompFilter == nil {
			return policyErr("%s: a thread in seccomp filter mode without a filter", filepath.Base(path))
		}
		root, err := rootFilter(filters, tc.GetSeccompFilter())
		if err != nil {
			return policyErr("%s: %v", filepath.Base(path), err)
		}
		if !pol.roots[filterDigest(root)] {
			return policyErr("%s: a seccomp filter this host does not install (another runtime or policy wrote the checkpoint)", filepath.Base(path))
		}
	}
	return nil
}

func unknownCaps(u []int) string {
	if len(u) == 0 {
		return ""
	}
	return fmt.Sprintf(" and unknown numbers %v", u)
}

func capBits(words []uint32) uint64 {
	var v uint64
	for i, w := range words {
		if i < 2 {
			v |= uint64(w) << (32 * i)
		} else if w != 0 {
			v |= 1 << 63 // beyond 64 capabilities: never allowed
		}
	}
	return v
}

// rootFilter walks a thread's filter chain (indexes into seccomp.img's
// filters: the thread's last filter, then each one's prev until one has
// none) to its first filter.
func rootFilter(filters []*criuseccomp.SeccompFilter, idx uint32) (*criuseccomp.SeccompFilter, error) {
	for range len(filters) + 1 {
		if int(idx) >= len(filters) {
			return nil, fmt.Errorf("seccomp filter %d of %d", idx, len(filters))
		}
		f := filters[idx]
		if f.Prev == nil {
			return f, nil
		}
		idx = f.GetPrev()
	}
	return nil, errors.New("seccomp filter chain loops")
}

func readSeccompFilters(imageDir string) ([]*criuseccomp.SeccompFilter, error) {
	var e criuseccomp.SeccompEntry
	path := filepath.Join(imageDir, "seccomp.img")
	if err := readSingleEntry(path, magic.LoadMagic().ByName["SECCOMP"], &e); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return e.GetSeccompFilters(), nil
}

// readSingleEntry decodes a CRIU image holding one protobuf entry: a magic
// (after the common one), then a 32-bit size and the entry. Sizes are
// bounded: the file may come from another host.
func readSingleEntry(path string, wantMagic uint64, m proto.Message) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() > maxPolicyImageBytes {
		return policyErr("%s: not a regular file of at most %d bytes", filepath.Base(path), maxPolicyImageBytes)
	}
	br := bufio.NewReader(f)
	word := func() (uint32, error) {
		var b [4]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, err
		}
		return binary.LittleEndian.Uint32(b[:]), nil
	}
	mg, err := word()
	if err != nil {
		return policyErr("%s: %v", filepath.Base(path), err)
	}
	if uint64(mg) == magic.LoadMagic().ByName["IMG_COMMON"] || uint64(mg) == magic.LoadMagic().ByName["IMG_SERVICE"] {
		if mg, err = word(); err != nil {
			return policyErr("%s: %v", filepath.Base(path), err)
		}
	}
	if uint64(mg) != wantMagic {
		return policyErr("%s: magic %#x, want %#x", filepath.Base(path), mg, wantMagic)
	}
	n, err := word()
	if err != nil {
		return policyErr("%s: %v", filepath.Base(path), err)
	}
	if int64(n) > st.Size() {
		return policyErr("%s: entry of %d bytes in a file of %d", filepath.Base(path), n, st.Size())
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		return policyErr("%s: %v", filepath.Base(path), err)
	}
	if err := proto.Unmarshal(buf, m); err != nil {
		return policyErr("%s: %v", filepath.Base(path), err)
	}
	return nil
}

func policyErr(format string, args ...any) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_POLICY",
		"the checkpoint's processes would hold more than this host allows: %s", fmt.Sprintf(format, args...))
}

// processPolicy returns this host's policy for restored processes of
// image, learning the seccomp filter it installs first when it knows none.
func (r *Runtime) processPolicy(ctx context.Context, image string) (processPolicy, error) {
	img, err := r.image(ctx, image)
	if err != nil {
		return processPolicy{}, err
	}
	proc, err := r.imageProcess(ctx, img)
	if err != nil {
		return processPolicy{}, err
	}
	s, err := oci.GenerateSpec(ctx, r.client, &containers.Container{ID: "forkfleet-policy"},
		r.sandboxSpecOpts(withImageProcess(proc), runtime.BootSpec{ID: "forkfleet-policy"}, nil, network.Sandbox{}, nil, runLayoutRootfs)...)
	if err != nil {
		return processPolicy{}, fmt.Errorf("host policy: %w: %w", errdefs.ErrInternal, err)
	}
	var caps uint64
	for _, name := range s.Process.Capabilities.Bounding {
		if i := slices.Index(cap.Known(), name); i >= 0 {
			caps |= 1 << i
		}
	}
	pol := processPolicy{caps: caps, roots: r.seccomp.snapshot(), userns: r.cfg.UserNamespaces != nil}
	if len(pol.roots) == 0 {
		if err := r.learnSeccomp(ctx, image); err != nil {
			return processPolicy{}, fmt.Errorf("learn this host's seccomp filter: %w", err)
		}
		pol.roots = r.seccomp.snapshot()
	}
	return pol, nil
}

// learnSeccomp boots a throwaway sandbox of image, dumps it and learns the
// seccomp filter this host installs from its images.
func (r *Runtime) learnSeccomp(ctx context.Context, image string) error {
	id := "forkfleet-policy-" + randomHex(6)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := r.Boot(ctx, runtime.BootSpec{ID: id, Image: image, ACIToken: randomHex(16), AdminToken: randomHex(16)}); err != nil {
		return err
	}
	defer r.Delete(context.WithoutCancel(ctx), id)
	root := r.cfg.CheckpointRoot
	if root == "" {
		root = r.workDir("")
	}
	dir := filepath.Join(root, ".policy-"+id)
	// The sandbox is dumped as soon as it boots, while its desktop still
	// starts: a process caught in uninterruptible sleep (exec, page-in)
	// cannot be seized and fails the dump, once in a fresh-clone CI run.
	// A failed checkpoint leaves the throwaway sandbox running, so the
	// dump is tried again while ctx lasts.
	var res runtime.CheckpointResult
	var err error
	for attempt := 0; ; attempt++ {
		res, err = r.Checkpoint(ctx, id, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory, Stop: true})
		if err == nil || attempt == 2 || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err != nil {
		return err
	}
	defer r.DeleteCheckpoint(context.WithoutCancel(ctx), res.Ref)
	// Checkpoint learned the filter already; an empty set means the
	// sandbox ran without one.
	if len(r.seccomp.snapshot()) == 0 {
		return fmt.Errorf("%w: a sandbox of %s dumped without a seccomp filter", errdefs.ErrInternal, image)
	}
	return nil
}
