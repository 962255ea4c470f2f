// Package config loads guestd's configuration: the JSON file written into the
// image, an embedded default when the file is absent, and the environment
// overrides controld sets per sandbox.
package config

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/forkfleet/forkfleet/api/screen"
)

// DefaultPath is where the image installs the config file.
const DefaultPath = "/etc/forkfleet/guestd.json"

// Environment variables controld sets on the sandbox.
const (
	EnvACIToken   = "FORKFLEET_ACI_TOKEN"
	EnvAdminToken = "FORKFLEET_ADMIN_TOKEN"
	EnvSandboxID  = "FORKFLEET_SANDBOX_ID"
	EnvScreen     = "FORKFLEET_SCREEN"
	// EnvRunAsRoot=1: the sandbox was created to run its agent as root
	// (exec, launch, the window manager and the apps), not as User.
	EnvRunAsRoot = "FORKFLEET_RUN_AS_ROOT"
)

//go:embed default.json
var defaultJSON []byte

// Restart policies of a supervised app.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure"
	RestartNever     = "never"
)

// Config is the parsed guestd.json plus environment overrides.
type Config struct {
	Display string `json:"display"`
	// User is the unprivileged user the agent acts as: exec, launch, the
	// window manager and the session apps run as this user (from
	// /etc/passwd), and agent sessions' file requests are checked as it.
	// guestd itself stays root (it is init, serves X and reads /proc).
	// Empty: everything runs as guestd's own user.
	User          string    `json:"user,omitempty"`
	Screen        Screen    `json:"screen"`
	Listen        Listen    `json:"listen"`
	Xvfb          Program   `json:"xvfb"`
	WindowManager Program   `json:"window_manager"`
	RootColor     string    `json:"root_color"`
	Apps          []Program `json:"apps"`
	Limits        Limits    `json:"limits"`
	// Ready is what "usable" requires of this image beyond X, the window
	// manager and the painted root (docs/aci-spec.md, "Readiness").
	Ready Ready `json:"ready"`
	// A11y is the accessibility stack: the bus and the AT-SPI registry
	// guestd starts before the apps, and what the apps are told. Absent: no
	// accessibility bus (a11y_tree answers the bare desktop).
	A11y *A11y `json:"a11y,omitempty"`

	// From the environment only; never read from the file so a token cannot
	// be baked into an image.
	ACIToken   string `json:"-"`
	AdminToken string `json:"-"`
	SandboxID  string `json:"-"`
	// RunAsRoot overrides User (controld's per-sandbox option).
	RunAsRoot bool `json:"-"`
}

// AgentUser is the user the agent's processes run as: User, or "" (guestd's
// own) for a sandbox created to run as root.
func (c *Config) AgentUser() string {
	if c.RunAsRoot {
		return ""
	}
	return c.User
}

// Screen is the virtual framebuffer geometry.
type Screen struct {
	Width  int `json:"width"`
	Height int `json:"height"`
	Depth  int `json:"depth"`
}

// Listen names the ACI listeners; an empty field disables that listener.
type Listen struct {
	Unix string `json:"unix"`
	TCP  string `json:"tcp"`
}

// Program is one supervised process.
type Program struct {
	Name    string   `json:"name"`
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env,omitempty"`
	Restart string   `json:"restart,omitempty"`
}

// Ready is an image's definition of a usable desktop: windows that must be
// mapped, optionally with a title (the start page's, say) and the input
// focus. Empty: X up, window manager up and root painted are enough.
type Ready struct {
	Windows []ReadyWindow `json:"windows,omitempty"`
}

// ReadyWindow is one window readiness waits for: a top-level window, mapped
// and not minimized, whose WM_CLASS instance or class is Class (when set)
// and whose title matches the regular expression Title (RE2, unanchored;
// when set). Focus: this window must also hold the X input focus, so the
// first key an agent types lands in it.
type ReadyWindow struct {
	// Name says what it is in waiting_for messages (default: the class).
	Name  string `json:"name,omitempty"`
	Class string `json:"class,omitempty"`
	Title string `json:"title,omitempty"`
	Focus bool   `json:"focus,omitempty"`
}

// A11y configures the accessibility (AT-SPI2) stack. guestd starts Bus (a
// dbus-daemon, given --address=Address) and then Registry
// (at-spi2-registryd) itself, instead of through at-spi-bus-launcher (whose
// pidfd use blocks CRIU dumps), and only then the session apps. Every app,
// launched program and exec'd command gets AT_SPI_BUS_ADDRESS=Address and
// Env (the toolkits' switches: QT_ACCESSIBILITY=1, GTK_MODULES, ...).
type A11y struct {
	// Address is the bus's D-Bus address; only "unix:path=/absolute" is
	// accepted (the socket's directory is created by guestd).
	Address  string   `json:"address"`
	Bus      Program  `json:"bus"`
	Registry Program  `json:"registry"`
	Env      []string `json:"env,omitempty"`
}

