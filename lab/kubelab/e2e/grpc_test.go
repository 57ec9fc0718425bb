package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

type nodeRow struct {
	version   string
	connected bool
}

var forwardingRe = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 7443`)

// listNodes asks the leader's ProgramService for ListNodes through
// `kubectl -n kuport-system port-forward pod/<leader> :7443`, verifying the controller's
// certificate with the CA of the ConfigMap kuport-controller-ca, as docs/security.md tells
// operators.
func (e *env) listNodes() ([]nodeRow, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca, err := e.l.Cluster.KubectlRun(ctx, "", "-n", kuportNS, "get", "configmap", "kuport-controller-ca", "-o", `jsonpath={.data.ca\.crt}`)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(ca)) {
		return nil, fmt.Errorf("configmap kuport-controller-ca holds no CA certificate: %q", ca)
	}
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
	conn, err := grpc.NewClient("127.0.0.1:"+port, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
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
