package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// grafanaDashboard is the part of deploy/grafana/kuport-dashboard.json the test reads.
type grafanaDashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestGrafanaDashboard: the shipped dashboard is valid JSON and every kuport metric its
// queries name is one this package exports.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana/kuport-dashboard.json")
	require.NoError(t, err)
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal(b, &d))
	assert.Equal(t, "kuport", d.UID)
	require.NotEmpty(t, d.Panels)

	SetLeader(unansweredSource{labSource()})
	t.Cleanup(func() { SetLeader(nil) })
	families, err := registry.Gather()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}

	name := regexp.MustCompile(`kuport_[a-z_]+`)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d repeated", p.ID)
		ids[p.ID] = true
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, p.Title)
			for _, n := range name.FindAllString(tg.Expr, -1) {
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if base := strings.TrimSuffix(n, suffix); base != n && exported[base] {
						n = base
					}
				}
				assert.True(t, exported[n], "panel %q queries %s, which is not exported", p.Title, n)
				used[n] = true
			}
		}
	}
	for _, n := range []string{"kuport_mapping_flows_total", "kuport_mapping_packets_total", "kuport_link_tx_errors_total",
		"kuport_program_push_to_ack_seconds", "kuport_agents_connected", "kuport_leader", "kuport_refusals",
		"kuport_mapping_unanswered"} {
		assert.True(t, used[n], "no panel shows %s", n)
	}
}
