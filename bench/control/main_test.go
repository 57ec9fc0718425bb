package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// The series as the controller's metrics package writes them (controller/metrics/agents.go).
const agentMetrics = `# HELP kuport_agents_connected Agents with an open stream to this controller.
# TYPE kuport_agents_connected gauge
kuport_agents_connected 2
# HELP kuport_node_acked_version Program version the node's agent last acknowledged as applied in this leadership term (0: none).
# TYPE kuport_node_acked_version gauge
kuport_node_acked_version{node="edge-a"} 3
kuport_node_acked_version{node="worker-b"} 0
# HELP kuport_node_program_version Version of the node's current program in this leadership term (0: none yet).
# TYPE kuport_node_program_version gauge
kuport_node_program_version{node="edge-a"} 3
kuport_node_program_version{node="worker-b"} 1
`

func TestReadAgentVersions(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(agentMetrics))
	}))
	defer srv.Close()
	v, err := readAgentVersions(context.Background(), srv.URL)
	require.NoError(t, err)
	require.Equal(t, 2, v.connected)
	require.Equal(t, map[string]float64{"edge-a": 3, "worker-b": 1}, v.program)
	require.Equal(t, map[string]float64{"edge-a": 3, "worker-b": 0}, v.acked)
}
