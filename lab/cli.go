package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/kubelab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// ErrFailed is returned by Demo when a scenario failed.
var ErrFailed = errors.New("a scenario failed")

func parseOptions(name string, args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opt Options
	fs.StringVar(&opt.Dir, "dir", cluster.DefaultDir, "the lab's state dir")
	fs.StringVar(&opt.K8sBin, "k8s-bin", "", "dir holding etcd, kube-apiserver and kubectl (lab/build-binaries.sh)")
	fs.StringVar(&opt.Bin, "bin", "bin", "dir holding kuport-controller, kuport-agent and kuport-lab")
	fs.StringVar(&opt.CRDDir, "crds", "deploy/crds", "dir of the CRD YAMLs")
	fs.StringVar(&opt.RBACFile, "rbac", "deploy/rbac.yaml", "ServiceAccounts and RBAC to install; the controller runs as kuport-controller")
	fs.IntVar(&opt.ControllerReplicas, "controller-replicas", 1, "controller replicas to run under leader election; every agent gets them all")
	fs.BoolVar(&opt.Kubelet, "kubelet", false, "up: run the kubelet-backed cluster and install kuport with kubectl apply -k instead")
	fs.StringVar(&opt.Images, "images", "bin/images", "with --kubelet: dir of `make images` and `make lab-images` tarballs")
	fs.BoolVar(&opt.HostFirewall, "host-firewall", false, "put a Talos-like block-mode firewall and a netbird-like mark-and-drop pair on every node")
	cni := fs.String("cni", string(netlab.CNICilium), "the namespace lab's CNI profile: cilium, flannel or calico (pod devices and the CNI's own masquerade rules); the kubelet-backed lab runs real Flannel")
	level := fs.String("log-level", "info", "log level of stderr")
	if err := fs.Parse(args); err != nil {
		return opt, err
	}
	var err error
	if opt.CNI, err = netlab.ParseCNI(*cni); err != nil {
		return opt, err
	}
	if opt.Kubelet && flagSet(fs, "cni") {
		return opt, fmt.Errorf("--cni %s: the kubelet-backed lab runs real Flannel, not a CNI profile", opt.CNI)
	}
	opt.Log = hclog.New(&hclog.LoggerOptions{Name: "lab", Level: hclog.LevelFromString(*level), Output: stderr})
	return opt, nil
}

// flagSet says whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// upDemo parses a subcommand's flags, starts the lab and writes the demo's classes and
// pods; on error nothing is left running.
func upDemo(ctx context.Context, name string, args []string, stderr io.Writer) (*Lab, Options, error) {
	opt, err := parseOptions(name, args, stderr)
	if err != nil {
		return nil, opt, err
	}
	l, err := Up(ctx, opt)
	if err != nil {
		return nil, opt, err
	}
	if err := l.SetupDemo(ctx); err != nil {
		return nil, opt, errors.Join(err, l.Close())
	}
	if opt.HostFirewall {
		for _, n := range l.Net.Nodes() {
			if err := l.Net.AddHostFirewall(ctx, n.Name); err != nil {
				return nil, opt, errors.Join(err, l.Close())
			}
		}
	}
	return l, opt, nil
}

// Demo runs `make demo`: it starts the lab, runs the demo scenarios, prints one SCENARIO
// line each to stdout and tears everything down on every exit path. It returns ErrFailed
// when any scenario failed.
func Demo(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	l, _, err := upDemo(ctx, "demo", args, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	outcomes, runErr := l.RunDemo(ctx)
	failed := false
	for _, o := range outcomes {
		_, _ = fmt.Fprintln(stdout, o.Line())
		failed = failed || !o.Pass()
	}
	if runErr != nil {
		return runErr
	}
	if failed {
		return ErrFailed
	}
	return nil
}

const (
	// supervisorPid holds the supervisor's pid; not named *.pid, which lab/cluster's StopDir
	// (run by Up on leftovers) would stop: the supervisor itself.
	supervisorPid = "supervisor-pid"
	readyFile     = "ready"
)

// UpDetached runs `make lab-up`: it starts `kuport-lab run` in its own session so the lab
// outlives the command, and returns once the lab is ready (or the supervisor failed).
func UpDetached(ctx context.Context, args []string, stderr io.Writer) error {
	opt, err := parseOptions("up", args, stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(opt.Dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(opt.Dir, readyFile))
	logPath := filepath.Join(opt.Dir, "lab.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{"run"}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the lab supervisor: %w", err)
	}
	if err := os.WriteFile(filepath.Join(opt.Dir, supervisorPid), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the lab supervisor exited (%v); see %s", err, logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if _, err := os.Stat(filepath.Join(opt.Dir, readyFile)); err == nil {
				_, _ = fmt.Fprintf(stderr, "lab is up; logs in %s; `source lab/env` to use kubectl and grpcurl; `make lab-down` to stop it\n", opt.Dir)
				return nil
			}
		}
	}
}

