package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLeaderElectionFlagsAreChecked: durations client-go's leader election cannot work with
// stop the controller before it campaigns or serves.
func TestLeaderElectionFlagsAreChecked(t *testing.T) {
	err := run([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0",
		"--lease-duration", "10s", "--renew-deadline", "10s"})
	require.ErrorContains(t, err, "leader election")
}

// TestAgentServiceAccountIsChecked: a malformed --agent-service-account stops the controller
// before it serves.
func TestAgentServiceAccountIsChecked(t *testing.T) {
	err := run([]string{"--kubeconfig", unreachableKubeconfig(t), "--grpc-listen", "127.0.0.1:0",
		"--agent-service-account", "kuport-agent"})
	require.ErrorContains(t, err, "--agent-service-account")
}

// unreachableKubeconfig writes a kubeconfig naming an API server nobody listens on.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	return kubeconfig
}
