// Package metrics is the controller's Prometheus surface (docs/dashboard.md): one dedicated
// registry served by Handler, holding
//
//   - what the agents report, read from a Source (the agent registry) at scrape time: per
//     mapping rule counters, per link statistics, connected agents and program versions;
//   - what the controller's own code records through the functions below: compile duration,
//     push-to-ack latency (PushTracker), leadership and refused PortMaps.
//
// It only reads and counts: it decides nothing and touches neither the API nor a kernel.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/controller/compile"
)

var (
	registry = prometheus.NewRegistry()

	compileSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kuport_compile_duration_seconds",
		Help: "Time one run of the pure compile function took, in seconds.",
		// 0.5 ms to about 16 s: a small cluster compiles in well under a millisecond,
		// 10,000 mappings must stay well under a second.
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	pushToAckSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "kuport_program_push_to_ack_seconds",
		Help: "Network programming latency, in seconds: from a node's program version being stored to the node's agent acknowledging it (or a later version) as applied in its kernel.",
		// 1 ms to about 32 s: the target is a change live in well under a second; a node
		// that is disconnected, or held back at startup, lands in the top buckets.
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kuport_leader",
		Help: "1 while this controller replica leads (compiles and serves programs), else 0.",
	})
	refusals = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kuport_refusals",
		Help: "PortMaps the last compile refused, by reason: Accepted=False's reason, else Programmed=False's.",
	}, []string{"reason"})

	// agentSide reads the agent-side series from SetLeader's Source at every scrape.
	agentSide = &agentCollector{}
)

func init() {
	registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		compileSeconds, pushToAckSeconds, leader, refusals, agentSide,
	)
}

// Handler serves the controller's metrics in the Prometheus exposition formats.
func Handler() http.Handler {
	return promhttp.HandlerFor(registry, promhttp.HandlerOpts{Registry: registry})
}

// SetLeader records whether this replica leads: src is the agent registry of the current
// leadership term, read at every scrape; nil while the replica does not lead (kuport_leader 0,
// and neither agent-side series nor kuport_refusals, which only the leader's compile sets).
func SetLeader(src Source) {
	agentSide.set(src)
	if src == nil {
		leader.Set(0)
		refusals.Reset()
	} else {
		leader.Set(1)
		SetRefusals(nil)
	}
}

// ObserveCompile records how long one compile (compile.Incremental) took.
func ObserveCompile(d time.Duration) { compileSeconds.Observe(d.Seconds()) }

// refusalReasons are the False reasons of docs/design/api.md#status-and-conditions that
// compile decides, in its order: Accepted's, then Programmed's. NotAccepted is absent: a
// PortMap not accepted is counted under its Accepted reason.
var refusalReasons = []string{
	v1alpha1.ReasonClassNotFound, v1alpha1.ReasonNamespaceNotSelected, v1alpha1.ReasonInvalidPortRange,
	v1alpha1.ReasonPortOutOfRange, v1alpha1.ReasonPortReserved, v1alpha1.ReasonPortConflict,
	v1alpha1.ReasonInterfaceNotInClass,
	v1alpha1.ReasonNoReadyEndpoint, v1alpha1.ReasonReturnPathUnavailable, v1alpha1.ReasonNodeNotReady,
	v1alpha1.ReasonNoInterfaceOnNode,
}

// SetRefusals sets kuport_refusals from one compile's PortMap results
// (compile.Result.PortMaps): every reason of docs/design/api.md#status-and-conditions is set,
// to 0 when no PortMap has it, so a refusal that clears shows as 0 rather than as a vanished
// series. A mapping waiting only for an agent's acknowledgement is not refused: compile
// reports it Programmed, the status writer's downgrade to NodeNotReady is not counted.
func SetRefusals(portMaps map[types.NamespacedName]*compile.PortMapResult) {
	counts := make(map[string]int, len(refusalReasons))
	for _, r := range refusalReasons {
		counts[r] = 0
	}
	for _, res := range portMaps {
		if reason := refusal(res.Status.Conditions); reason != "" {
			counts[reason]++
		}
	}
	for reason, n := range counts {
		refusals.WithLabelValues(reason).Set(float64(n))
	}
}

// refusal is the reason a PortMap is refused: Accepted's when False, else Programmed's when
// False, else "".
func refusal(conds []metav1.Condition) string {
	for _, typ := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionProgrammed} {
		if c := meta.FindStatusCondition(conds, typ); c != nil && c.Status == metav1.ConditionFalse {
			return c.Reason
		}
	}
	return ""
}
