package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/cluster"
)

// controllerName is the name the controller's serving certificate holds for its Service.
const controllerName = "kuport-controller.kuport-system.svc"

// assertMetricsAuth checks the controller's metrics port through its Service, as any pod
// reaches it (from a node namespace, through kube-proxy), with the CA of the ConfigMap
// kuport-controller-ca: refused without a token (401) and with a token no binding allows
// (403), admitted with a ServiceAccount bound to kuport-metrics-reader, and a scrape every
// second for a minute costs the API server at most two reviews of each kind.
func (e *env) assertMetricsAuth() {
	e.t.Helper()
	e.kubectl("-n", "default", "create", "serviceaccount", "scraper")
	e.kubectl("-n", "default", "create", "serviceaccount", "stranger")
	e.kubectl("create", "clusterrolebinding", "scraper", "--clusterrole=kuport-metrics-reader", "--serviceaccount=default:scraper")
	defer e.kubectl("delete", "clusterrolebinding", "scraper")
	defer e.kubectl("-n", "default", "delete", "serviceaccount", "scraper", "stranger")
	scraper := strings.TrimSpace(e.kubectl("-n", "default", "create", "token", "scraper"))
	stranger := strings.TrimSpace(e.kubectl("-n", "default", "create", "token", "stranger"))

	ca := filepath.Join(e.t.TempDir(), "ca.crt")
	require.NoError(e.t, os.WriteFile(ca, []byte(e.kubectl("-n", kuportNS, "get", "configmap", "kuport-controller-ca", "-o", `jsonpath={.data.ca\.crt}`)), 0o644))
	ip := e.kubectl("-n", kuportNS, "get", "service", "kuport-controller", "-o", "jsonpath={.spec.clusterIP}")
	get := func(path, token string) string {
		args := []string{"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", "--cacert", ca,
			"--resolve", controllerName + ":9090:" + ip}
		if token != "" {
			args = append(args, "-H", "Authorization: Bearer "+token)
		}
		out, _ := e.l.Net.Exec(context.Background(), "worker-b", append(args, "https://"+controllerName+":9090"+path)...)
		return out
	}
	for _, path := range []string{"/metrics", "/state"} {
		assert.Equal(e.t, "401", get(path, ""), "%s without a token", path)
		assert.Equal(e.t, "403", get(path, stranger), "%s with a token kuport-metrics-reader is not bound to", path)
		assert.Equal(e.t, "200", get(path, scraper), "%s with a token bound to kuport-metrics-reader", path)
	}

	before := e.reviews()
	for range 60 {
		assert.Equal(e.t, "200", get("/metrics", scraper))
		time.Sleep(time.Second)
	}
	after := e.reviews()
	for kind, n := range after {
		e.t.Logf("BENCH metrics_scrape seconds=60 resource=%s reviews=%.0f", kind, n-before[kind])
		assert.LessOrEqual(e.t, n-before[kind], 2.0, "%s a minute of scrapes cost the API server", kind)
	}
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
