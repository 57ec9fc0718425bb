// Command kuport-controller watches the kuport API and the objects it refers to, compiles one
// program per node and streams it to the node agents over gRPC (DESIGN.md, "Shape").
//
//	kuport-controller [--kubeconfig PATH] [--grpc-listen ADDR]... [--link-retention 24h] [--log-level info]
//
// --grpc-listen is repeatable: "unix:///run/kuport/controller.sock" (the default) or
// "127.0.0.1:7443". SIGTERM or SIGINT stops it gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kuport.wlz.li/kuport/controller"
	"kuport.wlz.li/kuport/controller/agents"
)

const defaultListen = "unix:///run/kuport/controller.sock"

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kuport-controller:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kuport-controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig path; empty uses the in-cluster service account")
	var listen listFlag
	fs.Var(&listen, "grpc-listen", "gRPC listen address, repeatable: unix:///path or host:port (default "+defaultListen+")")
	retention := fs.Duration("link-retention", controller.DefaultLinkRetention, "how long an unused link slot claim is kept")
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if len(listen) == 0 {
		listen = listFlag{defaultListen}
	}
	lvl := hclog.LevelFromString(*level)
	if lvl == hclog.NoLevel {
		return fmt.Errorf("unknown --log-level %q", *level)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "kuport-controller", Level: lvl, Output: os.Stderr})

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}

	start := time.Now()
	ctl, err := controller.New(controller.Config{
		Kube: kube, Dynamic: dyn, Epoch: uint64(start.Unix()), Start: start,
		LinkRetention: *retention, Log: log,
	})
	if err != nil {
		return err
	}
	srv := agents.NewServer(ctl.Registry(), log.Named("grpc"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var wg sync.WaitGroup
	for _, addr := range listen {
		lis, err := agents.Listen(addr)
		if err != nil {
			cancel(err)
			break
		}
		log.Info("grpc listening", "address", addr)
		wg.Go(func() {
			if err := srv.Serve(lis); err != nil {
				cancel(err)
			}
		})
	}
	wg.Go(func() {
		if err := ctl.Run(ctx); err != nil {
			cancel(err)
		}
	})

	<-ctx.Done()
	log.Info("stopping", "cause", context.Cause(ctx))
	srv.Stop()
	wg.Wait()
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// restConfig loads the kubeconfig at path, or the in-cluster config when path is empty.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (pass --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}
