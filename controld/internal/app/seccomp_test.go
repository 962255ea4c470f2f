package app_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// systemd's seccomp-based hardening settings, as systemd 252 (Debian 12's;
// src/shared/seccomp-util.c) installs them on x86-64. These hosts have no
// systemd as PID 1, so TestRealStackUnitHardening installs the same
// filters itself (seccompExec) and runs controld, and with it every CRIU
// dump it makes, under them: each breaks a dump, so the unit has none.
//
// Each is a list of rules: a system call and conditions on its arguments
// that all hold -> EPERM.
var seccompSettings = map[string][]seccompRule{
	// Any personality() but the one the service starts with (PER_LINUX).
	"LockPersonality": {{nr: unix.SYS_PERSONALITY, conds: []argCond{ne(0, 0)}}},
	// sched_setscheduler to a policy other than OTHER (0), BATCH (3) and
	// IDLE (5): FIFO, RR, 4, and everything above 5 (DEADLINE, or any
	// policy with SCHED_RESET_ON_FORK).
	"RestrictRealtime": {
		{nr: unix.SYS_SCHED_SETSCHEDULER, conds: []argCond{eq(1, 1)}},
		{nr: unix.SYS_SCHED_SETSCHEDULER, conds: []argCond{eq(1, 2)}},
		{nr: unix.SYS_SCHED_SETSCHEDULER, conds: []argCond{eq(1, 4)}},
		{nr: unix.SYS_SCHED_SETSCHEDULER, conds: []argCond{gt(1, 5)}},
	},
	// No mapping both writable and executable, none made executable later.
	"MemoryDenyWriteExecute": {
		{nr: unix.SYS_MMAP, conds: []argCond{maskedEq(2, unix.PROT_EXEC|unix.PROT_WRITE, unix.PROT_EXEC|unix.PROT_WRITE)}},
		{nr: unix.SYS_MPROTECT, conds: []argCond{maskedEq(2, unix.PROT_EXEC, unix.PROT_EXEC)}},
		{nr: unix.SYS_PKEY_MPROTECT, conds: []argCond{maskedEq(2, unix.PROT_EXEC, unix.PROT_EXEC)}},
		{nr: unix.SYS_SHMAT, conds: []argCond{maskedEq(2, shmExec, shmExec)}},
	},
	// No file or directory made setuid or setgid; openat2 refused
	// whole (its mode is behind a pointer).
	"RestrictSUIDSGID": restrictSUIDSGID(),
}

func restrictSUIDSGID() []seccompRule {
	rules := []seccompRule{{nr: unix.SYS_OPENAT2}}
	for _, m := range []uint64{unix.S_ISUID, unix.S_ISGID} {
		rules = append(rules,
			seccompRule{nr: unix.SYS_CHMOD, conds: []argCond{maskedEq(1, m, m)}},
			seccompRule{nr: unix.SYS_FCHMOD, conds: []argCond{maskedEq(1, m, m)}},
			seccompRule{nr: unix.SYS_FCHMODAT, conds: []argCond{maskedEq(2, m, m)}},
			seccompRule{nr: unix.SYS_MKDIR, conds: []argCond{maskedEq(1, m, m)}},
			seccompRule{nr: unix.SYS_MKDIRAT, conds: []argCond{maskedEq(2, m, m)}},
			seccompRule{nr: unix.SYS_MKNOD, conds: []argCond{maskedEq(1, m, m)}},
			seccompRule{nr: unix.SYS_MKNODAT, conds: []argCond{maskedEq(2, m, m)}},
			seccompRule{nr: unix.SYS_OPEN, conds: []argCond{maskedEq(1, unix.O_CREAT, unix.O_CREAT), maskedEq(2, m, m)}},
			seccompRule{nr: unix.SYS_OPENAT, conds: []argCond{maskedEq(2, unix.O_CREAT, unix.O_CREAT), maskedEq(3, m, m)}},
			seccompRule{nr: unix.SYS_CREAT, conds: []argCond{maskedEq(1, m, m)}},
		)
	}
	return rules
}

// SystemCallArchitectures=native is not a rule list: it kills a process
// making a system call of another ABI (i386, x32).
const archNative = "SystemCallArchitectures"

type seccompRule struct {
	nr    uint32
	conds []argCond
}

// argCond emits BPF that jumps to pass or fail, by label.
type argCond func(a *bpfAsm, pass, fail string)

const seccompDataArgs = 16 // offsetof(struct seccomp_data, args)

// shmExec is SHM_EXEC (linux/shm.h), which x/sys/unix lacks.
const shmExec = 0o100000

