package suites

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// procMemory is one process's (or a sum of processes') memory, in KB:
// what PSS is made of, and what KSM did and could do with it.
type procMemory struct {
	rss, pss                   float64
	pssAnon, pssFile, pssShmem float64
	ksmMerged                  float64 // pages KSM merged (ksm_merging_pages)
	anonUnadvised              float64 // anonymous memory in mappings without VM_MERGEABLE
	found                      bool
}

func (m *procMemory) add(o procMemory) {
	m.rss += o.rss
	m.pss += o.pss
	m.pssAnon += o.pssAnon
	m.pssFile += o.pssFile
	m.pssShmem += o.pssShmem
	m.ksmMerged += o.ksmMerged
	m.anonUnadvised += o.anonUnadvised
	m.found = m.found || o.found
}

// readProcMemory reads pid's smaps_rollup (PSS by kind), ksm_merging_pages
// and smaps (anonymous memory in mappings KSM was not asked to merge: the
// VmFlags lack "mg"). proc is /proc.
func readProcMemory(proc string, pid int) procMemory {
	var m procMemory
	dir := filepath.Join(proc, strconv.Itoa(pid))
	data, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(data), "\n") {
		key, kb, ok := smapsKB(line)
		if !ok {
			continue
		}
		switch key {
		case "Rss":
			m.rss = kb
		case "Pss":
			m.pss, m.found = kb, true
		case "Pss_Anon":
			m.pssAnon = kb
		case "Pss_File":
			m.pssFile = kb
		case "Pss_Shmem":
			m.pssShmem = kb
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "ksm_merging_pages")); err == nil {
		if pages, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil {
			m.ksmMerged = pages * float64(os.Getpagesize()) / 1024
		}
	}
	m.anonUnadvised = unadvisedAnonKB(filepath.Join(dir, "smaps"))
	return m
}

// unadvisedAnonKB sums Anonymous over the mappings of an smaps file whose
// VmFlags lack "mg" (VM_MERGEABLE): memory KSM never looks at.
func unadvisedAnonKB(path string) float64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var total, anon float64
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if key, kb, ok := smapsKB(line); ok {
			if key == "Anonymous" {
				anon = kb
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			if !contains(strings.Fields(rest), "mg") {
				total += anon
			}
			anon = 0
		}
	}
	return total
}

// smapsKB parses "Key:   123 kB".
func smapsKB(line string) (string, float64, bool) {
	key, rest, ok := strings.Cut(line, ":")
	if !ok {
		return "", 0, false
	}
	f := strings.Fields(rest)
	if len(f) != 2 || f[1] != "kB" {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return key, v, err == nil
}

// replicaMem collects per-replica memory rows: PSS and RSS, and with
// detail what the PSS is made of (anonymous, file, shared memory: KSM
// merges only the first), how much of it KSM merged, and how much
// anonymous memory was never advised for merging. Metrics are
// prefix_<kind>suffix, e.g. fork.replica_pss_anon_after_ksm.
type replicaMem struct {
	detail            bool
	pss, rss          *result.Series
	anon, file, shmem *result.Series
	merged, unadvised *result.Series
}

func newReplicaMem(prefix, suffix string, lbl map[string]string, detail bool) *replicaMem {
	s := func(kind string) *result.Series { return result.NewSeries(prefix+"_"+kind+suffix, "MB", lbl) }
	return &replicaMem{detail: detail, pss: s("pss"), rss: s("rss"), anon: s("pss_anon"), file: s("pss_file"),
		shmem: s("pss_shmem"), merged: s("ksm_merged"), unadvised: s("anon_unadvised")}
}

// add reads each replica's processes and returns how many replicas had
// none to read.
func (r *replicaMem) add(ids []string) (missing int) {
	for _, id := range ids {
		var m procMemory
		for _, pid := range sandboxProcs(id) {
			m.add(readProcMemory("/proc", pid))
		}
		if !m.found {
			missing++
			continue
		}
		r.pss.Add(m.pss / 1024)
		r.rss.Add(m.rss / 1024)
		r.anon.Add(m.pssAnon / 1024)
		r.file.Add(m.pssFile / 1024)
		r.shmem.Add(m.pssShmem / 1024)
		r.merged.Add(m.ksmMerged / 1024)
		r.unadvised.Add(m.anonUnadvised / 1024)
	}
	return missing
}

func (r *replicaMem) rows() []result.Row {
	if r.pss.Len() == 0 {
		return nil
	}
	rows := []result.Row{r.pss.Row(), r.rss.Row()}
	if r.detail {
		for _, s := range []*result.Series{r.anon, r.file, r.shmem, r.merged, r.unadvised} {
			rows = append(rows, s.Row())
		}
	}
	return rows
}

// ksmState is the host's KSM counters and settings
// (/sys/kernel/mm/ksm): whether replicas had time to merge is in the full
// scans since they started.
type ksmState map[string]string

const ksmDir = "/sys/kernel/mm/ksm"

func readKSM(dir string) ksmState {
	st := ksmState{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return st
	}
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			st[e.Name()] = strings.TrimSpace(string(b))
		}
	}
	return st
}

func (s ksmState) num(key string) float64 {
	v, _ := strconv.ParseFloat(s[key], 64)
	return v
}

// fullScansSince is how many full KSM scans ended between before and s.
func (s ksmState) fullScansSince(before ksmState) float64 {
	return s.num("full_scans") - before.num("full_scans")
}

// summary is one line of KSM's state: its settings and how much it shares.
func (s ksmState) summary() string {
	if len(s) == 0 {
		return "KSM: no " + ksmDir
	}
	mb := func(key string) string {
		return fmt.Sprintf("%.1f MB", s.num(key)*float64(os.Getpagesize())/(1<<20))
	}
	mode := s["advisor_mode"]
	if i, j := strings.Index(mode, "["), strings.Index(mode, "]"); i >= 0 && j > i {
		mode = mode[i+1 : j]
	}
	return fmt.Sprintf("KSM: run=%s advisor=%s pages_to_scan=%s sleep_millisecs=%s smart_scan=%s use_zero_pages=%s max_page_sharing=%s; shared %s, sharing %s, unshared %s, volatile %s, zero pages %s, full scans %s",
		s["run"], mode, s["pages_to_scan"], s["sleep_millisecs"], s["smart_scan"], s["use_zero_pages"], s["max_page_sharing"],
		mb("pages_shared"), mb("pages_sharing"), mb("pages_unshared"), mb("pages_volatile"), mb("ksm_zero_pages"), s["full_scans"])
}