// SocketPath is the bus socket's path (Address without "unix:path=").
func (a *A11y) SocketPath() string { return strings.TrimPrefix(a.Address, "unix:path=") }

func (a *A11y) validate() error {
	p, ok := strings.CutPrefix(a.Address, "unix:path=")
	if !ok || !strings.HasPrefix(p, "/") || strings.ContainsAny(p, ",;=\x00") || len(p) > 100 {
		return fmt.Errorf("a11y.address %q: want unix:path=/absolute/path (at most 100 bytes, no ',', ';' or '=')", a.Address)
	}
	for _, f := range []struct {
		name string
		p    Program
	}{{"a11y.bus", a.Bus}, {"a11y.registry", a.Registry}} {
		if !strings.HasPrefix(f.p.Path, "/") {
			return fmt.Errorf("%s.path %q: want an absolute path", f.name, f.p.Path)
		}
	}
	for i, e := range a.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("a11y.env[%d] %q: want NAME=value", i, e)
		}
	}
	return nil
}

// Bounds on the readiness conditions.
const (
	maxReadyWindows      = 16
	maxReadyTitlePattern = 512
)

// Limits bound what one client can make guestd hold.
type Limits struct {
	// MaxMessageBytes is the largest ClientMessage accepted (and advertised
	// in HelloResponse.max_message_bytes).
	MaxMessageBytes int64 `json:"max_message_bytes"`
	// MaxFileBytes caps a published file (single or chunked put).
	MaxFileBytes int64 `json:"max_file_bytes"`
	// MaxUploads caps concurrent chunked uploads per guestd.
	MaxUploads int `json:"max_uploads"`
	// UploadIdleSeconds: a chunked upload without a chunk for this long is
	// removed with its temporary file.
	UploadIdleSeconds int `json:"upload_idle_seconds"`
	// MaxSessions caps concurrent sessions of the agent token (controld's
	// admin sessions have a reserve of their own).
	MaxSessions int `json:"max_sessions"`
	// MaxSessionBytes bounds what one session holds in each direction:
	// requests received and not yet executed, replies not yet written.
	MaxSessionBytes int64 `json:"max_session_bytes"`
}

// Default returns the embedded default configuration.
func Default() *Config {
	c, err := parse(defaultJSON)
	if err != nil {
		panic("config: embedded default is invalid: " + err.Error())
	}
	return c
}

// Load reads path (the embedded default when the file does not exist and
// allowMissing is set), applies the environment from getenv and validates.
func Load(path string, allowMissing bool, getenv func(string) string) (*Config, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && allowMissing:
		data = defaultJSON
	case err != nil:
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := c.ApplyEnv(getenv); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func parse(data []byte) (*Config, error) {
	// Start from zero limits, fill defaults after, so a file that omits
	// "limits" gets sane values.
	c := &Config{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return nil, err
	}
	c.Limits.fillDefaults()
	for i := range c.Apps {
		if c.Apps[i].Restart == "" {
			c.Apps[i].Restart = RestartOnFailure
		}
	}
	return c, nil
}

func (l *Limits) fillDefaults() {
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = 64 << 20
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = 4 << 30
	}
	if l.MaxUploads == 0 {
		l.MaxUploads = 16
	}
	if l.UploadIdleSeconds == 0 {
		l.UploadIdleSeconds = 300
	}
	if l.MaxSessions == 0 {
		l.MaxSessions = 64
	}
	if l.MaxSessionBytes == 0 {
		l.MaxSessionBytes = 64 << 20
	}
}

// ApplyEnv applies the controld-provided environment.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	c.ACIToken = getenv(EnvACIToken)
	c.AdminToken = getenv(EnvAdminToken)
	c.SandboxID = getenv(EnvSandboxID)
	switch v := getenv(EnvRunAsRoot); v {
	case "", "0":
	case "1":
		c.RunAsRoot = true
	default:
		return fmt.Errorf("config: %s=%q: want 0 or 1", EnvRunAsRoot, v)
	}
	if s := getenv(EnvScreen); s != "" {
		scr, err := ParseScreen(s)
		if err != nil {
			return fmt.Errorf("config: %s: %w", EnvScreen, err)
		}
		c.Screen = scr
	}
	return nil
}

