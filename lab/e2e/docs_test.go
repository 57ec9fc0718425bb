package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"kuport.wlz.li/kuport/api/v1alpha1"
	"kuport.wlz.li/kuport/lab"
	"kuport.wlz.li/kuport/lab/docblocks"
)

// labShell runs script with bash (-euo pipefail) as an operator runs commands against the
// lab: with lab/env sourced (the lab's kubeconfig, kubectl and grpcurl), in dir, inside the
// network namespace of node, or beside the API server when node is "". It fails the test
// when the script does, and returns what it printed.
func labShell(t *testing.T, node, dir, script string) string {
	t.Helper()
	shell := "exec bash -euo pipefail"
	if node != "" {
		shell = "exec ip netns exec " + node + " bash -euo pipefail"
	}
	c := exec.Command("bash", "-c", "source "+filepath.Join(repoRoot, "lab/env")+" && "+shell)
	c.Dir = dir
	c.Stdin = strings.NewReader(script + "\n")
	out, err := c.CombinedOutput()
	require.NoError(t, err, "node %q:\n%s\n%s", node, script, out)
	return string(out)
}

// docsWant is what the output of a docs/ block must show against the lab after traffic
// through demo/remote, by block name: each says the block reads the number it says it
// reads.
var docsWant = map[string][]string{
	"link-name":          {`(?m)^dcc4266d$`},
	"prerequisites":      {`net\.ipv4\.ip_forward = 1`},
	"read-status":        {`(?m)^demo\s+remote\s+public\s+TCP\s+3000\s+\S+\s+True\s+(<none>\s+)?worker-b\s`, `Programmed=True AllNodesReady`, `Ready=True Valid`, `edge-a ready=true underlayMTU=1420 linkMTU=1370`},
	"first-checks":       {`(?m)^public\s`, `(?m)^demo\s+Active\s`, `10\.244\.18\.107`, `kuport-agent-edge-a`},
	"list-nodes":         {`"node": "edge-a"`, `"ackedVersion": "`},
	"numbers-accepting":  {`"enp1s0" \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ : 169\.254\.77\.\d+(,| \})`, `"enp1s0" \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/dnat/enp1s0" : 169\.254\.77\.\d+ \. 3000`, `(?m)^\s+type ipv4_addr \. inet_proto \. inet_service$`, `169\.254\.77\.\d+ \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/snat"`},
	"numbers-conntrack":  {`src=198\.51\.100\.7 dst=203\.0\.113\.9 sport=\d+ dport=3000 src=169\.254\.77\.\d+ dst=198\.51\.100\.7 sport=3000`},
	"numbers-link":       {`kup-dcc4266d`, `vxlan id \d+ remote 100\.64\.93\.143`, `169\.254\.77\.\d+ lladdr 02:6b:a9:fe:4d:[0-9a-f]{2} `},
	"neighbor":           {`169\.254\.77\.\d+ lladdr 02:6b:a9:fe:4d:[0-9a-f]{2} `, `kup-5e30a797\s+\S+\s+02:6b:a9:fe:4d:[0-9a-f]{2} `},
	"numbers-pod-node":   {`"kup-dcc4266d" \. 169\.254\.77\.\d+ \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ : 10\.244\.18\.107(,| \})`, `"kup-dcc4266d" \. 10\.244\.18\.107 \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/dnat/kup-dcc4266d" : 10\.244\.18\.107 \. 3000`, ctSaveWant, ctRestoreWant},
	"numbers-routing":    {`(?m)^101:\s+from all to 100\.64\.93\.143 fwmark 0x1/0x301f lookup main proto 107`, `(?m)^102:\s+from all fwmark 0x1/0x301f lookup 27505 proto 107`, `default via 169\.254\.77\.\d+ dev kup-dcc4266d proto 107`},
	"numbers-getmapping": {`"acked": true`, `"forwardedIn"`, `"demo/remote/dnat/enp1s0"`},
	"numbers-applied":    {`"demo/remote/dnat/enp1s0"`, `"applyTime"`},
	"lab-look":           {`(?m)^demo\s+remote\s+public\s+TCP\s+3000\s+10\.244\.18\.107\s+True\s*$`, `"demo/remote/dnat/enp1s0"`, `"applyTime": "`},
	"find-leader":        {`"node": "edge-a"`, `"ackedVersion": "`},
	"metrics-curl":       {`(?m)^kuport_agents_connected \d`, `"overview"`},
	"numbers-metrics":    {`kuport_mapping_packets_total\{direction="in",interface="enp1s0",name="remote",namespace="demo",node="edge-a"\} [1-9]`, `kuport_link_tx_errors_total\{link="kup-dcc4266d",node="worker-b",peer="edge-a"\} 0`},
	"reply-pod-address":  {ctSaveWant, ctRestoreWant, `(?m)^102:\s+from all fwmark 0x1/0x301f lookup 27505 proto 107`, `dev kup-dcc4266d table 27505`},
	"tx-errors":          {`dev wt0`},
	"rp-filter":          {`net\.ipv4\.conf\.kup-dcc4266d\.rp_filter = 2`, `TcpExtIPReversePathFilter\s+0`},
	"steering":           {`type filter hook prerouting priority -120; policy accept;`, `ct state new ip daddr set iifname \. meta l4proto \. th dport map @steer-ports accept`, `ct direction original ct status dnat iifname \. meta l4proto \. th dport map @steer-ports != 0x0 \[invalid type\]`, `"enp1s0" \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ : 169\.254\.77\.\d+(,| \})`},
	"host-firewall":      {`hook forward priority filter; policy drop;`},
	"cni-rows":           {`(?m)^edge-a\ttrue\t$`, `(?m)^remote\t`},
	"cni-bypass":         {`10\.244\.18\.107 \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/snat"`, ctRestoreWant},
	"table-clash":        {`(?m)^102:\s+from all fwmark 0x1/0x301f lookup 27505 proto 107`, `(?m)^table 27505$`},
	"mtu-class":          {`edge-a underlayMTU=1420 linkMTU=1370`},
	"mtu-node":           {`kup-5e30a797: .* mtu 1370 `, `1 received`},
	"wg-show":            {`(?m)^interface: wt0$`, `(?m)^\s+allowed ips: 100\.64\.93\.143/32(,|$)`, `latest handshake: `},
}

