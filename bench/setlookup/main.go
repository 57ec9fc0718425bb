// Command setlookup measures what one nftables set lookup costs a packet, by set kind, in
// one run: a client dials a server through a node whose prerouting chain looks the packet up
// --rules times in one set, and each kind's throughput and request/response p50 are printed
// beside those of the same node without the chain. The kinds are the sets kuport's layout
// could use (datapath/layout.go): a hash set of single ports keyed as kuport's are (interface,
// protocol, port), the same key with port ranges (an interval set of a concatenation, which
// the kernel keeps as pipapo), the same ranges as kuport writes them (the key declared as one
// ll_addr, an rbtree), and port ranges keyed by the port alone (an rbtree).
// Run it as root through bench/setlookup.sh.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

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

// kind is one set the chain looks up: its declaration and the rule's match in nft's syntax,
// or, for a set nft cannot declare, write, which writes the table itself.
type kind struct {
	name, set, match string
	write            func(ns string, rules int) error
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
		{name: "hash", set: "type ifname . inet_proto . inet_service; elements = { " + strings.Join(single, ", ") + " }", match: key},
		{name: "pipapo", set: "type ifname . inet_proto . inet_service; flags interval; elements = { " + strings.Join(ranges, ", ") + " }", match: key},
		{name: "wide", write: writeWide},
		{name: "rbtree", set: "type inet_service; flags interval; elements = { " + strings.Join(ports, ", ") + " }", match: "th dport @s"},
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
					if err := matched(node, k); err != nil {
						return err
					}
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
	if k.write != nil {
		return k.write(ns, rules)
	}
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

// matched says whether the chain's lookups in set kind k found the traffic: a figure of
// lookups that miss would measure another path. Its first rule's counter has moved.
func matched(ns string, k kind) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "inet", "kupset", "c").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft list chain: %v: %s", err, out)
	}
	if m := counterRE.FindStringSubmatch(string(out)); m == nil || m[1] == "0" {
		return fmt.Errorf("kind %s: the lookups matched no packet", k.name)
	}
	return nil
}

var counterRE = regexp.MustCompile(`counter packets (\d+)`)

// writeWide writes table inet kupset in ns over netlink as kuport writes a range set
// (datapath/layout.go's keyType, nftwrite.go's nftElem): pipapo's 100 ranges with their
// concatenated key declared as one 24-byte ll_addr, which the kernel keeps as an rbtree, each
// range its first key and, flagged as the interval's end, the key past its last; and a
// prerouting chain of rules lookups that load the same three parts into the same registers.
func writeWide(ns string, rules int) error {
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "kupset"})
	keyType := nftables.TypeLLAddr
	keyType.Bytes = 24
	set := &nftables.Set{Table: t, Name: "s", Interval: true, KeyType: keyType}
	var elems []nftables.SetElement
	for i := range 100 {
		first := uint16(10000 + i*500)
		end := wideKey(first + 499)
		end[len(end)-1]++ // the key past the last: its port's padding, never carried into the port
		elems = append(elems, nftables.SetElement{Key: wideKey(first)}, nftables.SetElement{Key: end, IntervalEnd: true})
	}
	if err := c.AddSet(set, elems); err != nil {
		return err
	}
	hook, prio, policy := *nftables.ChainHookPrerouting, nftables.ChainPriority(0), nftables.ChainPolicyAccept
	chain := c.AddChain(&nftables.Chain{Table: t, Name: "c", Type: nftables.ChainTypeFilter, Hooknum: &hook, Priority: &prio, Policy: &policy})
	for range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 2},
			&expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, DestRegister: unix.NFT_REG32_05},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			&expr.Counter{},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write the wide set: %w", err)
	}
	return nil
}

// wideKey is the key of a TCP port on enp1s0 as the registers hold it: the interface name in
// 16 bytes, the protocol and the port each padded to 4.
func wideKey(port uint16) []byte {
	key := make([]byte, 24)
	copy(key, "enp1s0")
	key[16] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(key[20:], port)
	return key
}
