// Package desktop holds the types shared by the ACI server and the X11
// implementation of its Desktop interface.
package desktop

import (
	"image"
	"time"
)

// Frame is a BGRX pixel buffer, 4 bytes per pixel.
type Frame struct {
	Pix    []byte
	Stride int
	Rect   image.Rectangle // in root coordinates
}

// Cursor is the current cursor sprite.
type Cursor struct {
	X, Y          int // hotspot position on screen
	XHot, YHot    int
	Width, Height int
	ARGB          []uint32
}

// ReadyState is the cheap readiness probe result.
type ReadyState struct {
	XUp         bool
	WMUp        bool // an EWMH window manager announced itself
	RootPainted bool // sampled root pixels are not all black
	At          time.Time
}

// Window is one top-level client window.
type Window struct {
	ID        uint32
	Title     string
	Class     string
	Instance  string
	PID       int
	X, Y      int
	Width     int
	Height    int
	Focused   bool
	Minimized bool
	Maximized bool
	Desktop   int
	// Mapped: viewable (the window and its ancestors mapped), so it can be
	// seen and take input.
	Mapped bool
}

// WindowState is a requested EWMH state change.
type WindowState int

const (
	WindowMaximize WindowState = iota + 1
	WindowMinimize
	WindowRestore
	WindowFullscreen
)
