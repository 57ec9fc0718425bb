package kubelab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

const cgroupFS = "/sys/fs/cgroup"

// cgroupPrefix names every node's cgroupRoot (node.cgroupName).
const cgroupPrefix = "kuport-lab-"

// kubeletSysctls are the global settings every kubelet start rewrites
// (docs/design/lab.md#a-real-node-kubelet-and-containerd).
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// runtimeDirs are the container runtime's default directories, which it creates whatever
// its config says; removed at teardown only when the lab created them (a marker says so).
var runtimeDirs = []string{"/run/containerd", "/var/lib/cni"}

func readKubeletSysctls() (map[string]string, error) {
	out := map[string]string{}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return nil, fmt.Errorf("kubelab: read sysctl: %w", err)
		}
		out[k] = strings.TrimSpace(string(b))
	}
	return out, nil
}

func writeKubeletSysctls(vals map[string]string) error {
	var errs []error
	for k, v := range vals {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("kubelab: restore sysctl %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies lists the mounted cgroup hierarchies: every v1 one and the unified one
// (of a hybrid host, or alone on a v2 host), from the mount table.
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: id parent major:minor root mountpoint options ... - fstype source ...
		left, right, ok := strings.Cut(sc.Text(), " - ")
		fields, fstype := strings.Fields(left), strings.Fields(right)
		if !ok || len(fields) < 5 || len(fstype) == 0 {
			continue
		}
		v1 := fstype[0] == "cgroup" && strings.HasPrefix(fields[4], cgroupFS+"/")
		unified := fstype[0] == "cgroup2" && (fields[4] == cgroupFS || strings.HasPrefix(fields[4], cgroupFS+"/"))
		if v1 || unified {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// createCgroup creates name in every hierarchy, as the kubelet expects its cgroupRoot to
// exist; the cpuset hierarchy needs cpus and mems copied from its parent before a process
// can join.
func createCgroup(name string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		if err := os.MkdirAll(filepath.Join(h, name), 0o755); err != nil {
			return fmt.Errorf("kubelab: cgroup %s: %w", name, err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(h, name, f), b, 0o644); err != nil {
				return fmt.Errorf("kubelab: %s: %w", f, err)
			}
		}
	}
	return nil
}

// markRuntimeDirs records which of runtimeDirs the lab is about to create.
func markRuntimeDirs() error {
	if err := os.MkdirAll(StateRoot, 0o755); err != nil {
		return err
	}
	for _, d := range runtimeDirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			if err := os.WriteFile(runtimeMarker(d), nil, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func runtimeMarker(dir string) string {
	return filepath.Join(StateRoot, ".created"+strings.ReplaceAll(dir, "/", "-"))
}

// RemoveLeftovers removes whatever a crashed kubelet-backed lab left on the machine (see
// removeLeftovers); for `make lab-down`, holding the lab lock.
func RemoveLeftovers(log hclog.Logger) error { return removeLeftovers(log) }

// removeLeftovers kills every process left in the lab's cgroups (containers, pause
// processes) and every containerd shim serving a lab containerd, unmounts everything under
// the lab's state, removes the cgroups depth-first, the state and the runtime directories the
// lab created. It is safe to call when nothing is left.
func removeLeftovers(log hclog.Logger) error {
	var errs []error
	killLabProcesses(log)
	errs = append(errs, unmountUnder(StateRoot), unmountUnder(labKubeDir))
	errs = append(errs, removeCgroups())
	for _, d := range runtimeDirs {
		if _, err := os.Stat(runtimeMarker(d)); err == nil {
			errs = append(errs, unmountUnder(d), os.RemoveAll(d))
		}
	}
	errs = append(errs, os.RemoveAll(StateRoot), os.RemoveAll(labKubeDir))
	return errors.Join(errs...)
}

// killLabProcesses SIGKILLs the processes in any kuport-lab-* cgroup and the shims of the
// lab's containerds (named by their socket under labKubeDir), then waits briefly for them.
func killLabProcesses(log hclog.Logger) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var killed []int
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join(p, "cgroup"))
		cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		shim := strings.Contains(string(cmd), "containerd-shim") && strings.Contains(string(cmd), labKubeDir)
		if shim || strings.Contains(string(cg), "/"+cgroupPrefix) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed = append(killed, pid)
			}
		}
	}
	if len(killed) > 0 {
		log.Debug("killed leftover runtime processes", "pids", killed)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range killed {
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes every kuport-lab-* cgroup in every hierarchy, children first.
func removeCgroups() error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		tops, _ := filepath.Glob(filepath.Join(h, cgroupPrefix+"*"))
		for _, top := range tops {
			var dirs []string
			_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for _, d := range slices.Backward(dirs) {
				if err := rmdirRetry(d); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// rmdirRetry removes an empty cgroup, retrying while its last processes are being reaped.
func rmdirRetry(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}
