package suites

import "os/exec"

func lookPath(bin string) (string, error) { return exec.LookPath(bin) }