// On the pod's node every serving mode marks the return way through the flow: the request
// arriving on the link saves the link's mark, keyed by the address it dialed (the link's
// end), and the pod's reply restores it.
const (
	ctSaveWant    = `"kup-dcc4266d" \. 169\.254\.77\.\d+ \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/ct-save/kup-dcc4266d" : jump kup-ctmark-[0-9a-f]{8}`
	ctRestoreWant = `10\.244\.18\.107 \. tcp \. 3000 counter packets [1-9]\d* bytes \d+ comment "demo/remote/ct-restore"`
)

// docsStates put the lab into the state a docs/ block marked state=<name> repairs, check
// that it bites, and return what checks the block repaired it and then undoes it.
var docsStates = map[string]func(t *testing.T, l *lab.Lab) (repaired, undo func()){
	// A host firewall whose forward chain drops by default (docs/troubleshooting.md#a-host-firewall).
	"firewall": func(t *testing.T, l *lab.Lab) (func(), func()) {
		ctx := context.Background()
		for _, cmd := range []string{"add table inet filter",
			"add chain inet filter forward { type filter hook forward priority filter ; policy drop ; }"} {
			_, err := l.Net.Exec(ctx, "edge-a", "nft", cmd)
			require.NoError(t, err)
		}
		podSaw, _, err := l.ProbeAddr(ctx, "TCP", lab.PublicAddr, 3000, 1)
		require.NoError(t, err)
		require.Equal(t, "none", podSaw, "the firewall's forward chain did not drop the mapping's traffic")
		return func() { assertAnswers(t, l, 3000) },
			func() { _, _ = l.Net.Exec(ctx, "edge-a", "nft", "delete table inet filter") }
	},
}

// TestPrivilegedE2EDocs runs every shell block of docs/ against the lab (lab/docblocks),
// after real traffic through the cross-node mapping demo/remote, each where its marker says
// and each checked against what it says it shows. Blocks marked kubelab= are the
// kubelet-backed lab's install suite's to run.
func TestPrivilegedE2EDocs(t *testing.T) {
	blocks, err := docblocks.Docs(repoRoot)
	require.NoError(t, err)
	l := startLab(t)
	ctx := context.Background()
	remote := lab.DemoScenarios()[1]
	require.NoError(t, l.StartScenario(ctx, remote))
	waitCondition(t, l, lab.DemoNamespace, remote.Name, v1alpha1.ConditionProgrammed, "True", 30*time.Second)
	assertAnswers(t, l, 3000)
	// The controller's counters come from the agents' reports (every 2 s in the lab).
	time.Sleep(3 * time.Second)

	ran := map[string]bool{}
	for _, b := range blocks {
		if b.Options["kubelab"] != "" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			repaired := func() {}
			if s := b.Options["state"]; s != "" {
				setup, ok := docsStates[s]
				require.True(t, ok, "%s block %s: no lab state %q", b.File, b.Name, s)
				var undo func()
				repaired, undo = setup(t, l)
				defer undo()
			}
			out := labShell(t, b.Options["node"], t.TempDir(), strings.Join(b.Commands, "\n"))
			t.Logf("%s:\n%s", b.Name, out)
			for _, w := range docsWant[b.Name] {
				assert.Regexp(t, w, out)
			}
			repaired()
		})
		ran[b.Name] = true
	}
	for name := range docsWant {
		assert.True(t, ran[name], "docsWant names %s, which no docs/ block is", name)
	}
}
