package app

import (
	"errors"
	"net"
	"os"
)

// sdNotify sends state to systemd's notification socket when NOTIFY_SOCKET
// is set (Type=notify units); without it, it does nothing.
func sdNotify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' { // abstract namespace
		addr = "\x00" + addr[1:]
	} else if addr[0] != '/' {
		return errors.New("sd_notify: NOTIFY_SOCKET is neither a path nor abstract")
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}
