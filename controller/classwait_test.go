package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// TestPrivilegedClassStatusFollowsTheAcks: a class change whose link claims are already
// recorded pushes the programs first and writes the class status once the agents have
// acknowledged them, not beside the push; when an agent does not acknowledge, once
// ClassStatusWait is over.
func TestPrivilegedClassStatusFollowsTheAcks(t *testing.T) {
	const wait = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := startAPILab(t, ctx, func(c *Config) { c.ClassStatusWait = wait })
	agent := l.agent
	classes := l.dyn.Resource(v1alpha1.PortMapClassesResource)
	// address is what edge-a's row of the class status says of ifc ("" without a row).
	address := func(ifc string) string {
		u, err := classes.Get(ctx, "public", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		var cls v1alpha1.PortMapClass
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cls) != nil || len(cls.Status.Nodes) != 1 {
			return ""
		}
		return cls.Status.Nodes[0].Addresses[ifc]
	}
	// pushed reads the stream up to a program (whole, or a delta's changes) whose DNAT rules
	// include one on ifc, or none when !on, and returns its version.
	pushed := func(ifc string, on bool) (epoch, version uint64) {
		t.Helper()
		for {
			msg, err := agent.Recv()
			require.NoError(t, err)
			p := msg.GetProgram()
			if d := msg.GetDelta(); d != nil {
				p = d.GetChanged()
			}
			has := false
			for _, d := range p.GetDnatRules() {
				has = has || d.InInterface == ifc
			}
			if p != nil && has == on {
				return p.Epoch, p.Version
			}
		}
	}
	ack := func(epoch, version uint64) {
		t.Helper()
		require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Ack{Ack: &kuportv1.Ack{Epoch: epoch, Version: version}}}))
	}
	patchInterfaces := func(ifcs string) {
		t.Helper()
		_, err := classes.Patch(ctx, "public", types.MergePatchType,
			[]byte(`{"spec":{"nodes":{"edge-a":{"interfaces":`+ifcs+`}}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}

	// A mapping on edge-a, acknowledged: the class status says wt0's address.
	create(t, ctx, l.dyn, v1alpha1.PortMapsResource, portMap("local", "public", 8080))
	ack(pushed("wt0", true))
	require.Eventually(t, func() bool { return address("wt0") == "100.64.93.143" }, 60*time.Second, 50*time.Millisecond)
	// edge-a gains wt1, which the class does not name yet: nothing the class status says.
	require.NoError(t, agent.Send(&kuportv1.ConnectRequest{Message: &kuportv1.ConnectRequest_Report{Report: &kuportv1.Report{
		State: &kuportv1.NodeState{UnderlayInterface: "wt0", IpForward: true, Interfaces: []*kuportv1.Interface{
			{Name: "wt0", Addresses: []string{"100.64.93.143"}, Mtu: 1420},
			{Name: "wt1", Addresses: []string{"192.0.2.7"}, Mtu: 1420},
		}}}}}))

	// The class names wt1 on edge-a: a program with its DNAT rule, and a row with its
	// address, which waits for the acknowledgement.
	patchInterfaces(`["wt0","wt1"]`)
	epoch, version := pushed("wt1", true)
	sent := time.Now()
	require.Never(t, func() bool { return address("wt1") != "" }, 2*time.Second, 100*time.Millisecond,
		"the class status was written beside the push")
	ack(epoch, version)
	require.Eventually(t, func() bool { return address("wt1") == "192.0.2.7" }, 60*time.Second, 50*time.Millisecond)
	require.Less(t, time.Since(sent), wait, "the acknowledgement, not the wait, let the write go")

	// The class drops wt1 again and edge-a does not acknowledge: the row follows the wait.
	patchInterfaces(`["wt0"]`)
	pushed("wt1", false)
	sent = time.Now()
	require.Eventually(t, func() bool { return address("wt1") == "" }, 2*wait, 100*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(sent), wait-time.Second, "written before the wait was over")
}
