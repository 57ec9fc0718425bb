package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// stopGrace is how long a process gets between SIGTERM and SIGKILL; the apiserver and
	// etcd shut down in well under a second when idle.
	stopGrace = 5 * time.Second
	// killWait bounds the wait after SIGKILL, which only an uninterruptible sleep outlasts.
	killWait = 5 * time.Second
	// exitPoll is how often StopDir looks in /proc for a process it does not parent.
	exitPoll = 20 * time.Millisecond
)

// process is one control-plane binary this package started. done is closed once it has
// exited and been reaped.
type process struct {
	name    string
	pid     int
	pidFile string
	done    chan struct{}
}

// startProcess starts bin with args, stdout and stderr appended to dir/<name>.log, in its own
// process group; attached processes also get SIGKILL when the starting thread dies, detached
// ones start a new session and outlive the caller. It records the pid in dir/<name>.pid.
func startProcess(dir, name, bin string, args []string, detached bool) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	defer func() { _ = logFile.Close() }() // the child holds its own copy of the descriptor

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is in the log; Wait only reaps
		close(p.done)
	}()
	p.pidFile, err = WritePidFile(dir, name, p.pid)
	if err != nil {
		_ = terminate(p.pid, p.done)
		return nil, err
	}
	return p, nil
}

// WritePidFile records pid as dir/<name>.pid in the form "<pid> <start time in clock ticks>",
// so StopDir never signals a process that merely reuses the number. Other lab processes that
// `make lab-down` must stop write their pid files with it too. It returns the file's path.
func WritePidFile(dir, name string, pid int) (string, error) {
	start, err := processStartTime(pid)
	if err != nil {
		return "", fmt.Errorf("pid file for %s: %w", name, err)
	}
	path := filepath.Join(dir, name+".pid")
	if err := os.WriteFile(path, fmt.Appendf(nil, "%d %d\n", pid, start), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// StopDir stops every process recorded in a dir/*.pid file, the last started first (so the
// apiserver goes before etcd), with SIGTERM to its process group then SIGKILL after a grace
// period, and removes the pid files. A pid file whose process is gone, or whose pid now
// belongs to another process, is just removed. Used by `make lab-down` for a lab left running
// by a detached Start. Every process is tried; their errors are joined.
func StopDir(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return fmt.Errorf("list pid files: %w", err)
	}
	type entry struct {
		path    string
		pid     int
		start   uint64
		readErr error
	}
	entries := make([]entry, 0, len(files))
	for _, f := range files {
		pid, start, err := readPidFile(f)
		entries = append(entries, entry{f, pid, start, err})
	}
	// Pid files are written within the same clock tick, so order by process start, then pid.
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].start != entries[j].start {
			return entries[i].start > entries[j].start
		}
		return entries[i].pid > entries[j].pid
	})

	var errs []error
	for _, e := range entries {
		if e.readErr != nil {
			errs = append(errs, e.readErr)
			continue
		}
		if err := stopPidFile(e.path, e.pid, e.start); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func stopPidFile(path string, pid int, start uint64) error {
	if alive(pid, start) {
		stop := make(chan struct{})
		defer close(stop)
		if err := terminate(pid, watchExit(pid, start, stop)); err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(path), err)
		}
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove pid file: %w", err)
	}
	return nil
}

// runningPids returns the pids recorded in dir/*.pid whose processes are still alive.
func runningPids(dir string) ([]int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return nil, fmt.Errorf("list pid files: %w", err)
	}
	var pids []int
	for _, f := range files {
		pid, start, err := readPidFile(f)
		if err != nil {
			return nil, err
		}
		if alive(pid, start) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func readPidFile(path string) (pid int, start uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("read pid file: %w", err)
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0, fmt.Errorf("pid file %s: want \"<pid> <start>\", got %q", path, b)
	}
	if pid, err = strconv.Atoi(fields[0]); err != nil || pid <= 0 {
		return 0, 0, fmt.Errorf("pid file %s: bad pid %q", path, fields[0])
	}
	if start, err = strconv.ParseUint(fields[1], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("pid file %s: bad start time: %w", path, err)
	}
	return pid, start, nil
}

// terminate sends SIGTERM to the process group led by pid, waits up to stopGrace for exited
// to close, then sends SIGKILL and waits up to killWait. A group already gone is success.
func terminate(pid int, exited <-chan struct{}) error {
	if err := syscall.Kill(-pid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		<-exited // only the reaping (or its /proc view) is left
		return nil
	} else if err != nil {
		return fmt.Errorf("SIGTERM %d: %w", pid, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(stopGrace):
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGKILL %d: %w", pid, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("process %d did not exit after SIGKILL", pid)
	}
}

// watchExit returns a channel closed once the process (pid, start) no longer runs, polling
// /proc because StopDir's caller is usually not its parent. Closing stop ends the watch.
func watchExit(pid int, start uint64, stop <-chan struct{}) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		t := time.NewTicker(exitPoll)
		defer t.Stop()
		for alive(pid, start) {
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
		close(gone)
	}()
	return gone
}

// alive reports whether pid is a running (not zombie) process that started at start.
func alive(pid int, start uint64) bool {
	state, got, err := procStat(pid)
	return err == nil && got == start && state != "Z" && state != "X"
}

func processStartTime(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// procStat reads the state and start time (clock ticks since boot, field 22) of pid from
// /proc/<pid>/stat, parsing after the last ')' since the command name may hold spaces.
func procStat(pid int) (state string, start uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("stat of %d: no command name", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
	if len(fields) < 20 {
		return "", 0, fmt.Errorf("stat of %d: %d fields", pid, len(fields))
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("stat of %d: start time: %w", pid, err)
	}
	return fields[0], start, nil
}
