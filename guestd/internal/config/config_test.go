package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaultAndEnv(t *testing.T) {
	c, err := Load(filepath.Join(t.TempDir(), "absent.json"), true, env(map[string]string{
		EnvACIToken: "a", EnvAdminToken: "b", EnvSandboxID: "sb", EnvScreen: "1920x1080x24"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Display != ":0" || c.Screen != (Screen{1920, 1080, 24}) || c.ACIToken != "a" || c.AdminToken != "b" || c.SandboxID != "sb" ||
		c.Listen.Unix != "/run/forkfleet/aci.sock" || c.RootColor != "#2f3b4c" || len(c.Apps) != 1 || c.Apps[0].Restart != RestartOnFailure ||
		c.Limits.MaxMessageBytes != 64<<20 || len(c.Ready.Windows) != 1 || !c.Ready.Windows[0].Focus {
		t.Fatalf("%+v", c)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.json"), false, env(nil)); err == nil {
		t.Fatal("an explicit missing config must fail")
	}
}

func TestInvalid(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field":       `{"display":":0","bogus":1}`,
		"depth 16":            `{"display":":0","screen":{"width":800,"height":600,"depth":16},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"}}`,
		"wider than controld": `{"display":":0","screen":{"width":16384,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"}}`,
		"bad display":         `{"display":"0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"}}`,
		"bad color":           `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"root_color":"blue"}`,
		"no listener":         `{"display":":0","screen":{"width":800,"height":600,"depth":24},"xvfb":{"path":"/usr/bin/Xvfb"}}`,
		"relative path":       `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"Xvfb"}}`,
		"ready: empty window": `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"ready":{"windows":[{"name":"x"}]}}`,
		"ready: bad title":    `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"ready":{"windows":[{"title":"(("}]}}`,
		"ready: two focus":    `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"ready":{"windows":[{"class":"A","focus":true},{"class":"B","focus":true}]}}`,
		"a11y: tcp address":   `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"a11y":{"address":"tcp:host=x","bus":{"path":"/b"},"registry":{"path":"/r"}}}`,
		"a11y: relative bus":  `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"a11y":{"address":"unix:path=/run/a","bus":{"path":"b"},"registry":{"path":"/r"}}}`,
		"a11y: bad env":       `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"a11y":{"address":"unix:path=/run/a","bus":{"path":"/b"},"registry":{"path":"/r"},"env":["NOEQUALS"]}}`,
		"a11y: comma in path": `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"a11y":{"address":"unix:path=/run/a,guid=1","bus":{"path":"/b"},"registry":{"path":"/r"}}}`,
		"bad restart":         `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"apps":[{"name":"a","path":"/bin/a","restart":"sometimes"}]}`,
	} {
		p := filepath.Join(t.TempDir(), "c.json")
		os.WriteFile(p, []byte(body), 0o644)
		if _, err := Load(p, false, env(nil)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	good := `{"display":":0","screen":{"width":800,"height":600,"depth":24},"listen":{"tcp":"127.0.0.1:1"},"xvfb":{"path":"/usr/bin/Xvfb"},"a11y":{"address":"unix:path=/run/forkfleet/a11y/bus","bus":{"path":"/usr/bin/dbus-daemon"},"registry":{"path":"/usr/libexec/at-spi2-registryd"},"env":["QT_ACCESSIBILITY=1"]}}`
	p := filepath.Join(t.TempDir(), "a11y.json")
	os.WriteFile(p, []byte(good), 0o644)
	if c, err := Load(p, false, env(nil)); err != nil || c.A11y.SocketPath() != "/run/forkfleet/a11y/bus" {
		t.Fatalf("a11y config: %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "x"), true, env(map[string]string{EnvScreen: "12x"})); err == nil || !strings.Contains(err.Error(), EnvScreen) {
		t.Fatalf("bad screen env: %v", err)
	}
}

func TestParse(t *testing.T) {
	if s, err := ParseScreen("800x600"); err != nil || s.Depth != 24 {
		t.Fatal(s, err)
	}
	if c, err := ParseColor("#0a0B0c"); err != nil || c != 0x0a0b0c {
		t.Fatal(c, err)
	}
}
