package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"kuport.wlz.li/kuport/api/v1alpha1"
)

// The demo's fixed objects: namespace demo, the class `public` of
// docs/design/datapath.md#serving-modes and its twin `public-none` with returnPath None, a
// pod on each node.
const (
	DemoNamespace = "demo"
	PublicAddr    = "203.0.113.9"
	ClientAddr    = "198.51.100.7"
	// PublicAddr6 and ClientAddr6 are edge-a's uplink's and the client's IPv6 addresses
	// (lab/netlab/netlab.go).
	PublicAddr6 = "2001:db8:113::9"
	ClientAddr6 = "2001:db8:100::7"
)

var (
	// PodA runs on the accepting node edge-a.
	PodA = Pod{Namespace: DemoNamespace, Name: "web-a", Node: "edge-a", IP: "10.244.17.7"}
	// PodB runs on worker-b, which accepts nothing.
	PodB = Pod{Namespace: DemoNamespace, Name: "web-b", Node: "worker-b", IP: "10.244.18.107"}
)

// DemoClass returns the class `public` of docs/design/datapath.md#serving-modes under name
// with the given return path mode.
func DemoClass(name string, mode v1alpha1.ReturnPathMode) *v1alpha1.PortMapClass {
	return &v1alpha1.PortMapClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.PortMapClassSpec{
			Nodes:      map[string]v1alpha1.ClassNode{"edge-a": {Interfaces: []string{"enp1s0", "wt0"}}},
			Ports:      v1alpha1.PortPolicy{Min: 1024, Max: 65535, Reserved: []int32{80, 443}},
			ReturnPath: v1alpha1.ReturnPath{Mode: mode},
		},
	}
}

// Scenario is one demo line: a PortMap to one pod, probed from the client.
type Scenario struct {
	Name  string
	Class string
	Pod   Pod
	Proto corev1.Protocol
	Port  int32
	// Want is what a passing run observes.
	WantPodSaw, WantReplyFrom, WantProgrammed string
}

// DemoScenarios are the demo's four scenarios (docs/lab.md#make-demo), in order.
func DemoScenarios() []Scenario {
	return []Scenario{
		{Name: "local", Class: "public", Pod: PodA, Proto: corev1.ProtocolTCP, Port: 3000,
			WantPodSaw: ClientAddr, WantReplyFrom: PublicAddr + ":3000", WantProgrammed: "True"},
		{Name: "remote", Class: "public", Pod: PodB, Proto: corev1.ProtocolTCP, Port: 3000,
			WantPodSaw: ClientAddr, WantReplyFrom: PublicAddr + ":3000", WantProgrammed: "True"},
		{Name: "remote-udp", Class: "public", Pod: PodB, Proto: corev1.ProtocolUDP, Port: 27015,
			WantPodSaw: ClientAddr, WantReplyFrom: PublicAddr + ":27015", WantProgrammed: "True"},
		{Name: "refused", Class: "public-none", Pod: PodB, Proto: corev1.ProtocolTCP, Port: 3001,
			WantPodSaw: "none", WantReplyFrom: "none", WantProgrammed: "False:" + v1alpha1.ReasonReturnPathUnavailable},
	}
}

// Outcome is what a scenario observed.
type Outcome struct {
	Scenario   Scenario
	PodSaw     string // "none" when the pod answered nothing
	ReplyFrom  string // "none" when no reply came back
	Programmed string // "True", or "False:<reason>"
	// Problems lists every failed check beyond the three values (server log, kernel rules).
	Problems []string
}

// Pass reports whether every value and check matched.
func (o Outcome) Pass() bool {
	s := o.Scenario
	return o.PodSaw == s.WantPodSaw && o.ReplyFrom == s.WantReplyFrom && o.Programmed == s.WantProgrammed && len(o.Problems) == 0
}

// Line is the scenario's stdout line.
func (o Outcome) Line() string {
	verdict := "PASS"
	if !o.Pass() {
		verdict = "FAIL"
	}
	return fmt.Sprintf("SCENARIO %s pod_saw=%s reply_from=%s programmed=%s %s", o.Scenario.Name, o.PodSaw, o.ReplyFrom, o.Programmed, verdict)
}