func argLo(i int) uint32 { return uint32(seccompDataArgs + 8*i) }
func argHi(i int) uint32 { return uint32(seccompDataArgs + 8*i + 4) }

// maskedEq: (arg & mask) == val, on the low word (masks here have no high
// bits).
func maskedEq(i int, mask, val uint64) argCond {
	return func(a *bpfAsm, pass, fail string) {
		a.ld(argLo(i))
		a.op(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, uint32(mask))
		a.jmp(unix.BPF_JEQ, uint32(val), pass, fail)
	}
}

// eq: arg == v, as 64 bits.
func eq(i int, v uint64) argCond {
	return func(a *bpfAsm, pass, fail string) {
		lo := a.label()
		a.ld(argHi(i))
		a.jmp(unix.BPF_JEQ, uint32(v>>32), lo, fail)
		a.at(lo)
		a.ld(argLo(i))
		a.jmp(unix.BPF_JEQ, uint32(v), pass, fail)
	}
}

// ne: arg != v, as 64 bits.
func ne(i int, v uint64) argCond {
	return func(a *bpfAsm, pass, fail string) { eq(i, v)(a, fail, pass) }
}

// gt: arg > v, unsigned 64 bits.
func gt(i int, v uint64) argCond {
	return func(a *bpfAsm, pass, fail string) {
		hiEq, lo := a.label(), a.label()
		a.ld(argHi(i))
		a.jmp(unix.BPF_JGT, uint32(v>>32), pass, hiEq)
		a.at(hiEq)
		a.jmp(unix.BPF_JEQ, uint32(v>>32), lo, fail)
		a.at(lo)
		a.ld(argLo(i))
		a.jmp(unix.BPF_JGT, uint32(v), pass, fail)
	}
}

// bpfAsm assembles a classic BPF program with jumps to labels.
type bpfAsm struct {
	prog   []unix.SockFilter
	labels map[string]int
	fixups []fixup
	n      int
}

type fixup struct {
	at     int
	jt, jf string
}

func (a *bpfAsm) label() string { a.n++; return fmt.Sprintf("L%d", a.n) }
func (a *bpfAsm) at(l string)   { a.labels[l] = len(a.prog) }
func (a *bpfAsm) op(code uint16, k uint32) {
	a.prog = append(a.prog, unix.SockFilter{Code: code, K: k})
}
func (a *bpfAsm) ld(off uint32) { a.op(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }
func (a *bpfAsm) ret(v uint32)  { a.op(unix.BPF_RET|unix.BPF_K, v) }
func (a *bpfAsm) jmp(cmp uint16, k uint32, jt, jf string) {
	a.fixups = append(a.fixups, fixup{len(a.prog), jt, jf})
	a.op(unix.BPF_JMP|cmp|unix.BPF_K, k)
}

func (a *bpfAsm) resolve() ([]unix.SockFilter, error) {
	for _, f := range a.fixups {
		for _, j := range []struct {
			label string
			dst   *uint8
		}{{f.jt, &a.prog[f.at].Jt}, {f.jf, &a.prog[f.at].Jf}} {
			to, ok := a.labels[j.label]
			if !ok {
				return nil, fmt.Errorf("seccomp: no label %q", j.label)
			}
			off := to - f.at - 1
			if off < 0 || off > 255 {
				return nil, fmt.Errorf("seccomp: jump of %d", off)
			}
			*j.dst = uint8(off)
		}
	}
	return a.prog, nil
}

// seccompProgram builds one filter for the named settings.
func seccompProgram(settings []string) ([]unix.SockFilter, error) {
	a := &bpfAsm{labels: map[string]int{}}
	const offNr, offArch = 0, 4
	other := a.label()
	a.ld(offArch)
	native := a.label()
	a.jmp(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, native, other)
	a.at(native)
	a.ld(offNr)
	if slices.Contains(settings, archNative) {
		// x32 calls come with the x86-64 arch and __X32_SYSCALL_BIT.
		x32, ok := a.label(), a.label()
		a.jmp(unix.BPF_JGE, 0x40000000, x32, ok)
		a.at(x32)
		a.ret(unix.SECCOMP_RET_KILL_PROCESS)
		a.at(ok)
	}
	for _, s := range settings {
		if s == archNative {
			continue
		}
		rules, ok := seccompSettings[s]
		if !ok {
			return nil, fmt.Errorf("seccomp: no filter for %s", s)
		}
		for _, r := range rules {
			next := a.label()
			conds := a.label()
			a.ld(offNr)
			a.jmp(unix.BPF_JEQ, r.nr, conds, next)
			a.at(conds)
			for _, c := range r.conds {
				pass := a.label()
				c(a, pass, next)
				a.at(pass)
			}
			a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
			a.at(next)
		}
	}
	a.ret(unix.SECCOMP_RET_ALLOW)
	a.at(other)
	if slices.Contains(settings, archNative) {
		a.ret(unix.SECCOMP_RET_KILL_PROCESS)
	} else {
		// Without the arch restriction systemd filters the other ABIs
		// alike; controld and CRIU make no call of theirs.
		a.ret(unix.SECCOMP_RET_ALLOW)
	}
	return a.resolve()
}

// envSeccompExec marks this test binary's run as seccompExec's: install
// the settings it names (comma-separated), then exec its arguments.
const envSeccompExec = "FORKFLEET_TEST_SECCOMP_EXEC"

// seccompExec returns the command prefix that runs a program under the
// unit's seccomp settings: this test binary, re-executed (TestMain).
func seccompExec(t *testing.T, settings []string) []string {
	t.Helper()
	if _, err := seccompProgram(settings); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"/usr/bin/env", envSeccompExec + "=" + strings.Join(settings, ","), self}
}

