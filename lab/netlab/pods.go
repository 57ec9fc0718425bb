package netlab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"kuport.wlz.li/kuport/lab/labtool"
)

// ProbeResult is what one probe from the client learned: the peer address the pod saw
// and the ip:port the reply came from ("" when nothing came back).
type ProbeResult = labtool.ProbeResult

// pod is what the Net records of a pod it added.
type pod struct {
	node string
	addr netip.Addr
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// serveReady bounds how long Serve waits for the server to bind its socket.
const serveReady = 10 * time.Second

// AddPod creates namespace pod-<name> holding eth0 at ip (with the node's pod CIDR
// length, default route via the node's cilium_host address), a veth whose node end
// (lxc + 8 hex digits of sha256(name), as Cilium names its devices) is enslaved to the
// node's cilium_host bridge. name is a DNS label; ip must be a free host address inside
// the node's pod CIDR. It returns once the pod's link forwards.
func (n *Net) AddPod(ctx context.Context, name, node, ip string) error {
	if !dnsLabel.MatchString(name) {
		return fmt.Errorf("netlab: pod name %q: want a DNS label", name)
	}
	spec, ok := n.Node(node)
	if !ok {
		return fmt.Errorf("netlab: pod %s: unknown node %q", name, node)
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("netlab: pod %s: %w", name, err)
	}
	cidr := spec.PodCIDR.Masked()
	if !cidr.Contains(addr) || addr == cidr.Addr() || addr == spec.CiliumHost().Addr() || !cidr.Contains(addr.Next()) {
		return fmt.Errorf("netlab: pod %s: %s is not a pod address in %s", name, addr, cidr)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return errors.New("netlab: AddPod after Close")
	}
	if _, dup := n.pods[name]; dup {
		n.mu.Unlock()
		return fmt.Errorf("netlab: pod %s exists", name)
	}
	for other, p := range n.pods {
		if p.addr == addr {
			n.mu.Unlock()
			return fmt.Errorf("netlab: pod %s: %s is taken by pod %s", name, addr, other)
		}
	}
	n.pods[name] = pod{node: node, addr: addr}
	n.mu.Unlock()

	if err := n.buildPod(ctx, name, spec, netip.PrefixFrom(addr, cidr.Bits())); err != nil {
		return errors.Join(fmt.Errorf("netlab: pod %s: %w", name, err), n.RemovePod(name))
	}
	return nil
}

func (n *Net) buildPod(ctx context.Context, name string, spec NodeSpec, addr netip.Prefix) error {
	ns := PodNSPrefix + name
	if _, err := n.command(ctx, "", "", "ip", "netns", "add", ns); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(name))
	hostEnd := "lxc" + hex.EncodeToString(sum[:])[:8]
	steps := [][]string{
		{ns, "link", "set", "lo", "up"},
		{spec.Name, "link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{spec.Name, "link", "set", hostEnd, "master", CNIDevice, "up"},
		{ns, "addr", "add", addr.String(), "dev", "eth0"},
		{ns, "link", "set", "eth0", "up"},
		{ns, "route", "add", "default", "via", spec.CiliumHost().Addr().String()},
		// A pod address used before on this node may still sit in the node's neighbour
		// cache with the old pod's MAC, which would black-hole the new pod for seconds; a
		// CNI forgets it when the old pod goes, and so does the lab.
		{spec.Name, "neigh", "flush", "to", addr.Addr().String()},
	}
	for _, st := range steps {
		if err := n.ip(ctx, st[0], st[1:]...); err != nil {
			return err
		}
	}
	if err := n.waitLinks(ctx, spec.Name); err != nil {
		return err
	}
	return n.waitLinks(ctx, ns)
}

// RemovePod kills the processes the Net started in the pod and deletes its namespace
// (the veth goes with it). An unknown pod is success.
func (n *Net) RemovePod(name string) error {
	ns := PodNSPrefix + name
	for _, p := range n.procsIn(ns) {
		p.Kill()
	}
	n.mu.Lock()
	_, known := n.pods[name]
	delete(n.pods, name)
	n.mu.Unlock()
	if !known {
		return nil
	}
	if err := deleteNamespace(ns); err != nil {
		return fmt.Errorf("netlab: remove pod %s: %w", name, err)
	}
	return nil
}

// serverLogPath is Dir/serve-<pod>-<proto>-<port>.log.
func (n *Net) serverLogPath(pod, proto string, port int) string {
	return filepath.Join(n.dir, fmt.Sprintf("serve-%s-%s-%d.log", pod, proto, port))
}

// Serve starts `kuport-lab serve --proto proto --port port` in pod's namespace, logging
// to a fresh Dir/serve-<pod>-<proto>-<port>.log, and returns once the socket is bound
// (or an error if the server exits or does not bind within serveReady).
func (n *Net) Serve(pod, proto string, port int) (*Proc, error) {
	n.mu.Lock()
	_, known := n.pods[pod]
	n.mu.Unlock()
	if !known {
		return nil, fmt.Errorf("netlab: serve: unknown pod %q", pod)
	}
	logFile := n.serverLogPath(pod, proto, port)
	if err := os.Remove(logFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("netlab: serve: %w", err)
	}
	p, err := n.Start(PodNSPrefix+pod, logFile, n.toolBin, "serve", "--proto", proto, "--port", strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	ready := labtool.ListeningLine(proto, port)
	deadline := time.After(serveReady)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if log, err := os.ReadFile(logFile); err == nil && strings.Contains(string(log), ready) {
			return p, nil
		}
		select {
		case <-p.Done():
			log, _ := os.ReadFile(logFile)
			return nil, fmt.Errorf("netlab: serve %s %s/%d exited: %v: %s", pod, proto, port, p.exitErr(), strings.TrimSpace(string(log)))
		case <-deadline:
			p.Kill()
			return nil, fmt.Errorf("netlab: serve %s %s/%d: not listening after %s", pod, proto, port, serveReady)
		case <-tick.C:
		}
	}
}

// ServerLog returns what the server Serve started for pod/proto/port has logged so far:
// a `listening` line, then one `saw <peer ip:port> <proto> <port>` line per request.
func (n *Net) ServerLog(pod, proto string, port int) (string, error) {
	b, err := os.ReadFile(n.serverLogPath(pod, proto, port))
	if err != nil {
		return "", fmt.Errorf("netlab: server log: %w", err)
	}
	return string(b), nil
}

// Probe runs `kuport-lab probe` in the client namespace against dst (ip:port) over proto
// (tcp|udp), waiting at most timeout for the reply. Nothing coming back is not an error:
// the result's fields are then "".
func (n *Net) Probe(ctx context.Context, proto, dst string, timeout time.Duration) (ProbeResult, error) {
	out, err := n.Exec(ctx, ClientNS, n.toolBin, "probe", "--proto", proto, "--to", dst, "--timeout", timeout.String())
	if err != nil {
		return ProbeResult{}, fmt.Errorf("netlab: probe: %w", err)
	}
	res, err := labtool.ParseProbeResult(out)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("netlab: probe: %w", err)
	}
	return res, nil
}
