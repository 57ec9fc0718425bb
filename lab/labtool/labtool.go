// Package labtool is the lab's pod server and client: the `serve` and `probe` subcommands of
// kuport-lab. A pod runs `serve` and answers every request with the peer address it saw (not
// an echo of the input); the client runs `probe` and prints what the pod saw and which
// address the answer came from (docs/design/lab.md#what-runs-where, "Reading replies").
//
// The package only opens sockets; it never configures the network. The lab runs both
// sides inside network namespaces it created.
package labtool

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrUsage marks a command-line error: kuport-lab exits 2 on it and 1 on any other error.
var ErrUsage = errors.New("usage")

// none is what probe prints for a field that nothing came back for.
const none = "none"

// ProbeResult is what one probe learned. PodSaw is the peer address the pod reported
// (an IPv4 or IPv6 address), ReplyFrom the ip:port the reply arrived from; each is "" when
// nothing came back.
type ProbeResult struct {
	PodSaw    string
	ReplyFrom string
}

// String renders the one line probe prints: `pod_saw=<ip|none> reply_from=<ip:port|none>`.
func (r ProbeResult) String() string {
	return "pod_saw=" + orNone(r.PodSaw) + " reply_from=" + orNone(r.ReplyFrom)
}

// ParseProbeResult parses the line String renders (surrounding whitespace is ignored).
// It fails on any other shape, so a crash message is never mistaken for a result.
func ParseProbeResult(line string) (ProbeResult, error) {
	fields := strings.Fields(line)
	if len(fields) != 2 {
		return ProbeResult{}, fmt.Errorf("probe output %q: want 2 fields", line)
	}
	saw, ok1 := strings.CutPrefix(fields[0], "pod_saw=")
	from, ok2 := strings.CutPrefix(fields[1], "reply_from=")
	if !ok1 || !ok2 {
		return ProbeResult{}, fmt.Errorf("probe output %q: want pod_saw=<ip|none> reply_from=<ip:port|none>", line)
	}
	return ProbeResult{PodSaw: fromNone(saw), ReplyFrom: fromNone(from)}, nil
}

// sawLine is the line serve logs for each TCP connection or UDP datagram:
// `saw <peer ip:port> <proto> <local port>`.
func sawLine(peer netip.AddrPort, proto string, localPort int) string {
	return fmt.Sprintf("saw %s %s %d", peer, proto, localPort)
}

// ListeningLine is the first line serve logs, once its socket on proto ("tcp" or "udp")
// and port is bound, so a caller knows when requests can be sent.
func ListeningLine(proto string, port int) string {
	return fmt.Sprintf("listening %s %d", proto, port)
}

// reply is what serve sends back: `saw=<peer ip>\n`, padded with spaces before the newline
// to size bytes when that is longer, so a large request draws a reply as large (the MTU
// checks: a reply larger than a link's MTU must cross it).
func reply(peer netip.Addr, size int) []byte {
	line := "saw=" + peer.String()
	return []byte(line + strings.Repeat(" ", max(0, size-len(line)-1)) + "\n")
}

// parseReply returns the address in a reply, or "" if b is not a reply.
func parseReply(b []byte) string {
	s, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "saw=")
	if !ok {
		return ""
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	return addr.String()
}

// network is the Go network of proto ("tcp" or "udp") in addr's family: tcp4, udp6, ...
func network(proto string, addr netip.Addr) string {
	if addr.Is6() {
		return proto + "6"
	}
	return proto + "4"
}

// wildcard is "the unspecified address of addr's family:port", a socket's local address.
func wildcard(addr netip.Addr, port int) string {
	unspec := netip.IPv4Unspecified()
	if addr.Is6() {
		unspec = netip.IPv6Unspecified()
	}
	return netip.AddrPortFrom(unspec, uint16(port)).String()
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

func fromNone(s string) string {
	if s == none {
		return ""
	}
	return s
}
