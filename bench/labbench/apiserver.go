package labbench

import (
	"context"
	"fmt"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kuport.wlz.li/kuport/lab"
)

// WriteCounts are kube-apiserver's status updates so far (apiserver_request_total), by kind.
type WriteCounts struct{ PortMaps, Classes float64 }

// StatusWrites reads kube-apiserver's /metrics for the status updates of PortMaps and
// PortMapClasses it has served.
func StatusWrites(ctx context.Context, l *lab.Lab) (WriteCounts, error) {
	var w WriteCounts
	body, err := l.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return w, fmt.Errorf("kube-apiserver metrics: %w", err)
	}
	defer func() { _ = body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return w, fmt.Errorf("kube-apiserver metrics: %w", err)
	}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["subresource"] != "status" || labels["verb"] != "PUT" {
			continue
		}
		switch labels["resource"] {
		case "portmaps":
			w.PortMaps += m.GetCounter().GetValue()
		case "portmapclasses":
			w.Classes += m.GetCounter().GetValue()
		}
	}
	return w, nil
}
