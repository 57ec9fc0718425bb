package labtool

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// maxUDPPayload is the largest IPv4 UDP payload (65535 - 20 - 8).
const maxUDPPayload = 65507

// Probe runs `kuport-lab probe --proto tcp|udp --to IP:PORT [--timeout 2s] [--size N]
// [--sport P]`: it sends one request of N bytes (default 6, ending in a newline), from
// local port P if given (a pod speaking first from its own port), and writes exactly one
// line, ProbeResult.String(), to stdout. TCP dials, writes the line and reads the reply;
// reply_from is the connected peer. UDP uses an unconnected socket (a connected one
// silently drops a reply from the wrong source, the failure the lab must show) and
// reports the source of the first datagram that comes back. The whole exchange is bounded
// by --timeout. An IPv6 destination is reached over IPv6 sockets. Nothing coming back (timeout, refusal, unreachable) prints `none` fields
// and returns nil; the only errors are ErrUsage, failing to open the UDP socket and
// failing to write stdout.
func Probe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	proto := fs.String("proto", "tcp", "tcp or udp")
	to := fs.String("to", "", "destination IPv4:port or [IPv6]:port")
	timeout := fs.Duration("timeout", 2*time.Second, "bound on the whole exchange")
	size := fs.Int("size", 6, "request size in bytes, newline included")
	sport := fs.Int("sport", 0, "local port to send from (0: any)")
	if err := parseFlags(fs, args, "kuport-lab probe --proto tcp|udp --to IP:PORT [--timeout 2s] [--size N] [--sport P]"); err != nil {
		return err
	}
	dst, err := parseDestination(*to)
	if err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %s: want > 0", ErrUsage, *timeout)
	}
	if *sport < 0 || *sport > 65535 {
		return fmt.Errorf("%w: --sport %d: want 0-65535", ErrUsage, *sport)
	}
	if *size < 1 || (*proto == "udp" && *size > maxUDPPayload) {
		return fmt.Errorf("%w: --size %d: want 1-%d", ErrUsage, *size, maxUDPPayload)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return printResult(stdout, *proto,
		func() ProbeResult { return probeTCP(ctx, dst, *sport, payload(*size)) },
		func() (ProbeResult, error) { return probeUDP(ctx, dst, *sport, payload(*size)) })
}

// parseDestination parses --to: an IPv4 or IPv6 address (not IPv4-mapped, no zone) and a
// non-zero port, else ErrUsage.
func parseDestination(to string) (netip.AddrPort, error) {
	dst, err := netip.ParseAddrPort(to)
	if err != nil || dst.Addr().Is4In6() || dst.Addr().Zone() != "" || dst.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("%w: --to %q: want IPv4:port or [IPv6]:port", ErrUsage, to)
	}
	return dst, nil
}

// printResult runs a client command's tcp or udp variant and writes its one result line.
// Errors: ErrUsage for another proto, the udp variant's error, failing to write stdout.
func printResult[R fmt.Stringer](stdout io.Writer, proto string, tcp func() R, udp func() (R, error)) error {
	var res R
	switch proto {
	case "tcp":
		res = tcp()
	case "udp":
		var err error
		if res, err = udp(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: --proto %q: want tcp or udp", ErrUsage, proto)
	}
	if _, err := fmt.Fprintln(stdout, res.String()); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// payload is n bytes: 'x' repeated, then a newline (the line the TCP server reads).
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b[:n-1] {
		b[i] = 'x'
	}
	b[n-1] = '\n'
	return b
}

func probeTCP(ctx context.Context, dst netip.AddrPort, sport int, req []byte) ProbeResult {
	var d net.Dialer
	if sport != 0 {
		d.LocalAddr = &net.TCPAddr{Port: sport}
	}
	c, err := d.DialContext(ctx, network("tcp", dst.Addr()), dst.String())
	if err != nil {
		return ProbeResult{}
	}
	defer func() { _ = c.Close() }()
	if deadline, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(deadline); err != nil {
			return ProbeResult{}
		}
	}
	if _, err := c.Write(req); err != nil {
		return ProbeResult{}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ProbeResult{}
	}
	return ProbeResult{PodSaw: parseReply([]byte(line)), ReplyFrom: c.RemoteAddr().String()}
}

// probeUDP fails only when it cannot open its socket; a send or receive failure is
// "nothing came back".
func probeUDP(ctx context.Context, dst netip.AddrPort, sport int, req []byte) (ProbeResult, error) {
	pc, err := net.ListenPacket(network("udp", dst.Addr()), wildcard(dst.Addr(), sport))
	if err != nil {
		return ProbeResult{}, fmt.Errorf("open udp socket: %w", err)
	}
	defer func() { _ = pc.Close() }()
	defer context.AfterFunc(ctx, func() { _ = pc.Close() })()
	if _, err := pc.WriteTo(req, net.UDPAddrFromAddrPort(dst)); err != nil {
		return ProbeResult{}, nil
	}
	buf := make([]byte, 64<<10)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		return ProbeResult{}, nil
	}
	return ProbeResult{PodSaw: parseReply(buf[:n]), ReplyFrom: from.String()}, nil
}
