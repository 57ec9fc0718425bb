package kubelab

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/lab/netlab"
)

// TestFlannelNetConf checks net-conf.json says what Talos's does: the cluster's pod
// network, nftables mode and vxlan on 4789 (flannel.go cites where Talos writes it).
func TestFlannelNetConf(t *testing.T) {
	var conf struct {
		Network        string
		EnableNFTables bool
		Backend        struct {
			Type string
			Port int
		}
	}
	require.NoError(t, json.Unmarshal([]byte(flannelNetConf), &conf))
	assert.Equal(t, ClusterCIDR, conf.Network)
	assert.True(t, conf.EnableNFTables)
	assert.Equal(t, "vxlan", conf.Backend.Type)
	assert.Equal(t, 4789, conf.Backend.Port)
	assert.Equal(t, netlab.ClusterCIDR.String(), ClusterCIDR, "Flannel's Network must be the lab's cluster pod network")
}

// TestFlannelCNIConfig checks each node's conflist is Flannel's plugin then portmap, with
// the node's own subnet file and state directories: nodes share the host's filesystem.
func TestFlannelCNIConfig(t *testing.T) {
	seen := map[string]bool{}
	for _, spec := range (&netlab.Net{}).Nodes() {
		n := &node{spec: spec}
		var conf struct {
			Name    string
			Plugins []map[string]any
		}
		require.NoError(t, json.Unmarshal([]byte(n.cniConfig()), &conf), spec.Name)
		require.Len(t, conf.Plugins, 2)
		assert.Equal(t, "flannel", conf.Plugins[0]["type"])
		assert.Equal(t, "portmap", conf.Plugins[1]["type"])
		paths := []string{conf.Plugins[0]["subnetFile"].(string), conf.Plugins[0]["dataDir"].(string),
			conf.Plugins[0]["ipam"].(map[string]any)["dataDir"].(string)}
		for _, p := range paths {
			assert.False(t, seen[p], "%s: %s is another node's too", spec.Name, p)
			seen[p] = true
		}
		assert.Equal(t, n.flannelSubnetFile(), paths[0])
	}
}
