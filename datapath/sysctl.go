package datapath

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// inNetNS runs fn on an OS thread moved into the configured namespace, where /proc/sys/net
// shows that namespace's sysctls. A thread that cannot be moved back is left locked, so
// the runtime retires it rather than reuse it in the wrong namespace.
func (d *Datapath) inNetNS(fn func() error) error {
	if d.netns <= 0 {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(d.netns); err != nil {
			done <- fmt.Errorf("enter netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr == nil {
			runtime.UnlockOSThread()
		} else if err == nil {
			err = fmt.Errorf("leave netns: %w", rerr)
		}
		done <- err
	}()
	return <-done
}

// readSysctl returns a /proc/sys value in the configured namespace, trimmed.
func (d *Datapath) readSysctl(path string) (string, error) {
	var v string
	err := d.inNetNS(func() error {
		b, err := os.ReadFile(path)
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return v, nil
}

// writeSysctl writes a /proc/sys value in the configured namespace.
func (d *Datapath) writeSysctl(path, value string) error {
	d.log.Trace("write sysctl", "path", path, "value", value)
	err := d.inNetNS(func() error { return os.WriteFile(path, []byte(value), 0o644) })
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
