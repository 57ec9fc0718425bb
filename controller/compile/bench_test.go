package compile

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// scaledWorld is the lab with n TCP mappings of class public from port 10000 up, each to its
// own Service and pod: even ones on edge-a (the accepting node), odd ones on worker-b, over
// the link.
func scaledWorld(n int) *Snapshot {
	s := world()
	for i := range n {
		name, port := fmt.Sprintf("m%05d", i), int32(10000+i)
		node, ip := "edge-a", fmt.Sprintf("10.244.17.%d", 2+i/2%250)
		if i%2 == 1 {
			node, ip = "worker-b", fmt.Sprintf("10.244.18.%d", 2+i/2%250)
		}
		addService(s, name, port, mkEndpoint(name+"-0", ip, node))
		s.PortMaps = append(s.PortMaps, mkPortMap(name, i, port))
	}
	return s
}

// BenchmarkCompile measures one compile of 10, 100 and 1000 mappings (the controller runs
// it on every change):
//
//	go test -run '^$' -bench Compile ./controller/compile/
func BenchmarkCompile(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("mappings=%d", n), func(b *testing.B) {
			s := scaledWorld(n)
			programmed := 0
			for _, r := range Compile(s).PortMaps {
				if meta.IsStatusConditionPresentAndEqual(r.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionTrue) {
					programmed++
				}
			}
			if programmed != n {
				b.Fatalf("%d of %d mappings programmed", programmed, n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				Compile(s)
			}
		})
	}
}
