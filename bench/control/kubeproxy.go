package main

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"kuport.wlz.li/kuport/bench/labbench"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/kubelab"
	"kuport.wlz.li/kuport/lab/netlab"
)

// kube-proxy v1.36.3 in nftables mode on one lab node, as lab/kubelab runs it on the
// kubelet-backed cluster, reaching the lab's API server through a bridge this process holds.
const (
	kubeProxyTable  = "kube-proxy"
	kubeProxyFamily = nftables.TableFamilyIPv4
	// nodePortsMap is kube-proxy's map of every NodePort (proxier.go, serviceNodePortsMap).
	nodePortsMap = "service-nodeports"
	// hairpinSet holds every local endpoint (proxier.go, hairpinConnectionsSet).
	hairpinSet = "hairpin-connections"
	// apiBridgeAddr is where kube-proxy dials the API server inside the node namespace.
	apiBridgeAddr = "127.0.0.1:6443"
)

type kubeProxy struct {
	l      *lab.Lab
	node   string
	dir    string
	bridge net.Listener
	wg     sync.WaitGroup
	proc   *netlab.Proc
}

// newKubeProxy writes kube-proxy's kubeconfig (user system:kube-proxy, which the API
// server's bootstrap RBAC binds to system:node-proxier) and config, and opens the bridge: a
// listener on apiBridgeAddr inside the node's namespace whose connections this process
// carries to the API server on the root namespace's loopback.
func newKubeProxy(l *lab.Lab, node, dir string) (*kubeProxy, error) {
	kp := &kubeProxy{l: l, node: node, dir: dir}
	kubeconfig := filepath.Join(dir, "kube-proxy.kubeconfig")
	if err := l.Cluster.WriteClientKubeconfig(kubeconfig, "https://"+apiBridgeAddr, "system:kube-proxy"); err != nil {
		return nil, err
	}
	conf := kubelab.KubeProxyConfig(kubeconfig, node)
	if err := os.WriteFile(kp.config(), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	u, err := url.Parse(l.Cluster.Server())
	if err != nil {
		return nil, err
	}
	err = labbench.InNS(node, func() (err error) {
		kp.bridge, err = net.Listen("tcp", apiBridgeAddr)
		return err
	})
	if err != nil {
		return nil, err
	}
	kp.wg.Go(func() {
		for {
			c, err := kp.bridge.Accept()
			if err != nil {
				return
			}
			go relay(c, u.Host)
		}
	})
	return kp, nil
}

func (kp *kubeProxy) config() string { return filepath.Join(kp.dir, "kube-proxy.yaml") }

// start runs kube-proxy (the caller has removed its tables, so it starts from nothing).
func (kp *kubeProxy) start(k8sBin string) error {
	p, err := kp.l.Net.StartShared(kp.node, filepath.Join(kp.dir, "kube-proxy.log"),
		filepath.Join(k8sBin, "kube-proxy"), "--config="+kp.config(), "--v=1")
	if err != nil {
		return err
	}
	kp.proc = p
	return nil
}

// stop stops kube-proxy; its tables stay.
func (kp *kubeProxy) stop() error {
	if kp.proc == nil {
		return nil
	}
	p := kp.proc
	kp.proc = nil
	return p.Stop()
}

func (kp *kubeProxy) close() error {
	err := kp.stop()
	_ = kp.bridge.Close()
	kp.wg.Wait()
	return err
}

func relay(c net.Conn, to string) {
	defer func() { _ = c.Close() }()
	up, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		close(done)
	}()
	_, _ = io.Copy(c, up)
	<-done
}

// hairpinKey is the key of kube-proxy's hairpin-connections element for a local TCP
// endpoint (proxier.go, v1.36.3: ip saddr . ip daddr . meta l4proto . th dport, the
// endpoint's address twice), each field padded to 4 bytes. kube-proxy v1.36 DNATs to an
// endpoint from the service chain's anonymous map, with no chain of the endpoint's own; this
// element is written in the same transaction, so it being in the kernel is the change being
// in the kernel.
func hairpinKey(ip netip.Addr, port uint16) []byte {
	a := ip.As4()
	key := make([]byte, 0, 16)
	key = append(key, a[:]...)
	key = append(key, a[:]...)
	key = append(key, unix.IPPROTO_TCP, 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(key, port), 0, 0)
}
