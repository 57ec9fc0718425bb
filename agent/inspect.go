package agent

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// inspection serves kuport.v1.AgentInspectionService over an Agent.
type inspection struct {
	kuportv1.UnimplementedAgentInspectionServiceServer
	a *Agent
}

// GetAppliedProgram implements kuport.v1.AgentInspectionService/GetAppliedProgram: the
// program last handed to the datapath, its entry errors and when; NOT_FOUND before the first.
func (i inspection) GetAppliedProgram(context.Context, *kuportv1.GetAppliedProgramRequest) (*kuportv1.GetAppliedProgramResponse, error) {
	applied := i.a.applied.Load()
	if applied == nil {
		return nil, status.Error(codes.NotFound, "no program applied yet")
	}
	return applied, nil
}

// InspectionServer returns a gRPC server (not yet serving) with the agent's local inspection
// surface: kuport.v1.AgentInspectionService, grpc.health.v1 ("" SERVING for liveness,
// ReadyService for readiness) and server reflection, for grpcurl and `kuport-agent probe` on
// the node. It has no authentication: serve it on loopback only.
func (a *Agent) InspectionServer() *grpc.Server {
	s := grpc.NewServer()
	kuportv1.RegisterAgentInspectionServiceServer(s, inspection{a: a})
	healthpb.RegisterHealthServer(s, a.health)
	reflection.Register(s)
	return s
}
