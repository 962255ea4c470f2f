// Package suites holds benchd's benchmark suites; importing it registers
// them in run order.
package suites

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

// intList is a comma-separated list flag of positive integers.
type intList []int

func (l *intList) String() string {
	parts := make([]string, len(*l))
	for i, v := range *l {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return fmt.Errorf("%q is not a non-negative integer", p)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return fmt.Errorf("empty list")
	}
	*l = out
	return nil
}

func labels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func itoa(v int) string { return strconv.Itoa(v) }

func hostCores() int { return runtimeNumCPU() }

func runtimeNumCPU() int { return runtime.NumCPU() }
