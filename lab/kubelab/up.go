package kubelab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kuport.wlz.li/kuport/build/imagepack"
	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/netlab"
)

// Lab image names: the pod server (kuport-lab serve) and CoreDNS, packed here from the
// lab's binaries, and the sandbox image `make lab-images` packs.
const (
	PauseImage   = "kuport.lab/pause:1"
	LabToolImage = "kuport.lab/labtool:1"
	CoreDNSImage = "kuport.lab/coredns:1"
)

// Options says where the kubelet-backed lab finds its binaries and images.
type Options struct {
	// K8sBin is lab/build-binaries.sh's output; Bin holds `make build`'s binaries (kuport-lab).
	K8sBin, Bin string
	// Images are the image tarballs to import on every node besides the lab's own
	// (`make images` and `make lab-images`: bin/images/*.tar); the sandbox image
	// (PauseImage, `make lab-images`) must be among them.
	Images []string
	Log    hclog.Logger
}

// Lab is the network lab, the API server and the kubelet-backed cluster together.
type Lab struct {
	Net     *netlab.Net
	API     *cluster.Cluster
	Cluster *Cluster
	Kube    kubernetes.Interface
	Dyn     dynamic.Interface

	closeOnce sync.Once
	closeErr  error
}

// Up builds the lab network (proving its emulations bite, then leaving the pod network to
// real Flannel), starts etcd and the API server and then the cluster's nodes, Flannel and
// CoreDNS. Nothing of kuport is installed: that is the caller's `kubectl apply -k`. On
// error everything started is torn down.
func Up(ctx context.Context, opt Options) (*Lab, error) {
	if opt.Log == nil {
		opt.Log = hclog.NewNullLogger()
	}
	l := &Lab{}
	if err := l.up(ctx, opt); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context, opt Options) error {
	logs := filepath.Join(cluster.DefaultDir, "logs")
	var err error
	l.Net, err = netlab.Build(ctx, netlab.Config{Log: opt.Log.Named("net"), Dir: logs, ToolBin: filepath.Join(opt.Bin, "kuport-lab"),
		// Real Flannel replaces the flannel profile's emulation once the self-check ran.
		CNI: netlab.CNIFlannel})
	if err != nil {
		return err
	}
	// Holding the lab lock now: whatever a crashed run left may go.
	if err := cluster.StopDir(cluster.DefaultDir); err != nil {
		return fmt.Errorf("kubelab: stop leftovers: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(cluster.DefaultDir, "etcd")); err != nil {
		return err
	}
	opt.Log.Info("proving the mesh and CNI emulations bite")
	if err := l.Net.SelfCheck(ctx); err != nil {
		return fmt.Errorf("kubelab: self-check: %w", err)
	}
	if err := l.Net.RemoveCNIEmulation(ctx); err != nil {
		return fmt.Errorf("kubelab: %w", err)
	}
	opt.Log.Info("starting etcd and kube-apiserver")
	egress := filepath.Join(cluster.DefaultDir, "egress-selector.yaml")
	if err := os.WriteFile(egress, []byte(EgressSelectorConfig(EgressSocket)), 0o644); err != nil {
		return err
	}
	l.API, err = cluster.Start(ctx, cluster.Config{
		Dir: cluster.DefaultDir, BinDir: opt.K8sBin, Log: opt.Log.Named("cluster"),
		ExtraArgs: []string{"--egress-selector-config-file=" + egress, "--kubelet-preferred-address-types=InternalIP"},
	})
	if err != nil {
		return err
	}
	if l.Kube, err = kubernetes.NewForConfig(l.API.RESTConfig()); err != nil {
		return err
	}
	if l.Dyn, err = dynamic.NewForConfig(l.API.RESTConfig()); err != nil {
		return err
	}
	own, err := packLabImages(opt)
	if err != nil {
		return err
	}
	opt.Log.Info("starting the nodes' containerd, kubelet and kube-proxy")
	l.Cluster, err = Start(ctx, Config{
		Net: l.Net, API: l.API, K8sBin: opt.K8sBin, Images: append(own, opt.Images...),
		PauseImage: PauseImage, CoreDNSImage: CoreDNSImage, Log: opt.Log.Named("kube"),
	})
	return err
}

// packLabImages packs the pod server and CoreDNS images into the lab dir.
func packLabImages(opt Options) ([]string, error) {
	dir := filepath.Join(cluster.DefaultDir, "lab-images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	specs := []imagepack.ImageSpec{
		{Name: LabToolImage, Files: map[string]imagepack.File{"/kuport-lab": {Src: filepath.Join(opt.Bin, "kuport-lab"), Mode: 0o755}}, Entrypoint: []string{"/kuport-lab"}, User: "0:0"},
		{Name: CoreDNSImage, Files: map[string]imagepack.File{"/coredns": {Src: filepath.Join(opt.K8sBin, "coredns"), Mode: 0o755}}, Entrypoint: []string{"/coredns"}, User: "0:0"},
	}
	var out []string
	for _, s := range specs {
		path := filepath.Join(dir, filepath.Base(s.Files[s.Entrypoint[0]].Src)+".tar")
		if _, err := imagepack.Build(s, path); err != nil {
			return nil, fmt.Errorf("kubelab: pack %s: %w", s.Name, err)
		}
		out = append(out, path)
	}
	return out, nil
}

// Close tears down the cluster, the API server and the network, in that order.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		if l.Cluster != nil {
			errs = append(errs, l.Cluster.Close())
		}
		if l.API != nil {
			errs = append(errs, l.API.Stop())
		}
		if l.Net != nil {
			errs = append(errs, l.Net.Close())
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}
