// Command setlookup measures what one nftables set lookup costs a packet, by set kind, in
// one run: a client dials a server through a node whose prerouting chain looks the packet up
// --rules times in one set, and each kind's throughput and request/response p50 are printed
// beside those of the same node without the chain. The kinds are the sets kuport's layout
// could use (datapath/layout.go): a hash set of single ports keyed as kuport's are (interface,
// protocol, port), the same key with port ranges (an interval set of a concatenation, which
// the kernel keeps as pipapo), and port ranges keyed by the port alone (an rbtree).
// Run it as root through bench/setlookup.sh.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"kuport.wlz.li/kuport/bench/labbench"
)

const (
	clientAddr = "10.91.0.2"
	nodeAddr   = "10.91.0.1"
	serverAddr = "10.92.0.2"
	serverGw   = "10.92.0.1"
	// port is the server's, inside the last range and among the single ports.
	port = 20500
)

// kind is one set the chain looks up: its declaration and the rule's match.
type kind struct {
	name, set, match string
}

// kinds are the sets measured, each holding the server's port: 10,000 single ports, 100
// ranges of 500 ports.
func kinds() []kind {
	var single, ranges, ports []string
	for i := range 10000 {
		single = append(single, fmt.Sprintf(`"enp1s0" . tcp . %d`, 30000+i))
	}
	single = append(single, fmt.Sprintf(`"enp1s0" . tcp . %d`, port))
	for i := range 100 {
		first := 10000 + i*500
		ranges = append(ranges, fmt.Sprintf(`"enp1s0" . tcp . %d-%d`, first, first+499))
		ports = append(ports, fmt.Sprintf(`%d-%d`, first, first+499))
	}
	key := "iifname . meta l4proto . th dport @s"
	return []kind{
		{"hash", "type ifname . inet_proto . inet_service; elements = { " + strings.Join(single, ", ") + " }", key},
		{"pipapo", "type ifname . inet_proto . inet_service; flags interval; elements = { " + strings.Join(ranges, ", ") + " }", key},
		{"rbtree", "type inet_service; flags interval; elements = { " + strings.Join(ports, ", ") + " }", "th dport @s"},
	}
}

func main() {
	rounds := flag.Int("rounds", 3, "measurements of each figure; the medians are printed")
	traffic := flag.Duration("traffic", 2*time.Second, "duration of each measurement")
	rules := flag.Int("rules", 40, "lookups a packet meets in the node's chain")
	flag.Parse()
	if err := run(*rounds, *traffic, *rules); err != nil {
		fmt.Fprintln(os.Stderr, "setlookup:", err)
		os.Exit(1)
	}
}

func run(rounds int, d time.Duration, rules int) error {
	suffix := strconv.Itoa(os.Getpid())
	client, node, server := "kupset-client-"+suffix, "kupset-node-"+suffix, "kupset-server-"+suffix
	all := []string{client, node, server}
	defer labbench.DeleteNS(all...)
	var steps [][]string
	in := labbench.In
	for _, ns := range all {
		steps = append(steps, []string{"ip", "netns", "add", ns}, in(ns, "ip", "link", "set", "lo", "up"))
	}
	steps = append(steps,
		in(node, "ip", "link", "add", "enp1s0", "type", "veth", "peer", "name", "eth0", "netns", client),
		in(node, "ip", "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", server),
		in(node, "ip", "addr", "add", nodeAddr+"/24", "dev", "enp1s0"),
		in(node, "ip", "addr", "add", serverGw+"/24", "dev", "pod0"),
		in(node, "ip", "link", "set", "enp1s0", "up"),
		in(node, "ip", "link", "set", "pod0", "up"),
		in(node, "sysctl", "-qw", "net.ipv4.ip_forward=1"),
		in(client, "ip", "addr", "add", clientAddr+"/24", "dev", "eth0"),
		in(client, "ip", "link", "set", "eth0", "up"),
		in(client, "ip", "route", "add", "default", "via", nodeAddr),
		in(server, "ip", "addr", "add", serverAddr+"/24", "dev", "eth0"),
		in(server, "ip", "link", "set", "eth0", "up"),
		in(server, "ip", "route", "add", "default", "via", serverGw),
	)
	if err := labbench.Run(steps...); err != nil {
		return err
	}
	stop, err := labbench.ServeIn(server, serverAddr, port)
	if err != nil {
		return err
	}
	defer stop()

	target := net.JoinHostPort(serverAddr, strconv.Itoa(port))
	ks := kinds()
	type figures struct{ tcp, rr, baseTCP, baseRR []float64 }
	got := make([]figures, len(ks))
	for r := range rounds {
		for i, k := range ks {
			// Each kind beside a run without the chain, in alternating order.
			for _, with := range []bool{r%2 == 0, r%2 == 1} {
				_ = exec.Command("ip", "netns", "exec", node, "nft", "delete", "table", "inet", "kupset").Run()
				if with {
					if err := load(node, k, rules); err != nil {
						return err
					}
				}
				tcp, err := labbench.Throughput(client, target, d)
				if err != nil {
					return err
				}
				rr, err := labbench.RRP50(client, target, d)
				if err != nil {
					return err
				}
				if with {
					got[i].tcp, got[i].rr = append(got[i].tcp, tcp), append(got[i].rr, rr)
				} else {
					got[i].baseTCP, got[i].baseRR = append(got[i].baseTCP, tcp), append(got[i].baseRR, rr)
				}
				fmt.Fprintf(os.Stderr, "round %d %s chain=%t: tcp_gbps=%.2f rr_p50_us=%.0f\n", r+1, k.name, with, tcp, rr)
			}
		}
	}
	for i, k := range ks {
		f := got[i]
		fmt.Printf("BENCH set_lookup kind=%s rules=%d tcp_gbps=%.2f rr_p50_us=%.0f none_tcp_gbps=%.2f none_rr_p50_us=%.0f\n",
			k.name, rules, labbench.Median(f.tcp), labbench.Median(f.rr), labbench.Median(f.baseTCP), labbench.Median(f.baseRR))
	}
	return nil
}

// load writes table inet kupset in ns: set s of kind k, and a prerouting chain of rules
// lookups in it.
func load(ns string, k kind, rules int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet kupset {\n\tset s { %s }\n\tchain c {\n\t\ttype filter hook prerouting priority 0; policy accept;\n", k.set)
	for range rules {
		fmt.Fprintf(&b, "\t\t%s counter\n", k.match)
	}
	b.WriteString("\t}\n}\n")
	c := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	c.Stdin = strings.NewReader(b.String())
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f (%s): %v: %s", k.name, err, out)
	}
	return nil
}
