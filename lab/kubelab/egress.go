package kubelab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"kuport.wlz.li/kuport/lab/cluster"
)

// The API server lives in the root namespace and the kubelets in node namespaces, so it
// cannot dial a kubelet (logs, exec, port-forward, attach) by itself. Its egress selector
// sends that traffic as HTTP CONNECT requests to a unix socket instead, and kubeletProxy
// answers them by connecting from inside the node namespace that holds the address
// (socat, entered with ip netns exec), as konnectivity does for clusters whose control plane
// cannot reach the nodes.

// EgressSelectorConfig is the API server's --egress-selector-config-file content for a
// proxy listening on socket.
func EgressSelectorConfig(socket string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: %s
`, socket)
}

// EgressSocket is where the lab's kubelet proxy listens; the API server's egress selector
// names it, so it is fixed.
var EgressSocket = filepath.Join(cluster.DefaultDir, "kubelet-proxy.sock")

// kubeletProxy serves HTTP CONNECT on a unix socket, tunnelling each connection to
// host:port from inside the namespace nsOf(host) names.
type kubeletProxy struct {
	ln   net.Listener
	nsOf func(host string) (string, bool)
	wg   sync.WaitGroup
}

// startKubeletProxy listens on socket; nsOf names the node namespace holding host (the
// kubelet's address, the API server dials InternalIP first).
func startKubeletProxy(socket string, nsOf func(string) (string, bool)) (*kubeletProxy, error) {
	_ = os.Remove(socket)
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("kubelab: kubelet proxy: %w", err)
	}
	p := &kubeletProxy{ln: ln, nsOf: nsOf}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Tunnels end with their connections (or the API server); close waits only
			// for the accept loop.
			go p.serve(c)
		}
	})
	return p, nil
}

func (p *kubeletProxy) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		return
	}
	host, _, err := net.SplitHostPort(req.Host)
	ns, ok := p.nsOf(host)
	if err != nil || !ok {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "socat", "STDIO", "TCP:"+req.Host)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return
	}
	if err := cmd.Start(); err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer func() { _ = cmd.Wait() }()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(stdin, br); _ = stdin.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, stdout); done <- struct{}{} }()
	<-done
	cancel()
}

func (p *kubeletProxy) close() {
	_ = p.ln.Close()
	p.wg.Wait()
}
