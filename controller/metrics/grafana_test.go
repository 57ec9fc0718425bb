package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
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
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// grafanaVariables stand in for Grafana's variables so that an expression parses as the
// PromQL Grafana sends.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "1m", "${namespace}", ".*", "$namespace", ".*")

// scrapeLabels are added by Prometheus to every series it scrapes.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// labelValues is Grafana's label_values(metric, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// TestGrafanaDashboard: the shipped dashboard is valid JSON; every panel's expression
// parses as PromQL (the Prometheus parser) and every metric it selects and every label it
// matches or groups by is one the controller exports, with the lab's series; so does every
// variable's label_values query.
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
	// exported: by series name (a histogram's _bucket, _count and _sum), its labels.
	exported := map[string]map[string]bool{}
	for _, f := range families {
		names := []string{f.GetName()}
		if f.GetType().String() == "HISTOGRAM" {
			names = []string{f.GetName() + "_bucket", f.GetName() + "_count", f.GetName() + "_sum"}
		}
		for i, n := range names {
			ls := map[string]bool{}
			if i == 0 && len(names) == 3 {
				ls["le"] = true
			}
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					ls[lp.GetName()] = true
				}
			}
			exported[n] = ls
		}
	}
	checkLabel := func(where, metric, label string) {
		if scrapeLabels[label] || label == labels.MetricName {
			return
		}
		assert.True(t, exported[metric][label], "%s: %s has no label %q", where, metric, label)
	}

	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d repeated", p.ID)
		ids[p.ID] = true
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, p.Title)
			where := "panel " + p.Title + ": " + tg.Expr
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVariables.Replace(tg.Expr))
			if !assert.NoError(t, err, where) {
				continue
			}
			parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
				switch n := n.(type) {
				case *parser.VectorSelector:
					if !assert.Contains(t, exported, n.Name, "%s: selects %q, which is not exported", where, n.Name) {
						return nil
					}
					used[strings.TrimSuffix(n.Name, "_bucket")] = true
					for _, m := range n.LabelMatchers {
						checkLabel(where, n.Name, m.Name)
					}
				case *parser.AggregateExpr:
					// A grouping label must come with some series aggregated.
					for _, l := range n.Grouping {
						if scrapeLabels[l] {
							continue
						}
						found := false
						parser.Inspect(n.Expr, func(c parser.Node, _ []parser.Node) error {
							if vs, ok := c.(*parser.VectorSelector); ok && exported[vs.Name][l] {
								found = true
							}
							return nil
						})
						assert.True(t, found, "%s: groups by %q, which no series it aggregates has", where, l)
					}
				}
				return nil
			})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if !assert.NotNil(t, m, "variable %s: %q is not label_values(metric, label)", v.Name, v.Definition) {
			continue
		}
		where := "variable " + v.Name
		if assert.Contains(t, exported, m[1], "%s: %s is not exported", where, m[1]) {
			checkLabel(where, m[1], m[2])
		}
	}
	for _, n := range []string{"kuport_mapping_flows_total", "kuport_mapping_packets_total", "kuport_link_tx_errors_total",
		"kuport_program_push_to_ack_seconds", "kuport_agents_connected", "kuport_leader", "kuport_refusals",
		"kuport_mapping_unanswered"} {
		assert.True(t, used[n], "no panel shows %s", n)
	}
}
