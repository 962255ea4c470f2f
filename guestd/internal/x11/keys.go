//go:build linux

package x11

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// keyAliases are the friendly, case-insensitive names agents use.
var keyAliases = map[string]uint32{
	"ctrl": 0xffe3, "control": 0xffe3, "lctrl": 0xffe3, "rctrl": 0xffe4,
	"alt": 0xffe9, "lalt": 0xffe9, "ralt": 0xffea, "altgr": 0xfe03,
	"shift": 0xffe1, "lshift": 0xffe1, "rshift": 0xffe2,
	"super": 0xffeb, "meta": 0xffeb, "cmd": 0xffeb, "command": 0xffeb, "win": 0xffeb, "windows": 0xffeb,
	"enter": 0xff0d, "return": 0xff0d,
	"esc": 0xff1b, "escape": 0xff1b,
	"backspace": 0xff08, "bksp": 0xff08,
	"tab":   0xff09,
	"space": 0x20, "spacebar": 0x20,
	"up": 0xff52, "down": 0xff54, "left": 0xff51, "right": 0xff53,
	"pageup": 0xff55, "pgup": 0xff55, "page_up": 0xff55,
	"pagedown": 0xff56, "pgdn": 0xff56, "page_down": 0xff56,
	"home": 0xff50, "end": 0xff57,
	"delete": 0xffff, "del": 0xffff,
	"insert": 0xff63, "ins": 0xff63,
	"capslock": 0xffe5, "numlock": 0xff7f, "scrolllock": 0xff14,
	"printscreen": 0xff61, "print": 0xff61, "prtsc": 0xff61,
	"menu": 0xff67, "pause": 0xff13,
}

// keysymByLowerName is the case-insensitive fallback index. On collisions
// ("Aacute"/"aacute") the lower-case keysym name wins: it is the one a
// case-insensitive caller most likely meant.
var keysymByLowerName = sync.OnceValue(func() map[string]uint32 {
	m := make(map[string]uint32, len(keysymByName))
	for name, ks := range keysymByName {
		l := strings.ToLower(name)
		if _, dup := m[l]; dup && name != l {
			continue
		}
		m[l] = ks
	}
	return m
})

// keysymByRune inverts legacyKeysymRune, keeping the lowest keysym.
var keysymByRune = sync.OnceValue(func() map[rune]uint32 {
	m := make(map[rune]uint32, len(legacyKeysymRune))
	for ks, r := range legacyKeysymRune {
		if old, ok := m[r]; !ok || ks < old {
			m[r] = ks
		}
	}
	return m
})

// resolveKey turns a key name into a keysym: friendly alias, exact keysym
// name, a single character, a case-insensitive keysym name, "U+XXXX" or a
// "0x..." keysym value.
func resolveKey(name string) (uint32, error) {
	if name == "" {
		return 0, fmt.Errorf("x11: empty key name: %w", errdefs.ErrInvalidArgument)
	}
	if ks, ok := keyAliases[strings.ToLower(name)]; ok {
		return ks, nil
	}
	if ks, ok := keysymByName[name]; ok {
		return ks, nil
	}
	if r, n := utf8.DecodeRuneInString(name); n == len(name) && r != utf8.RuneError {
		return runeKeysym(r), nil
	}
	if ks, ok := keysymByLowerName()[strings.ToLower(name)]; ok {
		return ks, nil
	}
	if hex, ok := cutPrefixFold(name, "U+"); ok {
		if cp, err := strconv.ParseUint(hex, 16, 32); err == nil && cp <= utf8.MaxRune {
			return runeKeysym(rune(cp)), nil
		}
	}
	if hex, ok := cutPrefixFold(name, "0x"); ok {
		if ks, err := strconv.ParseUint(hex, 16, 32); err == nil && ks != 0 && ks <= 0x1ffffff {
			return uint32(ks), nil
		}
	}
	return 0, fmt.Errorf("x11: unknown key name %q: %w", name, errdefs.ErrInvalidArgument)
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) > len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

// runeKeysym is the keysym X uses for a character: Latin-1 code points are
// their own keysym, other characters with a legacy keysym use it, the rest
// are Unicode keysyms (0x01000000 + code point).
func runeKeysym(r rune) uint32 {
	switch {
	case r >= 0x20 && r <= 0x7e, r >= 0xa0 && r <= 0xff:
		return uint32(r)
	case r == '\n', r == '\r':
		return 0xff0d // Return
	case r == '\t':
		return 0xff09 // Tab
	case r == '\b':
		return 0xff08 // BackSpace
	case r == 0x1b:
		return 0xff1b // Escape
	}
	if ks, ok := keysymByRune()[r]; ok {
		return ks
	}
	return 0x01000000 | uint32(r)
}

// keysymAlternates lists the other encoding of the same character, since
// a keymap may carry either the legacy or the Unicode keysym.
func keysymAlternates(ks uint32) []uint32 {
	if ks >= 0x01000000 {
		r := rune(ks - 0x01000000)
		if r >= 0x20 && r <= 0xff {
			return []uint32{ks, uint32(r)}
		}
		if l, ok := keysymByRune()[r]; ok {
			return []uint32{ks, l}
		}
		return []uint32{ks}
	}
	if r, ok := legacyKeysymRune[ks]; ok {
		return []uint32{ks, 0x01000000 | uint32(r)}
	}
	if (ks >= 0x20 && ks <= 0x7e) || (ks >= 0xa0 && ks <= 0xff) {
		return []uint32{ks, 0x01000000 | ks}
	}
	return []uint32{ks}
}
