package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// netnsDir is where `ip netns` keeps its named namespaces.
const netnsDir = "/run/netns"

// command runs name args with stdin (may be "") inside netns (via `ip netns exec`), or
// in the calling namespace when netns is "" (only `ip netns add|del|pids` do that).
// It returns the combined output, which the error also carries.
func (n *Net) command(ctx context.Context, stdin, netns string, args ...string) (string, error) {
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	n.log.Trace("exec", "args", args)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Exec runs args inside the lab namespace netns and returns the combined output; on
// failure the error carries the command and its output. netns must not be "": the lab
// never runs commands in the root network namespace.
func (n *Net) Exec(ctx context.Context, netns string, args ...string) (string, error) {
	if netns == "" || len(args) == 0 {
		return "", errors.New("netlab: Exec needs a namespace and a command")
	}
	return n.command(ctx, "", netns, args...)
}

// ip runs `ip -n netns args...`.
func (n *Net) ip(ctx context.Context, netns string, args ...string) error {
	_, err := n.command(ctx, "", "", append([]string{"ip", "-n", netns}, args...)...)
	return err
}

// sysctl sets each key=value inside netns.
func (n *Net) sysctl(ctx context.Context, netns string, settings ...string) error {
	_, err := n.Exec(ctx, netns, append([]string{"sysctl", "-q", "-w"}, settings...)...)
	return err
}

// NftApply loads an nft script (the `nft -f` syntax) into netns atomically.
func (n *Net) NftApply(ctx context.Context, netns, script string) error {
	if netns == "" {
		return errors.New("netlab: NftApply needs a namespace")
	}
	_, err := n.command(ctx, script, netns, "nft", "-f", "-")
	return err
}

// NftCounter returns the packet count of the named counter object family/table/name in
// netns (e.g. "worker-b", "ip", "lab-mesh", "mesh_drops").
func (n *Net) NftCounter(ctx context.Context, netns, family, table, name string) (uint64, error) {
	out, err := n.Exec(ctx, netns, "nft", "-j", "list", "counter", family, table, name)
	if err != nil {
		return 0, err
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, fmt.Errorf("parse nft counter %s %s %s: %w", family, table, name, err)
	}
	for _, o := range doc.Nftables {
		if o.Counter != nil {
			return o.Counter.Packets, nil
		}
	}
	return 0, fmt.Errorf("nft counter %s %s %s: not in output %q", family, table, name, out)
}

// linkWait bounds how long waitLinks waits for veths to come up.
const linkWait = 5 * time.Second

// waitLinks waits until every veth in netns is operationally up and, when it is a bridge
// port, forwarding. The kernel defers part of a link's state change (linkwatch, up to a
// second), and a bridge port forwards nothing until then: a probe sent straight after
// Build or AddPod could otherwise be lost.
func (n *Net) waitLinks(ctx context.Context, netns string) error {
	deadline := time.Now().Add(linkWait)
	for {
		out, err := n.command(ctx, "", "", "ip", "-n", netns, "-j", "-d", "link", "show")
		if err != nil {
			return err
		}
		var links []struct {
			Name      string `json:"ifname"`
			OperState string `json:"operstate"`
			LinkInfo  struct {
				Kind      string `json:"info_kind"`
				SlaveKind string `json:"info_slave_kind"`
				SlaveData struct {
					State string `json:"state"`
				} `json:"info_slave_data"`
			} `json:"linkinfo"`
		}
		if err := json.Unmarshal([]byte(out), &links); err != nil {
			return fmt.Errorf("parse links of %s: %w", netns, err)
		}
		pending := ""
		for _, l := range links {
			if l.LinkInfo.Kind != "veth" {
				continue
			}
			if l.OperState != "UP" || (l.LinkInfo.SlaveKind == "bridge" && l.LinkInfo.SlaveData.State != "forwarding") {
				pending = fmt.Sprintf("%s is %s/%s", l.Name, l.OperState, l.LinkInfo.SlaveData.State)
				break
			}
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s after %s", netns, pending, linkWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s: %w", netns, pending, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// deleteNamespace kills the processes inside ns and deletes it; a missing ns is success.
func deleteNamespace(ns string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out, err := exec.Command("ip", "netns", "pids", ns).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns pids %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill pid %d in %s: %w", pid, ns, err)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}
