package netlab

import (
	"context"
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

// AddPod creates namespace pod-<name> holding eth0 at ip, joined to its node as the lab's
// CNI profile joins pods (CNI.HostEnd names the node end): under cilium and flannel a
// veth on the node's bridge (cilium_host, cni0), eth0 with the pod CIDR's length and a
// default route via the bridge's address; under calico a veth with no bridge, eth0 a /32
// routed via 169.254.1.1, which the node end answers by proxy ARP, and a /32 route to the
// pod on the node. The pod is dual-stack: eth0 also holds the node's PodAddr6(ip), with
// an IPv6 default route via CNI.PodGateway6 (a /128 and the node's /128 route under
// calico). name is a DNS label; ip must be a free host address inside the node's pod
// CIDR. It returns once the pod's link forwards.
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
	if !cidr.Contains(addr) || addr == cidr.Addr() || addr == spec.PodGateway().Addr() || !cidr.Contains(addr.Next()) {
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

	if err := n.buildPod(ctx, name, spec, addr); err != nil {
		return errors.Join(fmt.Errorf("netlab: pod %s: %w", name, err), n.RemovePod(name))
	}
	return nil
}

func (n *Net) buildPod(ctx context.Context, name string, spec NodeSpec, addr netip.Addr) error {
	ns := PodNSPrefix + name
	if _, err := n.command(ctx, "", "", "ip", "netns", "add", ns); err != nil {
		return err
	}
	hostEnd := n.cni.HostEnd(name)
	gw := n.cni.PodGateway(spec).String()
	addr6 := spec.PodAddr6(addr)
	gw6 := n.cni.PodGateway6(spec).String()
	// DAD is off in the pod as in every lab namespace, as Calico's CNI plugin turns it off
	// on both ends of the pod's veth (projectcalico/calico cni-plugin/pkg/dataplane/linux/
	// dataplane_linux.go, disableDAD), where the pod's IPv6 next hop is the host end's
	// link-local address.
	if err := n.noDAD(ctx, ns); err != nil {
		return err
	}
	steps := [][]string{
		{ns, "link", "set", "lo", "up"},
		{spec.Name, "link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{ns, "addr", "add", netip.PrefixFrom(addr, n.cni.podPrefix(spec)).String(), "dev", "eth0"},
		{ns, "addr", "add", netip.PrefixFrom(addr6, n.cni.podPrefix6(spec)).String(), "dev", "eth0"},
		{ns, "link", "set", "eth0", "up"},
	}
	if br := n.cni.Bridge(); br != "" {
		steps = append(steps,
			[]string{spec.Name, "link", "set", hostEnd, "master", br, "up"},
			[]string{ns, "route", "add", "default", "via", gw},
			[]string{ns, "-6", "route", "add", "default", "via", gw6})
	} else {
		// Calico's CNI plugin (the same file, DoNetworking and SetupRoutes): the host end gets
		// ee:ee:ee:ee:ee:ee, the pod a link route to 169.254.1.1 and its default route via
		// it, its IPv6 default route via the host end's link-local address (IPv6 has no
		// 169.254.1.1 and no proxy ARP), the node a /32 and a /128 route to the pod.
		steps = append(steps,
			[]string{spec.Name, "link", "set", hostEnd, "address", calicoHostMAC, "up"},
			[]string{ns, "route", "add", gw + "/32", "dev", "eth0", "scope", "link"},
			[]string{ns, "route", "add", "default", "via", gw, "dev", "eth0"},
			[]string{ns, "-6", "route", "add", "default", "via", gw6, "dev", "eth0"},
			[]string{spec.Name, "route", "add", netip.PrefixFrom(addr, 32).String(), "dev", hostEnd},
			[]string{spec.Name, "-6", "route", "add", netip.PrefixFrom(addr6, 128).String(), "dev", hostEnd})
	}
	// A pod address used before on this node may still sit in the node's neighbour cache
	// with the old pod's MAC, which would black-hole the new pod for seconds; a CNI forgets
	// it when the old pod goes, and so does the lab.
	steps = append(steps,
		[]string{spec.Name, "neigh", "flush", "to", addr.String()},
		[]string{spec.Name, "neigh", "flush", "to", addr6.String()})
	for _, st := range steps {
		if err := n.ip(ctx, st[0], st[1:]...); err != nil {
			return err
		}
	}
	if n.cni == CNICalico {
		// The same plugin answers the pod's ARP for 169.254.1.1 by proxy, without delay, and
		// turns proxy NDP on, which answers nothing until an entry is added, and none is.
		if err := n.sysctl(ctx, spec.Name, "net.ipv4.conf."+hostEnd+".proxy_arp=1",
			"net.ipv4.neigh."+hostEnd+".proxy_delay=0", "net.ipv6.conf."+hostEnd+".proxy_ndp=1"); err != nil {
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
	return n.serveIn(PodNSPrefix+pod, pod, proto, port)
}

// clientLogName stands for the client in a server log's name (not a DNS label, so no pod
// can have it).
const clientLogName = "client_"

// ServeClient starts `kuport-lab serve` in the client namespace, as Serve does in a pod,
// for a pod that speaks first (SendFromPod); ClientLog reads what it logged.
func (n *Net) ServeClient(proto string, port int) (*Proc, error) {
	return n.serveIn(ClientNS, clientLogName, proto, port)
}

// ClientLog is ServerLog for a server ServeClient started.
func (n *Net) ClientLog(proto string, port int) (string, error) {
	return n.ServerLog(clientLogName, proto, port)
}

// SendFromPod makes pod speak first: it runs `kuport-lab probe --sport sport` in the
// pod's namespace, one request from the pod's own port sport to dst (ip:port) over proto,
// waiting at most timeout for the answer. The result's PodSaw is the source address the
// receiver (a ServeClient server) saw; nothing coming back is not an error.
func (n *Net) SendFromPod(ctx context.Context, pod, proto string, sport int, dst string, timeout time.Duration) (ProbeResult, error) {
	out, err := n.Exec(ctx, PodNSPrefix+pod, n.toolBin, "probe", "--proto", proto, "--sport", strconv.Itoa(sport),
		"--to", dst, "--timeout", timeout.String())
	if err != nil {
		return ProbeResult{}, fmt.Errorf("netlab: send from pod %s: %w", pod, err)
	}
	res, err := labtool.ParseProbeResult(out)
	if err != nil {
		return ProbeResult{}, fmt.Errorf("netlab: send from pod %s: %w", pod, err)
	}
	return res, nil
}

// serveIn starts the server of Serve in netns, logging to serverLogPath(name, ...).
func (n *Net) serveIn(netns, name, proto string, port int) (*Proc, error) {
	logFile := n.serverLogPath(name, proto, port)
	if err := os.Remove(logFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("netlab: serve: %w", err)
	}
	p, err := n.Start(netns, logFile, n.toolBin, "serve", "--proto", proto, "--port", strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	pod := name
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