// ParseScreen parses "WxHxD" (or "WxH", depth 24).
func ParseScreen(s string) (Screen, error) {
	parts := strings.Split(strings.ToLower(s), "x")
	if len(parts) != 2 && len(parts) != 3 {
		return Screen{}, fmt.Errorf("screen %q: want WIDTHxHEIGHTxDEPTH", s)
	}
	var v [3]int
	v[2] = 24
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return Screen{}, fmt.Errorf("screen %q: %w", s, err)
		}
		v[i] = n
	}
	scr := Screen{Width: v[0], Height: v[1], Depth: v[2]}
	return scr, scr.validate()
}

func (s Screen) validate() error {
	if !screen.EdgeOK(s.Width) || !screen.EdgeOK(s.Height) {
		return fmt.Errorf("screen %dx%d out of range (%d..%d)", s.Width, s.Height, screen.MinEdge, screen.MaxEdge)
	}
	if s.Depth != screen.Depth {
		return fmt.Errorf("screen depth %d: want %d", s.Depth, screen.Depth)
	}
	return nil
}

// Validate checks the whole configuration.
func (c *Config) Validate() error {
	if !strings.HasPrefix(c.Display, ":") {
		return fmt.Errorf("display %q: want \":N\"", c.Display)
	}
	if _, err := strconv.Atoi(strings.SplitN(c.Display[1:], ".", 2)[0]); err != nil {
		return fmt.Errorf("display %q: want \":N\"", c.Display)
	}
	if err := c.Screen.validate(); err != nil {
		return err
	}
	if c.User != "" && (len(c.User) > 32 || strings.ContainsAny(c.User, ":/\x00 \n")) {
		return fmt.Errorf("user %q: not a user name", c.User)
	}
	if c.Listen.Unix == "" && c.Listen.TCP == "" {
		return errors.New("listen: neither unix nor tcp set")
	}
	if c.RootColor != "" {
		if _, err := ParseColor(c.RootColor); err != nil {
			return err
		}
	}
	for _, p := range append([]Program{c.Xvfb, c.WindowManager}, c.Apps...) {
		if p.Path == "" {
			continue
		}
		if !strings.HasPrefix(p.Path, "/") {
			return fmt.Errorf("program %q: path %q is not absolute", p.Name, p.Path)
		}
		switch p.Restart {
		case "", RestartAlways, RestartOnFailure, RestartNever:
		default:
			return fmt.Errorf("program %q: restart %q: want always, on-failure or never", p.Name, p.Restart)
		}
	}
	if c.Xvfb.Path == "" {
		return errors.New("xvfb.path is empty")
	}
	if err := c.Ready.validate(); err != nil {
		return err
	}
	if c.A11y != nil {
		if err := c.A11y.validate(); err != nil {
			return err
		}
	}
	if c.Limits.MaxMessageBytes < 1<<20 || c.Limits.MaxMessageBytes > 1<<30 {
		return fmt.Errorf("limits.max_message_bytes %d out of range (1 MiB..1 GiB)", c.Limits.MaxMessageBytes)
	}
	if c.Limits.MaxFileBytes < 1 || c.Limits.MaxUploads < 1 || c.Limits.UploadIdleSeconds < 1 || c.Limits.MaxSessions < 1 {
		return errors.New("limits: max_file_bytes, max_uploads, upload_idle_seconds and max_sessions must be positive")
	}
	if c.Limits.MaxSessionBytes < 1<<20 {
		return fmt.Errorf("limits.max_session_bytes %d: at least 1 MiB", c.Limits.MaxSessionBytes)
	}
	return nil
}

// ParseColor parses "#rrggbb" into 0xRRGGBB.
func ParseColor(s string) (uint32, error) {
	if len(s) != 7 || s[0] != '#' {
		return 0, fmt.Errorf("color %q: want #rrggbb", s)
	}
	v, err := strconv.ParseUint(s[1:], 16, 32)
	if err != nil {
		return 0, fmt.Errorf("color %q: want #rrggbb", s)
	}
	return uint32(v), nil
}

func (r Ready) validate() error {
	if len(r.Windows) > maxReadyWindows {
		return fmt.Errorf("ready.windows: %d windows, at most %d", len(r.Windows), maxReadyWindows)
	}
	focus := 0
	for i, w := range r.Windows {
		if w.Class == "" && w.Title == "" {
			return fmt.Errorf("ready.windows[%d]: set class, title or both", i)
		}
		if len(w.Title) > maxReadyTitlePattern {
			return fmt.Errorf("ready.windows[%d].title: pattern longer than %d bytes", i, maxReadyTitlePattern)
		}
		if _, err := regexp.Compile(w.Title); err != nil {
			return fmt.Errorf("ready.windows[%d].title: %w", i, err)
		}
		if w.Focus {
			focus++
		}
	}
	if focus > 1 {
		return fmt.Errorf("ready.windows: %d windows want the focus, at most one can have it", focus)
	}
	return nil
}
