package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/cluster"
	"kuport.wlz.li/kuport/lab/kubelab"
)

// controllerName is the name the controller's serving certificate holds for its Service.
const controllerName = "kuport-controller.kuport-system.svc"

// metricsClients are two pods on a node that runs no controller replica, so that their
// traffic to the Service crosses to a controller's node, where the controller's
// NetworkPolicy is enforced (its own node is always admitted): one labelled as a scraper,
// which deploy/networkpolicy.yaml admits to port 9090, and one not.
const metricsClients = `apiVersion: v1
kind: Pod
metadata:
  name: scraper
  namespace: default
  labels: {kuport.wlz.li/metrics-scraper: "true"}
spec:
  nodeName: %[1]s
  automountServiceAccountToken: false
  containers: [{name: pause, image: %[2]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: stranger, namespace: default}
spec:
  nodeName: %[1]s
  automountServiceAccountToken: false
  containers: [{name: pause, image: %[2]s, imagePullPolicy: Never}]
`

// assertMetricsAuth checks the controller's metrics port through its Service from a pod
// labelled as a scraper, with the CA of the ConfigMap kuport-controller-ca: refused without
// a token (401) and with a token no binding allows (403), admitted with a ServiceAccount
// bound to kuport-metrics-reader, and a scrape every second for a minute costs the API
// server at most two reviews of each kind per replica. It also checks the controller's NetworkPolicy as
// the lab's kube-router enforces it: a pod without the label gets no answer on 9090 even
// with that token but still connects to 7443, and every node's agent, in the host network,
// holds its stream.
func (e *env) assertMetricsAuth() {
	e.t.Helper()
	e.kubectl("-n", "default", "create", "serviceaccount", "scraper")
	e.kubectl("-n", "default", "create", "serviceaccount", "stranger")
	e.kubectl("create", "clusterrolebinding", "scraper", "--clusterrole=kuport-metrics-reader", "--serviceaccount=default:scraper")
	defer e.kubectl("delete", "clusterrolebinding", "scraper")
	defer e.kubectl("-n", "default", "delete", "serviceaccount", "scraper", "stranger")
	scraper := strings.TrimSpace(e.kubectl("-n", "default", "create", "token", "scraper"))
	stranger := strings.TrimSpace(e.kubectl("-n", "default", "create", "token", "stranger"))

	e.kubectlIn(fmt.Sprintf(metricsClients, e.nodeWithoutController(), kubelab.PauseImage), "apply", "-f", "-")
	defer e.kubectl("-n", "default", "delete", "pod", "scraper", "stranger")
	e.kubectl("-n", "default", "wait", "--for=condition=Ready", "pod/scraper", "pod/stranger", "--timeout=60s")

	ca := filepath.Join(e.t.TempDir(), "ca.crt")
	require.NoError(e.t, os.WriteFile(ca, []byte(e.kubectl("-n", kuportNS, "get", "configmap", "kuport-controller-ca", "-o", `jsonpath={.data.ca\.crt}`)), 0o644))
	ip := e.kubectl("-n", kuportNS, "get", "service", "kuport-controller", "-o", "jsonpath={.spec.clusterIP}")
	// get answers the HTTP status, or 000 when no answer came.
	get := func(pod, path, token string) string {
		args := []string{"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--cacert", ca,
			"--resolve", controllerName + ":9090:" + ip}
		if token != "" {
			args = append(args, "-H", "Authorization: Bearer "+token)
		}
		out, _ := e.l.Cluster.PodNetExec(context.Background(), "default", pod, append(args, "https://"+controllerName+":9090"+path)...)
		return out
	}
	// kube-router admits the scraper once its sync has put the pod's address in the
	// policy's source set.
	require.Eventually(e.t, func() bool { return get("scraper", "/metrics", "") == "401" }, 30*time.Second, time.Second,
		"the scraper pod never reached the metrics port")
	for _, path := range []string{"/metrics", "/state"} {
		assert.Equal(e.t, "401", get("scraper", path, ""), "%s without a token", path)
		assert.Equal(e.t, "403", get("scraper", path, stranger), "%s with a token kuport-metrics-reader is not bound to", path)
		assert.Equal(e.t, "200", get("scraper", path, scraper), "%s with a token bound to kuport-metrics-reader", path)
		assert.Equal(e.t, "000", get("stranger", path, scraper), "%s from a pod without the scraper label", path)
	}
	_, err := e.l.Cluster.PodNetExec(context.Background(), "default", "stranger",
		"timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/"+ip+"/7443")
	assert.NoError(e.t, err, "a pod without the scraper label connects to the agents' port 7443")
	nodes, err := e.listNodes()
	require.NoError(e.t, err)
	connected := 0
	for _, n := range nodes {
		if n.connected {
			connected++
		}
	}
	assert.Equal(e.t, len(e.l.Net.Nodes()), connected, "agents holding a stream through the NetworkPolicy")

	// A minute by the clock, not 60 scrapes. Each replica caches a review for a minute, so
	// over a minute and the last scrape's few seconds one replica reviews at most twice (at
	// the start and a minute later): two replicas, four reviews of each kind at most, against
	// 60 without the cache.
	const bound = 4
	before := e.reviews()
	for start := time.Now(); time.Since(start) < time.Minute; {
		assert.Equal(e.t, "200", get("scraper", "/metrics", scraper))
		time.Sleep(time.Second)
	}
	after := e.reviews()
	for kind, n := range after {
		e.t.Logf("BENCH metrics_scrape seconds=60 resource=%s reviews=%.0f", kind, n-before[kind])
		assert.LessOrEqual(e.t, n-before[kind], float64(bound), "%s a minute of scrapes cost the API server", kind)
	}
}

// nodeWithoutController is a node no running controller replica is on.
func (e *env) nodeWithoutController() string {
	e.t.Helper()
	used := map[string]bool{}
	for _, p := range e.runningPods("kuport-controller") {
		used[p.Spec.NodeName] = true
	}
	for _, n := range e.l.Net.Nodes() {
		if !used[n.Name] {
			return n.Name
		}
	}
	e.t.Fatal("every node runs a controller replica")
	return ""
}

// reviews are the TokenReviews and SubjectAccessReviews kube-apiserver has served so far,
// by resource.
func (e *env) reviews() map[string]float64 {
	e.t.Helper()
	counts, err := cluster.RequestCounts(context.Background(), e.l.Kube)
	require.NoError(e.t, err)
	out := map[string]float64{"tokenreviews": 0, "subjectaccessreviews": 0}
	for r, n := range counts {
		if _, ok := out[r.Resource]; ok {
			out[r.Resource] += n
		}
	}
	return out
}
