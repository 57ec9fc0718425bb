// Command vminit is PID 1 of the arm64 virtual machine lab/armvm boots: it loads the kernel
// modules the datapath needs (the VM has no modprobe, so the kernel cannot load them on
// demand), brings up the VM's one network device on QEMU's user-mode network, runs the agent
// with the arguments the image gives, and powers the machine off when the agent exits.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Files lab/armvm.Initramfs writes beside this binary.
const (
	modulesFile = "/modules" // module paths, one a line, in load order
	argsFile    = "/args"    // the agent's argv, one argument a line
	// QEMU's user-mode network: the guest's address and the host's loopback as seen from it.
	guestAddress = "10.0.2.15/24"
	gateway      = "10.0.2.2"
)

func main() {
	err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "vminit:", err)
	}
	fmt.Fprintln(os.Stderr, "vminit: powering off")
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func run() error {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/run", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	modules, err := lines(modulesFile)
	if err != nil {
		return err
	}
	for _, m := range modules {
		if err := load(m); err != nil {
			return err
		}
	}
	if err := network(); err != nil {
		return err
	}
	args, err := lines(argsFile)
	if err != nil || len(args) == 0 {
		return fmt.Errorf("agent arguments: %v", err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// load inserts one module; one already there (built in, or loaded as a dependency) is fine.
func load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load %s: %w", path, err)
	}
	return nil
}

// network brings lo and eth0 up with the user-mode network's fixed addresses.
func network() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	eth, err := netlink.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, err := netlink.ParseAddr(guestAddress)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP(gateway)})
}

func lines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}
