// Package armvm boots a whole arm64 Linux machine under QEMU's system emulation to run an
// arm64 binary against a real arm64 kernel: QEMU's user mode (qemu-aarch64) refuses netfilter
// netlink sockets, so an arm64 agent can apply a program only in a machine of its own. The
// machine is Debian's arm64 cloud kernel (lab/fetch-arm64-kernel.sh) and an initramfs holding
// vminit (lab/armvm/vminit) as PID 1, the modules the datapath needs and the binary to run;
// its one network device is QEMU's user-mode network, on which the host's loopback is
// 10.0.2.2.
package armvm

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// HostAddress is the host's loopback as the machine reaches it.
const HostAddress = "10.0.2.2"

// DatapathModules are the modules kuport's datapath needs that Debian's cloud kernel builds
// as modules: nftables with conntrack, NAT and conntrack netlink (sweeps), xfrm's netlink
// (the netlink library's handle opens every family it knows), vxlan (links), and the virtio
// network device. Their dependencies are loaded first.
var DatapathModules = []string{"nfnetlink", "nf_tables", "nft_ct", "nf_nat", "nft_nat", "nft_chain_nat",
	"nf_conntrack_netlink", "xfrm_user", "vxlan", "virtio_pci", "virtio_net"}

// Kernel is an unpacked kernel package: the Image QEMU boots and its module tree.
type Kernel struct {
	Image   string // boot/vmlinuz-*
	Modules string // lib/modules/<release>
}

// FindKernel finds the Image and the module tree in dir, as lab/fetch-arm64-kernel.sh unpacks
// them.
func FindKernel(dir string) (Kernel, error) {
	images, err := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if err != nil || len(images) != 1 {
		return Kernel{}, fmt.Errorf("armvm: want one boot/vmlinuz-* in %s, found %v (%v)", dir, images, err)
	}
	release := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	return Kernel{Image: images[0], Modules: filepath.Join(dir, "lib", "modules", release)}, nil
}

// LoadOrder returns the module files to insert for names, each after its dependencies (read
// from the modules' own .modinfo, since the package ships no modules.dep).
func (k Kernel) LoadOrder(names []string) ([]string, error) {
	index := map[string]string{}
	err := filepath.WalkDir(k.Modules, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			index[canonical(strings.TrimSuffix(d.Name(), ".ko"))] = p
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string) error
	visit = func(name string) error {
		name = canonical(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("armvm: module dependency cycle at %s", name)
		case 2:
			return nil
		}
		path, ok := index[name]
		if !ok {
			return fmt.Errorf("armvm: module %s not in %s", name, k.Modules)
		}
		state[name] = 1
		deps, err := dependencies(path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, path)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// canonical spells a module name as the kernel does: dashes and underscores are one.
func canonical(name string) string { return strings.ReplaceAll(name, "-", "_") }

// dependencies reads the depends= field of a module's .modinfo section.
func dependencies(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("armvm: %s has no .modinfo", path)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, field := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(field, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// Initramfs writes to out a newc cpio archive holding vminit as /init, the modules in load
// order, the files (archive path to host path; mode 0755) and, in /args, the argv vminit
// runs once the machine is up.
func Initramfs(out, vminit string, modules []string, files map[string]string, args []string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := cpio.NewWriter(f)
	add := func(name string, mode cpio.FileMode, data []byte) error {
		if err := w.WriteHeader(&cpio.Header{Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := w.Write(data)
		return err
	}
	addFile := func(name, src string) error {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return add(name, cpio.TypeReg|0o755, data)
	}
	// The kernel unpacks an entry only into a directory an earlier entry made.
	dirs := map[string]bool{}
	for _, name := range append([]string{"lib/modules/x", "proc/x", "sys/x", "dev/x", "run/x", "tmp/x"}, slices.Collect(maps.Keys(files))...) {
		for d := path.Dir(strings.TrimPrefix(name, "/")); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var errs []error
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		errs = append(errs, w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755}))
	}
	errs = append(errs, addFile("init", vminit))
	var order []string
	for _, m := range modules {
		name := "lib/modules/" + filepath.Base(m)
		order = append(order, "/"+name)
		errs = append(errs, addFile(name, m))
	}
	errs = append(errs, add("modules", cpio.TypeReg|0o644, []byte(strings.Join(order, "\n")+"\n")))
	for name, src := range files {
		errs = append(errs, addFile(strings.TrimPrefix(name, "/"), src))
	}
	errs = append(errs, add("args", cpio.TypeReg|0o644, []byte(strings.Join(args, "\n")+"\n")))
	errs = append(errs, w.Close(), f.Close())
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("armvm: initramfs: %w", err)
		}
	}
	return nil
}

// Boot starts the machine: one emulated Cortex-A57 with 512 MiB, its serial console on
// console, every host loopback port reachable at HostAddress, and each of hostfwd (QEMU's
// form, "tcp:127.0.0.1:<host port>-:<guest port>") forwarded into it. The machine powers off
// when vminit's command exits; cancel ctx to stop it sooner.
func Boot(ctx context.Context, k Kernel, initramfs string, console io.Writer, hostfwd ...string) (*exec.Cmd, error) {
	netdev := "user,id=net0"
	for _, f := range hostfwd {
		netdev += ",hostfwd=" + f
	}
	cmd := exec.CommandContext(ctx, "qemu-system-aarch64",
		"-machine", "virt", "-cpu", "cortex-a57", "-smp", "1", "-m", "512",
		"-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", k.Image, "-initrd", initramfs,
		"-append", "console=ttyAMA0 panic=-1 quiet",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0,romfile=")
	cmd.Stdout, cmd.Stderr = console, console
	return cmd, cmd.Start()
}
