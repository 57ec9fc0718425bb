package netlab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"kuport.wlz.li/kuport/lab/labtool"
)

// StreamResult is what a stream from the client measured (labtool.StreamResult).
type StreamResult = labtool.StreamResult

// Stream is a `kuport-lab stream` running in the client namespace.
type Stream struct {
	proc *Proc
	log  string
}

var streamSeq atomic.Uint64

// StartStream starts `kuport-lab stream` in the client namespace: one request to dst
// (ip:port) over proto (tcp|udp) every interval, for duration. It returns once the process
// runs; Wait collects the result.
func (n *Net) StartStream(proto, dst string, interval, duration time.Duration) (*Stream, error) {
	log := filepath.Join(n.dir, fmt.Sprintf("stream-%s-%d.log", proto, streamSeq.Add(1)))
	p, err := n.Start(ClientNS, log, n.toolBin, "stream", "--proto", proto, "--to", dst,
		"--interval", interval.String(), "--duration", duration.String())
	if err != nil {
		return nil, err
	}
	return &Stream{proc: p, log: log}, nil
}

// Wait waits for the stream to end (bounded by ctx) and parses its result line. Errors:
// ctx's, the process failing, or output that is not a result line.
func (s *Stream) Wait(ctx context.Context) (StreamResult, error) {
	select {
	case <-ctx.Done():
		s.proc.Kill()
		return StreamResult{}, ctx.Err()
	case <-s.proc.Done():
	}
	out, err := os.ReadFile(s.log)
	if err != nil {
		return StreamResult{}, fmt.Errorf("netlab: stream log: %w", err)
	}
	if err := s.proc.exitErr(); err != nil {
		return StreamResult{}, fmt.Errorf("netlab: stream: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return labtool.ParseStreamResult(strings.TrimSpace(string(out)))
}
