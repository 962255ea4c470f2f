package fleet

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// HostStatus is what clients of many controlds place by: this host's name,
// its memory, its admission counts (limits.Host.Status, the numbers
// admission decides by) and its pools. It reads the records under the lock
// and /proc/meminfo, nothing else, so a client may ask before every
// placement.
func (m *Manager) HostStatus() (*controldv1.GetHostStatusResponse, error) {
	total, avail, err := readMeminfo()
	if err != nil {
		return nil, fmt.Errorf("host status: %w", err)
	}
	m.mu.Lock()
	st := m.opts.Limits.Status(m.heldLocked())
	st.Checkpoints = uint32(len(m.checkpoints))
	for _, p := range m.pools {
		v := m.poolViewLocked(p)
		st.Pools = append(st.Pools, &controldv1.PoolStatus{Id: v.Id, Name: v.Name, Size: v.Size, Available: v.Available})
	}
	m.mu.Unlock()
	slices.SortFunc(st.Pools, func(a, b *controldv1.PoolStatus) int { return strings.Compare(a.Id, b.Id) })
	st.Host = m.opts.Host
	st.MemoryTotalBytes, st.MemoryAvailableBytes = total, avail
	return st, nil
}

// readMeminfo returns MemTotal and MemAvailable of /proc/meminfo in bytes.
func readMeminfo() (total, avail int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var seen int
	for sc.Scan() && seen < 2 {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		var dst *int64
		switch f[0] {
		case "MemTotal:":
			dst = &total
		case "MemAvailable:":
			dst = &avail
		default:
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/meminfo %s: %w", f[0], err)
		}
		*dst = kb << 10
		seen++
	}
	if seen < 2 {
		return 0, 0, fmt.Errorf("/proc/meminfo: no MemTotal or MemAvailable")
	}
	return total, avail, nil
}
