//go:build linux

package sysops

import (
	"bufio"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkfleet/forkfleet/guestd/internal/fscred"
)

// Identity is the unprivileged user the agent's processes run as (exec,
// launch, the window manager and the session apps). A nil *Identity means
// guestd's own user (root): a sandbox created to run its agent as root.
type Identity struct {
	Name     string
	UID, GID uint32
	Groups   []uint32 // supplementary groups
	Home     string
	Shell    string
	dir      string // Home, or / when the home directory does not exist
}

// LookupIdentity reads name's entry from the image's /etc/passwd and
// /etc/group.
func LookupIdentity(name string) (*Identity, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", name, err)
	}
	id := &Identity{Name: u.Username, Home: u.HomeDir, Shell: "/bin/sh"}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q: uid %q gid %q are not numeric", name, u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, fmt.Errorf("user %q is root: name an unprivileged user", name)
	}
	id.UID, id.GID = uint32(uid), uint32(gid)
	gids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %q: groups: %w", name, err)
	}
	for _, g := range gids {
		n, err := strconv.ParseUint(g, 10, 32)
		if err == nil && uint32(n) != id.GID {
			id.Groups = append(id.Groups, uint32(n))
		}
	}
	if sh, err := loginShell(name); err == nil && sh != "" {
		id.Shell = sh
	}
	id.dir = "/"
	if st, err := os.Stat(id.Home); err == nil && st.IsDir() {
		id.dir = id.Home
	}
	return id, nil
}

// Credential is what a child gets to run as the user (nil for root: the
// child keeps guestd's credentials).
func (id *Identity) Credential() *syscall.Credential {
	if id == nil {
		return nil
	}
	return &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: append([]uint32(nil), id.Groups...)}
}

// FSCred is the user's identity for file access checks.
func (id *Identity) FSCred() fscred.Cred {
	if id == nil {
		return fscred.Root
	}
	c := fscred.Cred{UID: int(id.UID), GID: int(id.GID)}
	for _, g := range id.Groups {
		c.Groups = append(c.Groups, int(g))
	}
	return c
}

// Env sets what a login gives the user's processes: HOME, USER, LOGNAME
// and SHELL. For root it returns env unchanged (the image's).
func (id *Identity) Env(env []string) []string {
	if id == nil {
		return env
	}
	out := append([]string(nil), env...)
	for _, kv := range [][2]string{{"HOME", id.Home}, {"USER", id.Name}, {"LOGNAME", id.Name}, {"SHELL", id.Shell}} {
		out = setEnv(out, kv[0], kv[1])
	}
	return out
}

// Dir is where the user's processes start when the request names no
// directory: the home directory (guestd's own, /root, is closed to them).
func (id *Identity) Dir() string {
	if id == nil {
		return ""
	}
	return id.dir
}

// loginShell reads name's shell from /etc/passwd (os/user does not
// report it).
func loginShell(name string) (string, error) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name {
			return fields[6], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no passwd entry for %q", name)
}
