package labbench

import (
	"context"

	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/cluster"
)

// WriteCounts are kube-apiserver's status updates so far (apiserver_request_total), by kind.
type WriteCounts struct{ PortMaps, Classes float64 }

// StatusWrites reads kube-apiserver's /metrics for the status updates of PortMaps and
// PortMapClasses it has served.
func StatusWrites(ctx context.Context, l *lab.Lab) (WriteCounts, error) {
	counts, err := cluster.RequestCounts(ctx, l.Kube)
	if err != nil {
		return WriteCounts{}, err
	}
	return WriteCounts{
		PortMaps: counts[cluster.Request{Resource: "portmaps", Subresource: "status", Verb: "PUT"}],
		Classes:  counts[cluster.Request{Resource: "portmapclasses", Subresource: "status", Verb: "PUT"}],
	}, nil
}