// SetupDemo writes the demo's classes and pods and starts every pod's servers.
func (l *Lab) SetupDemo(ctx context.Context) error {
	if err := l.Cluster.EnsureNamespace(ctx, DemoNamespace, nil); err != nil {
		return err
	}
	for _, c := range []*v1alpha1.PortMapClass{DemoClass("public", v1alpha1.ReturnPathVxlan), DemoClass("public-none", v1alpha1.ReturnPathNone)} {
		if err := l.ApplyClass(ctx, c); err != nil {
			return err
		}
	}
	for _, p := range []Pod{PodA, PodB} {
		if err := l.AddPod(ctx, p); err != nil {
			return err
		}
	}
	for _, s := range DemoScenarios() {
		if _, err := l.Net.Serve(s.Pod.Name, strings.ToLower(string(s.Proto)), int(s.Port)); err != nil {
			return err
		}
	}
	return nil
}

// ProgrammedState renders a PortMap's Programmed condition as "True" or "False:<reason>",
// "none" when absent or older than the PortMap's generation.
func ProgrammedState(pm *v1alpha1.PortMap) string {
	c := meta.FindStatusCondition(pm.Status.Conditions, v1alpha1.ConditionProgrammed)
	if c == nil || c.ObservedGeneration != pm.Generation {
		return "none"
	}
	if c.Status == metav1.ConditionTrue {
		return "True"
	}
	return "False:" + c.Reason
}

// WaitProgrammed waits up to timeout for the PortMap's Programmed state to equal want and
// returns the last state seen.
func (l *Lab) WaitProgrammed(ctx context.Context, namespace, name, want string, timeout time.Duration) (string, error) {
	last := "none"
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pm, err := l.GetPortMap(ctx, namespace, name)
		if err != nil {
			return false, nil
		}
		last = ProgrammedState(pm)
		return last == want, nil
	})
	return last, err
}

// RulesMentioning returns, per node, the lines of `inet kuport` containing any of needles.
func (l *Lab) RulesMentioning(ctx context.Context, needles ...string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, n := range l.Net.Nodes() {
		table, err := l.NftTable(ctx, n.Name)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(table, "\n") {
			for _, needle := range needles {
				if strings.Contains(line, needle) {
					out[n.Name] = append(out[n.Name], strings.TrimSpace(line))
					break
				}
			}
		}
	}
	return out, nil
}

// WaitRulesGone waits until no node's table mentions any of needles.
func (l *Lab) WaitRulesGone(ctx context.Context, timeout time.Duration, needles ...string) error {
	var left map[string][]string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		left, err = l.RulesMentioning(ctx, needles...)
		return err == nil && len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("rules still present: %v: %w", left, err)
	}
	return nil
}

// Probe sends one request from the client to the public address and port, retrying a
// few times (a first UDP datagram can be lost to neighbour resolution) until something
// comes back. Values are "none" when nothing did.
func (l *Lab) Probe(ctx context.Context, proto corev1.Protocol, port int32, tries int) (podSaw, replyFrom string, err error) {
	return l.ProbeAddr(ctx, proto, PublicAddr, port, tries)
}

