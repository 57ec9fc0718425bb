package cluster

import (
	"context"
	"fmt"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// Request is one kind of request kube-apiserver counts in apiserver_request_total.
type Request struct{ Resource, Subresource, Verb string }

// RequestCounts reads kube-apiserver's /metrics for the requests it has served so far, by
// resource, subresource and verb (summed over the other labels), so a bench or a test can
// count what kuport cost the API server between two reads.
func RequestCounts(ctx context.Context, kube kubernetes.Interface) (map[Request]float64, error) {
	body, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver metrics: %w", err)
	}
	defer func() { _ = body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver metrics: %w", err)
	}
	out := map[Request]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		var r Request
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "resource":
				r.Resource = lp.GetValue()
			case "subresource":
				r.Subresource = lp.GetValue()
			case "verb":
				r.Verb = lp.GetValue()
			}
		}
		out[r] += m.GetCounter().GetValue()
	}
	return out, nil
}
