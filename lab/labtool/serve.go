package labtool

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// tcpIdle bounds how long a TCP connection may take to send its line, so a client that
// never does cannot pin a goroutine for ever.
const tcpIdle = 10 * time.Second

// Serve runs `kuport-lab serve --proto tcp|udp --port N` until ctx ends (then it returns
// nil). It listens on 0.0.0.0:N and, once bound, writes ListeningLine to stdout. For each
// TCP connection it logs `saw <peer ip:port> tcp <port>` and replies `saw=<peer ip>\n`,
// padded to the request's size (reply), to every line it reads, until the peer closes; for
// each UDP datagram it logs the same line with `udp` and sends the same reply to the
// datagram's source. Lines are written whole, one at a time.
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
	out := &lineWriter{w: stdout}
	addr := net.JoinHostPort("0.0.0.0", strconv.Itoa(*port))
	switch *proto {
	case "tcp":
		return serveTCP(ctx, addr, *port, out)
	case "udp":
		return serveUDP(ctx, addr, *port, out)
	default:
		return fmt.Errorf("%w: --proto %q: want tcp or udp", ErrUsage, *proto)
	}
}

func serveTCP(ctx context.Context, addr string, port int, out *lineWriter) error {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return fmt.Errorf("listen tcp %s: %w", addr, err)
	}
	defer context.AfterFunc(ctx, func() { _ = ln.Close() })()
	out.line(ListeningLine("tcp", port))
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

func serveUDP(ctx context.Context, addr string, port int, out *lineWriter) error {
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return fmt.Errorf("listen udp %s: %w", addr, err)
	}
	defer context.AfterFunc(ctx, func() { _ = pc.Close() })()
	out.line(ListeningLine("udp", port))
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
