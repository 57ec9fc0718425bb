package compile

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// TestNodePortsReserved: a class whose port window holds a well-known node port it does not
// reserve (kubelet, kube-apiserver, etcd, its own link port, the port of a tunnel device on
// an accepting node) says which in its NodePortsReserved condition, and accepts its mappings
// as before; ports outside the window, reserved, or of a tunnel on a node that accepts
// nothing are not named.
func TestNodePortsReserved(t *testing.T) {
	allReserved := []int32{2379, 2380, 4790, 6443, 10250}
	cases := []struct {
		name string
		edit func(s *Snapshot)
		// want is the condition's message when False, "" when it is True.
		want string
	}{
		{
			name: "the default window holds them all",
			edit: func(s *Snapshot) { s.Classes["public"].Spec.Ports = v1alpha1.PortPolicy{} },
			want: "ports 2379-2380 (etcd), 4790 (the class's link port), 6443 (kube-apiserver), 10250 (kubelet) " +
				"are in the port window 1-65535 and not reserved",
		},
		{
			name: "every one reserved",
			edit: func(s *Snapshot) { s.Classes["public"].Spec.Ports.Reserved = allReserved },
		},
		{
			name: "half of etcd's range reserved",
			edit: func(s *Snapshot) {
				s.Classes["public"].Spec.Ports.Reserved = []int32{2379, 4790, 6443, 10250}
			},
			want: "ports 2380 (etcd) are in the port window 1024-65535",
		},
		{
			name: "a window below them all",
			edit: func(s *Snapshot) { s.Classes["public"].Spec.Ports = v1alpha1.PortPolicy{Min: 27000, Max: 27100} },
		},
		{
			name: "a returnPath None class has no link port",
			edit: func(s *Snapshot) {
				s.Classes["public"].Spec.Ports.Reserved = []int32{2379, 2380, 6443, 10250}
				s.Classes["public"].Spec.ReturnPath.Mode = v1alpha1.ReturnPathNone
			},
		},
		{
			name: "the CNI's vxlan port on the accepting node",
			edit: func(s *Snapshot) {
				s.Classes["public"].Spec.Ports.Reserved = allReserved
				withTunnel(s, "edge-a", tunnel("flannel.1", vxlan, 8472))
			},
			want: "ports 8472 (flannel.1 (vxlan) on edge-a) are in the port window 1024-65535",
		},
		{
			name: "a tunnel on several accepting nodes, and one on a node that accepts nothing",
			edit: func(s *Snapshot) {
				s.Classes["public"].Spec.Nodes["worker-c"] = v1alpha1.ClassNode{Interfaces: []string{"eth0"}}
				s.Classes["public"].Spec.Ports.Reserved = allReserved
				withTunnel(s, "edge-a", tunnel("cilium_geneve", geneve, 6081))
				withTunnel(s, "worker-c", tunnel("cilium_geneve", geneve, 6081))
				withTunnel(s, "worker-b", tunnel("flannel.1", vxlan, 4789))
			},
			want: "ports 6081 (cilium_geneve (geneve) on edge-a and 1 other nodes) are in the port window 1024-65535",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := world(mkPortMap("kubelet", 0, 10250, service("local")))
			tc.edit(s)
			r := Compile(s)
			st := r.Classes["public"]
			ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ClassConditionReady)
			if ready == nil || ready.Reason != v1alpha1.ReasonValid {
				t.Fatalf("Ready: %+v", ready)
			}
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ClassConditionNodePortsReserved)
			if c == nil {
				t.Fatalf("no %s condition in %+v", v1alpha1.ClassConditionNodePortsReserved, st.Conditions)
			}
			switch {
			case tc.want == "" && (c.Status != "True" || c.Reason != v1alpha1.ReasonAllReserved):
				t.Errorf("want True %s, got %s %s: %s", v1alpha1.ReasonAllReserved, c.Status, c.Reason, c.Message)
			case tc.want != "" && (c.Status != "False" || c.Reason != v1alpha1.ReasonNodePortsUnreserved ||
				len(c.Message) < len(tc.want) || c.Message[:len(tc.want)] != tc.want):
				t.Errorf("want False %s %q..., got %s %s: %q", v1alpha1.ReasonNodePortsUnreserved, tc.want, c.Status, c.Reason, c.Message)
			}
			if c.ObservedGeneration != s.Classes["public"].Generation {
				t.Errorf("observedGeneration %d", c.ObservedGeneration)
			}
			// Only a warning: a mapping of the kubelet's port is accepted or refused as before
			// (reserved: PortReserved; out of the window: PortOutOfRange).
			pm := r.PortMaps[types.NamespacedName{Namespace: "demo", Name: "kubelet"}]
			acc := meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionAccepted)
			cls := s.Classes["public"].Spec.Ports
			wantAccepted := "True"
			switch {
			case cls.Min > 10250 || cls.Max != 0 && cls.Max < 10250:
				wantAccepted = v1alpha1.ReasonPortOutOfRange
			case slices.Contains(cls.Reserved, 10250):
				wantAccepted = v1alpha1.ReasonPortReserved
			}
			got := string(acc.Status)
			if acc.Status != "True" {
				got = acc.Reason
			}
			if got != wantAccepted {
				t.Errorf("Accepted: want %s, got %s %s", wantAccepted, acc.Status, acc.Reason)
			}
		})
	}
}
