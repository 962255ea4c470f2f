//go:build linux

package x11

import (
	"fmt"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
)

type atoms struct {
	netSupportingWMCheck, netClientList, netActiveWindow, netWMName, utf8String,
	netWMPID, netWMState, netWMStateHidden, netWMStateMaxVert, netWMStateMaxHorz,
	netWMStateFullscreen, netWMDesktop, netCloseWindow, netMoveResizeWindow,
	netFrameExtents, netRequestFrameExtents, netSupported, wmChangeState, wmState, wmProtocols, wmDeleteWindow,
	clipboard, targets, text, timestamp, incr, selProp, tsProp xproto.Atom
}

func (a *atoms) intern(c *xgb.Conn) error {
	list := []struct {
		name string
		dst  *xproto.Atom
	}{
		{"_NET_SUPPORTING_WM_CHECK", &a.netSupportingWMCheck},
		{"_NET_CLIENT_LIST", &a.netClientList},
		{"_NET_ACTIVE_WINDOW", &a.netActiveWindow},
		{"_NET_WM_NAME", &a.netWMName},
		{"UTF8_STRING", &a.utf8String},
		{"_NET_WM_PID", &a.netWMPID},
		{"_NET_WM_STATE", &a.netWMState},
		{"_NET_WM_STATE_HIDDEN", &a.netWMStateHidden},
		{"_NET_WM_STATE_MAXIMIZED_VERT", &a.netWMStateMaxVert},
		{"_NET_WM_STATE_MAXIMIZED_HORZ", &a.netWMStateMaxHorz},
		{"_NET_WM_STATE_FULLSCREEN", &a.netWMStateFullscreen},
		{"_NET_WM_DESKTOP", &a.netWMDesktop},
		{"_NET_CLOSE_WINDOW", &a.netCloseWindow},
		{"_NET_MOVERESIZE_WINDOW", &a.netMoveResizeWindow},
		{"_NET_FRAME_EXTENTS", &a.netFrameExtents},
		{"_NET_REQUEST_FRAME_EXTENTS", &a.netRequestFrameExtents},
		{"_NET_SUPPORTED", &a.netSupported},
		{"WM_CHANGE_STATE", &a.wmChangeState},
		{"WM_STATE", &a.wmState},
		{"WM_PROTOCOLS", &a.wmProtocols},
		{"WM_DELETE_WINDOW", &a.wmDeleteWindow},
		{"CLIPBOARD", &a.clipboard},
		{"TARGETS", &a.targets},
		{"TEXT", &a.text},
		{"TIMESTAMP", &a.timestamp},
		{"INCR", &a.incr},
		{"_FORKFLEET_SELECTION", &a.selProp},
		{"_FORKFLEET_TIMESTAMP", &a.tsProp},
	}
	cookies := make([]xproto.InternAtomCookie, len(list))
	for i, l := range list {
		cookies[i] = xproto.InternAtom(c, false, uint16(len(l.name)), l.name)
	}
	for i, ck := range cookies {
		r, err := ck.Reply()
		if err != nil {
			return xerr("InternAtom "+list[i].name, err)
		}
		if r == nil {
			return errNilReply("InternAtom " + list[i].name)
		}
		*list[i].dst = r.Atom
	}
	if a.utf8String == 0 {
		return fmt.Errorf("x11: InternAtom returned None")
	}
	return nil
}
