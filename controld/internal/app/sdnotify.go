package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/health"
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

// watchdogInterval returns how often systemd expects WATCHDOG=1 from this
// process (WATCHDOG_USEC, set with WatchdogSec=), or 0 when its watchdog is
// off or meant for another process (WATCHDOG_PID), as sd_watchdog_enabled.
func watchdogInterval(getenv func(string) string) (time.Duration, error) {
	v := getenv("WATCHDOG_USEC")
	if v == "" {
		return 0, nil
	}
	if p := getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0, nil
	}
	us, err := strconv.ParseUint(v, 10, 63)
	if err != nil || us == 0 {
		return 0, fmt.Errorf("WATCHDOG_USEC=%q: not a positive number of microseconds", v)
	}
	return time.Duration(us) * time.Microsecond, nil
}

// watchdog sends WATCHDOG=1 twice per interval while controld is alive
// (health.Checker.Alive: its loops make progress, its store commits, its
// lock is free) and withholds it otherwise, so systemd restarts a controld
// that is stuck rather than one that is merely busy. Each check gets a
// quarter of the interval.
func watchdog(ctx context.Context, interval time.Duration, hc *health.Checker, log *slog.Logger) {
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	var failing bool
	for {
		cctx, cancel := context.WithTimeout(ctx, interval/4)
		err := hc.Alive(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Error("controld is not alive: withholding the systemd watchdog ping (systemd restarts it past WatchdogSec)", "err", err)
			failing = true
		default:
			if failing {
				log.Info("controld is alive again: systemd watchdog pings resume")
				failing = false
			}
			if err := sdNotify("WATCHDOG=1"); err != nil {
				log.Warn("sd_notify WATCHDOG", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