// ProbeAddr is Probe to any address the client can reach (a node's uplink address, a
// routed virtual address).
func (l *Lab) ProbeAddr(ctx context.Context, proto corev1.Protocol, addr string, port int32, tries int) (podSaw, replyFrom string, err error) {
	podSaw, replyFrom = "none", "none"
	for i := 0; i < tries; i++ {
		r, err := l.Net.Probe(ctx, strings.ToLower(string(proto)), net.JoinHostPort(addr, strconv.Itoa(int(port))), 2*time.Second)
		if err != nil {
			return podSaw, replyFrom, err
		}
		if r.PodSaw != "" || r.ReplyFrom != "" {
			return orNone(r.PodSaw), orNone(r.ReplyFrom), nil
		}
	}
	return podSaw, replyFrom, nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// StartScenario creates the scenario's Service (one port named "app", its only endpoint the
// scenario's pod) and its PortMap.
func (l *Lab) StartScenario(ctx context.Context, s Scenario) error {
	const portName = "app"
	if err := l.Expose(ctx, DemoNamespace, s.Name, portName, s.Proto, s.Port, Backend{Pod: s.Pod, Ready: true}); err != nil {
		return err
	}
	return l.ApplyPortMap(ctx, &v1alpha1.PortMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: DemoNamespace, Name: s.Name},
		Spec: v1alpha1.PortMapSpec{
			ClassName: s.Class, Protocol: v1alpha1.Protocol(s.Proto), Port: s.Port,
			ServiceRef: v1alpha1.ServiceRef{Name: s.Name, Port: portName},
		},
	})
}

// RunScenario creates the scenario's Service and PortMap, waits for the expected
// Programmed state, probes, checks the pod's server log and the kernels, then deletes the
// PortMap and Service and waits until its rules are gone from every node.
func (l *Lab) RunScenario(ctx context.Context, s Scenario) (Outcome, error) {
	o := Outcome{Scenario: s, PodSaw: "none", ReplyFrom: "none", Programmed: "none"}
	proto := strings.ToLower(string(s.Proto))
	if err := l.StartScenario(ctx, s); err != nil {
		return o, err
	}
	var err error
	o.Programmed, err = l.WaitProgrammed(ctx, DemoNamespace, s.Name, s.WantProgrammed, 30*time.Second)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return o, err
	}
	tries := 3
	if s.WantPodSaw == "none" {
		tries = 1
	}
	if o.PodSaw, o.ReplyFrom, err = l.Probe(ctx, s.Proto, s.Port, tries); err != nil {
		return o, err
	}
	log, err := l.Net.ServerLog(s.Pod.Name, proto, int(s.Port))
	if err != nil {
		return o, err
	}
	saw := strings.Contains(log, "saw "+ClientAddr+":")
	switch {
	case s.WantPodSaw == "none" && strings.Contains(log, "saw "):
		o.Problems = append(o.Problems, "the pod's server logged a request")
	case s.WantPodSaw != "none" && !saw:
		o.Problems = append(o.Problems, "the pod's server log names no connection from the client")
	}
	if s.WantPodSaw == "none" {
		// Refused: no rule matching the port in any node's kernel.
		rules, err := l.RulesMentioning(ctx, fmt.Sprintf("dport %d", s.Port), fmt.Sprintf("sport %d", s.Port))
		if err != nil {
			return o, err
		}
		if len(rules) > 0 {
			o.Problems = append(o.Problems, fmt.Sprintf("rules for port %d in the kernel: %v", s.Port, rules))
		}
	}
	if err := l.DeletePortMap(ctx, DemoNamespace, s.Name); err != nil {
		return o, err
	}
	if err := l.Unexpose(ctx, DemoNamespace, s.Name); err != nil {
		return o, err
	}
	if err := l.WaitRulesGone(ctx, 30*time.Second, `"`+DemoNamespace+"/"+s.Name+"/"); err != nil {
		o.Problems = append(o.Problems, err.Error())
	}
	if err := l.waitPortMapGone(ctx, s.Name); err != nil {
		return o, err
	}
	return o, nil
}

func (l *Lab) waitPortMapGone(ctx context.Context, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := l.GetPortMap(ctx, DemoNamespace, name)
		return apierrors.IsNotFound(err), nil
	})
}

// RunDemo runs the demo's scenarios one after another and returns their outcomes; each
// scenario's PortMap is created only after the previous one's rules are gone.
func (l *Lab) RunDemo(ctx context.Context) ([]Outcome, error) {
	var out []Outcome
	for _, s := range DemoScenarios() {
		o, err := l.RunScenario(ctx, s)
		out = append(out, o)
		if err != nil {
			return out, fmt.Errorf("scenario %s: %w", s.Name, err)
		}
	}
	return out, nil
}