func TestMain(m *testing.M) {
	if settings, ok := os.LookupEnv(envSeccompExec); ok {
		err := installAndExec(strings.Split(settings, ","), os.Args[1:])
		fmt.Fprintf(os.Stderr, "seccomp exec: %v\n", err)
		os.Exit(127)
	}
	os.Exit(m.Run())
}

func installAndExec(settings, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("nothing to exec")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	prog, err := seccompProgram(settings)
	if err != nil {
		return err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envSeccompExec+"=") })
	// The filter is this thread's; execve from the same thread carries it
	// into the program (and every process it starts).
	runtime.LockOSThread()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: unsafe.SliceData(prog)}
	err = unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0)
	if errors.Is(err, unix.EACCES) {
		// Without CAP_SYS_ADMIN (a unit test run as a user) a filter
		// needs no_new_privs, as systemd then implies it.
		if err = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err == nil {
			err = unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0)
		}
	}
	if err != nil {
		return fmt.Errorf("PR_SET_SECCOMP: %w", err)
	}
	return unix.Exec(path, argv, env)
}

// The filters refuse what systemd's refuse, with EPERM, and let the
// rest run: each setting against a command it must refuse and one it
// must not.
func TestSeccompSettings(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/f"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mmapWX := `import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ|mmap.PROT_WRITE|mmap.PROT_EXEC)`
	mmapRX := `import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ|mmap.PROT_EXEC)`
	for _, tc := range []struct {
		setting         string
		refused, passed []string
	}{
		{"RestrictSUIDSGID", []string{"chmod", "u+s", file}, []string{"chmod", "0755", file}},
		{"RestrictSUIDSGID", []string{"mkdir", "-m", "2755", dir + "/sgid"}, []string{"mkdir", "-m", "0755", dir + "/plain"}},
		{"RestrictRealtime", []string{"chrt", "-f", "1", "true"}, []string{"chrt", "-b", "0", "true"}},
		{"LockPersonality", []string{"setarch", "linux32", "true"}, []string{"setarch", "x86_64", "true"}},
		{"MemoryDenyWriteExecute", []string{"python3", "-c", mmapWX}, []string{"python3", "-c", mmapRX}},
	} {
		for _, c := range []struct {
			argv []string
			ok   bool
		}{{tc.refused, false}, {tc.passed, true}} {
			if _, err := exec.LookPath(c.argv[0]); err != nil {
				// python3 comes with `make test` (python-deps).
				if testenv.Enabled() {
					t.Fatalf("%s: %v", c.argv[0], err)
				}
				t.Skipf("%s: %v", c.argv[0], err)
			}
			argv := append(seccompExec(t, []string{tc.setting}), c.argv...)
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			switch {
			case c.ok && err != nil:
				t.Errorf("%s: %v refused: %v %s", tc.setting, c.argv, err, out)
			case !c.ok && err == nil:
				t.Errorf("%s: %v ran", tc.setting, c.argv)
			case !c.ok && !strings.Contains(strings.ToLower(string(out)), "not permitted"):
				t.Errorf("%s: %v failed without EPERM: %v %s", tc.setting, c.argv, err, out)
			}
		}
	}
	if _, err := seccompProgram([]string{archNative, "LockPersonality"}); err != nil {
		t.Error(err)
	}
	if _, err := seccompProgram([]string{"NoSuchSetting"}); err == nil {
		t.Error("an unknown setting assembled")
	}
}
