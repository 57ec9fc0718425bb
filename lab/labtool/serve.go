package labtool

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// tcpIdle bounds how long a TCP connection may take to send its line, so a client that
// never does cannot pin a goroutine for ever.
const tcpIdle = 10 * time.Second

// Serve runs `kuport-lab serve --proto tcp|udp --port N` until ctx ends (then it returns
// nil). It listens on 0.0.0.0:N and on [::]:N (IPv6 only, so each family keeps its own
// socket) and, once both are bound, writes ListeningLine to stdout. For each TCP connection
// it logs `saw <peer ip:port> tcp <port>` and replies `saw=<peer ip>\n`, padded to the
// request's size (reply), to every line it reads, until the peer closes; for each UDP
// datagram it logs the same line with `udp` and sends the same reply to the datagram's
// source. Lines are written whole, one at a time.
// Errors: ErrUsage for bad arguments, or the listen/accept error.
func Serve(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	proto := fs.String("proto", "tcp", "tcp or udp")
	port := fs.Int("port", 0, "port to listen on, 1-65535")
	if err := parseFlags(fs, args, "kuport-lab serve --proto tcp|udp --port N"); err != nil {
		return err
	}
	if *port < 1 || *port > 65535 {
		return fmt.Errorf("%w: --port %d: want 1-65535", ErrUsage, *port)
	}
	listen := map[string]func(context.Context, netip.Addr, int, *lineWriter) (func() error, error){
		"tcp": listenTCP, "udp": listenUDP,
	}[*proto]
	if listen == nil {
		return fmt.Errorf("%w: --proto %q: want tcp or udp", ErrUsage, *proto)
	}
	// Ending ctx closes every socket bound so far, on every path.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &lineWriter{w: stdout}
	var loops []func() error
	for _, unspec := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		loop, err := listen(ctx, unspec, *port, out)
		if err != nil {
			return err
		}
		loops = append(loops, loop)
	}
	out.line(ListeningLine(*proto, *port))
	done := make(chan error, len(loops))
	for _, loop := range loops {
		go func() { done <- loop() }()
	}
	// The first to end ends the others, which then return nil.
	err := <-done
	cancel()
	for range loops[1:] {
		err = errors.Join(err, <-done)
	}
	return err
}

// listenTCP binds proto tcp on unspec's family and port, closing it when ctx ends, and
// returns its accept loop.
func listenTCP(ctx context.Context, unspec netip.Addr, port int, out *lineWriter) (func() error, error) {
	addr := wildcard(unspec, port)
	ln, err := net.Listen(network("tcp", unspec), addr)
	if err != nil {
		return nil, fmt.Errorf("listen tcp %s: %w", addr, err)
	}
	context.AfterFunc(ctx, func() { _ = ln.Close() })
	return func() error {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("accept: %w", err)
			}
			go answerTCP(c, port, out)
		}
	}, nil
}

// answerTCP logs the connection once, then answers every line it reads until the peer
// closes or stays silent for tcpIdle: a probe sends one line, a stream many.
func answerTCP(c net.Conn, port int, out *lineWriter) {
	defer func() { _ = c.Close() }()
	peer := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	out.line(sawLine(peer, "tcp", port))
	r := bufio.NewReader(c)
	for {
		if err := c.SetDeadline(time.Now().Add(tcpIdle)); err != nil {
			out.line(fmt.Sprintf("error %s: %v", peer, err))
			return
		}
		req, err := r.ReadString('\n')
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out.line(fmt.Sprintf("error %s: read: %v", peer, err))
			}
			return
		}
		if _, err := c.Write(reply(peer.Addr().Unmap(), len(req))); err != nil {
			out.line(fmt.Sprintf("error %s: reply: %v", peer, err))
			return
		}
	}
}

// listenUDP binds udp on unspec's family and port, closing it when ctx ends, and returns
// its loop answering every datagram.
func listenUDP(ctx context.Context, unspec netip.Addr, port int, out *lineWriter) (func() error, error) {
	addr := wildcard(unspec, port)
	pc, err := net.ListenPacket(network("udp", unspec), addr)
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", addr, err)
	}
	context.AfterFunc(ctx, func() { _ = pc.Close() })
	return func() error {
		buf := make([]byte, 64<<10)
		for {
			size, from, err := pc.ReadFrom(buf)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("read udp: %w", err)
			}
			peer := from.(*net.UDPAddr).AddrPort()
			out.line(sawLine(peer, "udp", port))
			if _, err := pc.WriteTo(reply(peer.Addr().Unmap(), size), from); err != nil {
				out.line(fmt.Sprintf("error %s: reply: %v", peer, err))
			}
		}
	}, nil
}

// parseFlags parses args into fs, turning every failure (and -h) into ErrUsage, and
// refuses positional arguments.
func parseFlags(fs *flag.FlagSet, args []string, usage string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return fmt.Errorf("%w: %s", ErrUsage, usage)
		}
		return fmt.Errorf("%w: %v; %s", ErrUsage, err, usage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q; %s", ErrUsage, fs.Arg(0), usage)
	}
	return nil
}

// lineWriter writes whole lines from concurrent goroutines. Write errors are dropped:
// the log is the only place they could be reported.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) line(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s+"\n")
}
