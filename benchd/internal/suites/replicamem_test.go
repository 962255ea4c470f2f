package suites

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadProcMemory reads a process's PSS by kind, its KSM-merged pages and
// the anonymous memory of mappings without KSM advice from a /proc tree.
func TestReadProcMemory(t *testing.T) {
	proc := t.TempDir()
	dir := filepath.Join(proc, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("smaps_rollup", `55d0c0000000-7ffc00000000 ---p 00000000 00:00 0                          [rollup]
Rss:               20480 kB
Pss:               10240 kB
Pss_Dirty:          4096 kB
Pss_Anon:           4096 kB
Pss_File:           2048 kB
Pss_Shmem:          4096 kB
Anonymous:          8192 kB
`)
	write("ksm_merging_pages", "512\n")
	write("smaps", `7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
Anonymous:          3072 kB
KSM:                2048 kB
VmFlags: rd wr mr mw me ac mg
7f0000400000-7f0000500000 rw-p 00000000 00:00 0
Size:               1024 kB
Anonymous:           768 kB
KSM:                   0 kB
VmFlags: rd wr mr mw me ac
7f0000500000-7f0000900000 rw-s 00000000 00:01 5                          /SYSV00000000 (deleted)
Size:               4096 kB
Anonymous:             0 kB
VmFlags: rd wr sh mr mw me ms
`)
	m := readProcMemory(proc, 42)
	page := float64(os.Getpagesize()) / 1024
	want := procMemory{rss: 20480, pss: 10240, pssAnon: 4096, pssFile: 2048, pssShmem: 4096,
		ksmMerged: 512 * page, anonUnadvised: 768, found: true}
	if m != want {
		t.Fatalf("readProcMemory = %+v, want %+v", m, want)
	}
	if m := readProcMemory(proc, 43); m.found {
		t.Fatalf("a process that is gone was found: %+v", m)
	}
}

func TestKSMState(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{"run": "1", "full_scans": "12", "pages_sharing": "256",
		"advisor_mode": "none [scan-time]", "use_zero_pages": "0"} {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := readKSM(dir)
	if err := os.WriteFile(filepath.Join(dir, "full_scans"), []byte("15\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	after := readKSM(dir)
	if got := after.fullScansSince(before); got != 3 {
		t.Fatalf("full scans since = %v, want 3", got)
	}
	s := after.summary()
	for _, want := range []string{"run=1", "advisor=scan-time", "use_zero_pages=0", "full scans 15"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary %q lacks %q", s, want)
		}
	}
	if got := readKSM(filepath.Join(dir, "absent")).summary(); !strings.Contains(got, "no ") {
		t.Errorf("summary without KSM = %q", got)
	}
}
