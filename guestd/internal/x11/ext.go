//go:build linux

package x11

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	// Imported for their init functions, which register the event and
	// error constructors initExtension installs.
	_ "github.com/jezek/xgb/damage"
	_ "github.com/jezek/xgb/shm"
	_ "github.com/jezek/xgb/xfixes"
	_ "github.com/jezek/xgb/xtest"
)

// extMu serializes writes to xgb's process-global event/error constructor
// tables.
var extMu sync.Mutex

// initExtension does what the xgb extension packages' Init functions do,
// without their data race: those write xgb.NewEventFuncs/NewErrorFuncs on
// every call while the reader goroutine of every open connection reads
// them, which Go may turn into a fatal "concurrent map read and map write"
// when guestd reconnects with an old connection still draining. Here the
// shared tables are written only when an entry is missing or different
// (the first Open of the process, or a server numbering its extensions
// differently), under a lock.
func initExtension(c *xgb.Conn, name string) error {
	r, err := xproto.QueryExtension(c, uint16(len(name)), name).Reply()
	if err != nil {
		return err
	}
	if r == nil || !r.Present {
		return fmt.Errorf("the server has no %s extension", name)
	}
	c.ExtLock.Lock()
	c.Extensions[name] = r.MajorOpcode
	c.ExtLock.Unlock()

	extMu.Lock()
	defer extMu.Unlock()
	for n, f := range xgb.NewExtEventFuncs[name] {
		k := int(r.FirstEvent) + n
		if cur, ok := xgb.NewEventFuncs[k]; !ok || reflect.ValueOf(cur).Pointer() != reflect.ValueOf(f).Pointer() {
			xgb.NewEventFuncs[k] = f
		}
	}
	for n, f := range xgb.NewExtErrorFuncs[name] {
		k := int(r.FirstError) + n
		if cur, ok := xgb.NewErrorFuncs[k]; !ok || reflect.ValueOf(cur).Pointer() != reflect.ValueOf(f).Pointer() {
			xgb.NewErrorFuncs[k] = f
		}
	}
	return nil
}
