//go:build linux

package x11

import (
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestResolveKey(t *testing.T) {
	for name, want := range map[string]uint32{
		"Return": 0xff0d, "enter": 0xff0d, "ENTER": 0xff0d, "return": 0xff0d,
		"ctrl": 0xffe3, "Control_L": 0xffe3, "alt": 0xffe9, "shift": 0xffe1,
		"super": 0xffeb, "meta": 0xffeb, "cmd": 0xffeb,
		"esc": 0xff1b, "backspace": 0xff08, "tab": 0xff09, "space": 0x20,
		"up": 0xff52, "down": 0xff54, "left": 0xff51, "right": 0xff53,
		"pageup": 0xff55, "pagedown": 0xff56, "home": 0xff50, "end": 0xff57, "delete": 0xffff,
		"f1": 0xffbe, "F12": 0xffc9, "a": 'a', "A": 'A', "1": '1', "!": '!',
		"é": 0xe9, "eacute": 0xe9, "Eacute": 0xc9, "✓": 0xaf3, "U+1F600": 0x101f600,
		"0xff0d": 0xff0d, "Cyrillic_a": 0x6c1, "XF86": 0, // XF86 is not a keysym name
	} {
		got, err := resolveKey(name)
		if want == 0 {
			if !isErr(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: %x %v, want ErrInvalid", name, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q = 0x%x %v, want 0x%x", name, got, err, want)
		}
	}
}

func TestRuneKeysym(t *testing.T) {
	for r, want := range map[rune]uint32{
		'a': 'a', '~': '~', 'ÿ': 0xff, '\n': 0xff0d, '\t': 0xff09,
		'а': 0x6c1, 'Ω': 0x7d9, '€': 0x20ac, '日': 0x10065e5,
	} {
		if got := runeKeysym(r); got != want {
			t.Errorf("%q = 0x%x want 0x%x", r, got, want)
		}
	}
}
