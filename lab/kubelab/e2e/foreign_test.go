package e2e

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestWithoutKubeRouter: kube-router's chains, the jumps to them and blank lines go,
// everything else in the table stays.
func TestWithoutKubeRouter(t *testing.T) {
	const listing = `table ip filter {
	chain KUBE-KUBELET-CANARY {
	}

	chain INPUT {
		type filter hook input priority filter; policy accept;
		 jump KUBE-ROUTER-INPUT comment "kube-router netpol - 4IA2OSFRMVNDXBVV"
	}

	chain KUBE-POD-FW-7V7HNCH4IBDTECJZ {
		ct state related,established  accept
		ip daddr 10.244.17.2 fib saddr type local  accept
	}

	chain KUBE-ROUTER-FORWARD {
		ip daddr 10.244.17.2  jump KUBE-POD-FW-7V7HNCH4IBDTECJZ
	}
}
`
	const want = `table ip filter {
	chain KUBE-KUBELET-CANARY {
	}
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
}
`
	assert.Equal(t, want, withoutKubeRouter(listing))
}