// Run is the lab supervisor behind UpDetached: it starts the lab with the demo's classes
// and the `remote` mapping, marks the lab ready and keeps it until ctx ends (SIGTERM from
// Down), then tears it down.
func Run(ctx context.Context, args []string, stderr io.Writer) (err error) {
	opt, err := parseOptions("run", args, stderr)
	if err != nil {
		return err
	}
	if opt.Kubelet {
		return runKubelet(ctx, opt)
	}
	l, opt, err := upDemo(ctx, "run", args, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	remote := DemoScenarios()[1]
	if err := l.StartScenario(ctx, remote); err != nil {
		return err
	}
	if state, err := l.WaitProgrammed(ctx, DemoNamespace, remote.Name, "True", time.Minute); err != nil {
		return fmt.Errorf("mapping %s not programmed (%s): %w", remote.Name, state, err)
	}
	if err := os.WriteFile(filepath.Join(opt.Dir, readyFile), nil, 0o644); err != nil {
		return err
	}
	opt.Log.Info("lab ready")
	<-ctx.Done()
	opt.Log.Info("stopping the lab")
	return nil
}

// Down runs `make lab-down`: it stops the supervisor (which tears the lab down), then
// removes whatever a crashed supervisor left, provided no other lab has taken the lab lock
// meanwhile (a `make test` or `make demo` that was waiting for it): that one is left
// alone, with a note on stderr.
func Down(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", cluster.DefaultDir, "the lab's state dir")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pidPath := filepath.Join(*dir, supervisorPid)
	if b, err := os.ReadFile(pidPath); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && syscall.Kill(pid, syscall.SIGTERM) == nil {
			_ = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				return syscall.Kill(pid, 0) != nil, nil
			})
		}
		_ = os.Remove(pidPath)
	}
	_ = os.Remove(filepath.Join(*dir, readyFile))
	err := netlab.WhileFree(func() error {
		return errors.Join(cluster.StopDir(*dir), netlab.Teardown(), kubelab.RemoveLeftovers(hclog.NewNullLogger()))
	})
	if errors.Is(err, netlab.ErrLabRunning) {
		_, _ = fmt.Fprintf(stderr, "lab-down: %v; left it alone\n", err)
		return nil
	}
	return err
}

// runKubelet is Run for `up --kubelet`: the kubelet-backed cluster with kuport installed by
// `kubectl apply -k` of the example install (examples/install) pinned to the images' tag,
// kept until ctx ends.
func runKubelet(ctx context.Context, opt Options) (err error) {
	images, err := filepath.Glob(filepath.Join(opt.Images, "*.tar"))
	if err != nil || len(images) == 0 {
		return fmt.Errorf("no image tarballs in %s: run make images lab-images", opt.Images)
	}
	repository, tag, err := kubelab.ImageRef(filepath.Join(opt.Images, "kuport-agent.tar"))
	if err != nil {
		return err
	}
	repo, err := filepath.Abs(".")
	if err != nil {
		return err
	}
	l, err := kubelab.Up(ctx, kubelab.Options{K8sBin: opt.K8sBin, Bin: opt.Bin, Images: images, Log: opt.Log})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	checkout := filepath.Join(opt.Dir, "checkout")
	if err := os.RemoveAll(checkout); err != nil {
		return err
	}
	if err := kubelab.Checkout(checkout, repo, repository, tag); err != nil {
		return err
	}
	install := filepath.Join(checkout, "examples/install")
	opt.Log.Info("installing kuport", "kustomization", install)
	if err := l.Cluster.Install(ctx, install); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(opt.Dir, readyFile), nil, 0o644); err != nil {
		return err
	}
	opt.Log.Info("lab ready")
	<-ctx.Done()
	opt.Log.Info("stopping the lab")
	return nil
}
