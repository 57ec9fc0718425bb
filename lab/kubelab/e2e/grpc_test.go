package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

type nodeRow struct {
	version   string
	connected bool
}

var forwardingRe = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 7443`)

// listNodes asks the leader's ProgramService for ListNodes through
// `kubectl -n kuport-system port-forward pod/<leader> :7443`, as the README tells operators.
func (e *env) listNodes() ([]nodeRow, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.l.Cluster.Kubectl(), "--kubeconfig", e.l.Cluster.Kubeconfig(),
		"-n", kuportNS, "port-forward", "pod/"+e.leaderPod(), ":7443")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	var port string
	for sc.Scan() {
		if m := forwardingRe.FindStringSubmatch(sc.Text()); m != nil {
			port = m[1]
			break
		}
	}
	if port == "" {
		cancel()
		_ = cmd.Wait()
		return nil, fmt.Errorf("port-forward printed no local port: %s", strings.TrimSpace(stderr.String()))
	}
	go func() {
		for sc.Scan() { // keep draining, so kubectl never blocks on its stdout
		}
	}()
	conn, err := grpc.NewClient("127.0.0.1:"+port, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	resp, err := kuportv1.NewProgramServiceClient(conn).ListNodes(ctx, &kuportv1.ListNodesRequest{})
	if err != nil {
		return nil, err
	}
	var out []nodeRow
	for _, n := range resp.GetNodes() {
		out = append(out, nodeRow{version: n.GetAgentVersion(), connected: n.GetConnected()})
	}
	return out, nil
}
