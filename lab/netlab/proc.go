package netlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long Stop waits after SIGTERM before it kills.
const stopGrace = 5 * time.Second

// Proc is a long-running process started by Net.Start.
type Proc struct {
	net   *Net
	netns string
	cmd   *exec.Cmd
	done  chan struct{} // closed once the process has been reaped
	err   error         // cmd.Wait's result, valid once done is closed

	stopOnce sync.Once
	stopErr  error
}

// Start runs args as a long-running process inside netns ("" means the root namespace,
// for the lab's loopback-only processes such as the API server), its stdout and stderr
// appended to logFile. The process leads its own process group and gets SIGKILL if the
// lab process dies; Close kills it.
func (n *Net) Start(netns, logFile string, args ...string) (*Proc, error) {
	if len(args) == 0 {
		return nil, errors.New("netlab: Start needs a command")
	}
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	return n.start(netns, logFile, args)
}

// StartShared is Start for processes that must share the root mount namespace while they run
// in netns: `ip netns exec` gives its command a private mount namespace (to remount /sys),
// which would hide a kubelet's volume mounts from the container runtime
// (docs/design/lab.md#a-real-node-kubelet-and-containerd), so this enters only the network
// namespace, with nsenter.
func (n *Net) StartShared(netns, logFile string, args ...string) (*Proc, error) {
	if len(args) == 0 || netns == "" {
		return nil, errors.New("netlab: StartShared needs a namespace and a command")
	}
	return n.start(netns, logFile, append([]string{"nsenter", "--net=" + filepath.Join(netnsDir, netns), "--"}, args...))
}

func (n *Net) start(netns, logFile string, args []string) (*Proc, error) {
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("netlab: open process log: %w", err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &Proc{net: n, netns: netns, cmd: cmd, done: make(chan struct{})}

	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		_ = log.Close()
		return nil, errors.New("netlab: Start after Close")
	}
	if err := startOnLockedThread(cmd); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("netlab: start %v: %w", args, err)
	}
	n.procs[p] = struct{}{}
	n.log.Debug("started", "pid", cmd.Process.Pid, "netns", netns, "args", args, "log", logFile)
	go func() {
		p.err = cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (of the command itself: `ip netns exec` execs into it).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the process group and waits for it to exit, killing it after
// stopGrace. It returns nil when the process exited cleanly or on the SIGTERM; the exit
// error when it had already failed before Stop, or exited with a failure; an error when
// it had to be killed. Repeated calls return the first result.
func (p *Proc) Stop() error {
	p.stopOnce.Do(func() {
		defer p.net.forget(p)
		select {
		case <-p.done:
			p.stopErr = p.exitErr()
			return
		default:
		}
		_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
		select {
		case <-p.done:
			p.stopErr = p.exitErr()
		case <-time.After(stopGrace):
			p.Kill()
			p.stopErr = fmt.Errorf("pid %d ignored SIGTERM for %s: killed", p.Pid(), stopGrace)
		}
	})
	return p.stopErr
}

// Kill sends SIGKILL to the process group and waits until the process is reaped.
func (p *Proc) Kill() {
	defer p.net.forget(p)
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// exitErr is the process's exit error, nil for a clean exit or death by SIGTERM.
func (p *Proc) exitErr() error {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if p.err != nil {
		return fmt.Errorf("pid %d: %w", p.Pid(), p.err)
	}
	return nil
}

func (n *Net) forget(p *Proc) {
	n.mu.Lock()
	delete(n.procs, p)
	n.mu.Unlock()
}

// procsIn returns the running processes this Net started inside netns.
func (n *Net) procsIn(netns string) []*Proc {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*Proc
	for p := range n.procs {
		if p.netns == netns {
			out = append(out, p)
		}
	}
	return out
}

// forkReqs feeds the one goroutine that starts every process. Pdeathsig fires when the
// *thread* that forked the child exits, and Go ends a thread when a goroutine locked to
// it returns (netns-switching code does that), which would kill a lab process at random.
// Forking from a thread locked for the life of the program keeps Pdeathsig meaning "the
// lab process died".
var (
	forkOnce sync.Once
	forkReqs chan forkReq
)

type forkReq struct {
	cmd *exec.Cmd
	err chan<- error
}

func startOnLockedThread(cmd *exec.Cmd) error {
	forkOnce.Do(func() {
		forkReqs = make(chan forkReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the program
			for r := range forkReqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	forkReqs <- forkReq{cmd: cmd, err: errc}
	return <-errc
}
