package containerdrt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Registry credentials come from a docker config.json, the file `docker
// login`, `podman login` and `oras login` write: per registry an "auths"
// entry (user:password in base64, or an identity token), or a credential
// helper (credHelpers per host, credsStore for all) run as
// docker-credential-<name> get.

// dockerConfig is the part of config.json that holds credentials.
type dockerConfig struct {
	Auths       map[string]dockerAuth `json:"auths"`
	CredHelpers map[string]string     `json:"credHelpers"`
	CredsStore  string                `json:"credsStore"`
}

type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
}

// maxDockerConfigBytes bounds the config read (the host's own file, but a
// wrong path should fail clearly, not read a disk image).
const maxDockerConfigBytes = 1 << 20

// DefaultDockerConfig is the credentials file used when none is
// configured: $DOCKER_CONFIG/config.json, else ~/.docker/config.json.
func DefaultDockerConfig() string {
	if d := os.Getenv("DOCKER_CONFIG"); d != "" {
		return filepath.Join(d, "config.json")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".docker", "config.json")
}

// registryCreds returns the credentials for host ("" and "" when the file
// has none, or there is no file): the authorizer's WithAuthCreds callback.
// The file is read on each call, so a login takes effect without a
// restart.
func registryCreds(path string) func(host string) (string, string, error) {
	return func(host string) (string, string, error) {
		cfg, err := readDockerConfig(path)
		if err != nil {
			return "", "", err
		}
		return cfg.creds(host)
	}
}

func readDockerConfig(path string) (*dockerConfig, error) {
	cfg := &dockerConfig{}
	if path == "" {
		return cfg, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry credentials %s: %w: %w", path, errdefs.ErrFailedPrecondition, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDockerConfigBytes+1))
	if err != nil || len(b) > maxDockerConfigBytes {
		return nil, fmt.Errorf("registry credentials %s: unreadable or larger than %d bytes: %w", path, maxDockerConfigBytes, errdefs.ErrFailedPrecondition)
	}
	if err := json.Unmarshal(b, cfg); err != nil {
		return nil, fmt.Errorf("registry credentials %s: %w: %v", path, errdefs.ErrFailedPrecondition, err)
	}
	return cfg, nil
}

// creds finds host's credentials: a helper named for it, else its auths
// entry, else the default helper.
func (c *dockerConfig) creds(host string) (string, string, error) {
	if h := c.CredHelpers[host]; h != "" {
		return helperCreds(h, host)
	}
	for key, a := range c.Auths {
		if authHost(key) != host {
			continue
		}
		switch {
		case a.IdentityToken != "":
			// The authorizer takes an empty user with a secret as a
			// refresh token.
			return "", a.IdentityToken, nil
		case a.Auth != "":
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return "", "", fmt.Errorf("registry credentials for %s: auth is not base64: %w", host, errdefs.ErrFailedPrecondition)
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok {
				return "", "", fmt.Errorf("registry credentials for %s: auth is not user:password: %w", host, errdefs.ErrFailedPrecondition)
			}
			return user, pass, nil
		case a.Username != "":
			return a.Username, a.Password, nil
		}
	}
	if c.CredsStore != "" {
		return helperCreds(c.CredsStore, host)
	}
	return "", "", nil
}

// authHost is the registry host an auths key names: keys may carry a
// scheme and a path ("https://index.docker.io/v1/").
func authHost(key string) string {
	k := strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	k, _, _ = strings.Cut(k, "/")
	if k == "index.docker.io" || k == "registry-1.docker.io" {
		return "docker.io"
	}
	return k
}

// helperTimeout bounds a credential helper (a keychain prompt must not
// hang a pull forever).
const helperTimeout = 30 * time.Second

// helperCreds runs docker-credential-<name> get for host (the docker
// credential helper protocol: server URL on stdin, JSON on stdout).
func helperCreds(name, host string) (string, string, error) {
	if strings.ContainsAny(name, "/\\ ") {
		return "", "", fmt.Errorf("registry credential helper %q: %w: not a helper name", name, errdefs.ErrFailedPrecondition)
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker-credential-"+name, "get")
	cmd.Stdin = strings.NewReader(host)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		// The helpers' "no credentials" answer: anonymous access.
		if strings.Contains(string(out)+stderr.String(), "credentials not found") {
			return "", "", nil
		}
		return "", "", fmt.Errorf("registry credential helper %s for %s: %w: %v: %s", name, host, errdefs.ErrFailedPrecondition, err, strings.TrimSpace(stderr.String()))
	}
	var r struct{ Username, Secret string }
	if err := json.Unmarshal(out, &r); err != nil {
		return "", "", fmt.Errorf("registry credential helper %s for %s: %w: bad answer: %v", name, host, errdefs.ErrFailedPrecondition, err)
	}
	if r.Username == "<token>" {
		return "", r.Secret, nil
	}
	return r.Username, r.Secret, nil
}
