package labbench

import (
	"fmt"
	"os/exec"
)

// The namespaces of the benches that build their own topology (bench/datapath, bench/link,
// bench/setlookup): commands run in order with ip netns exec, and the namespaces deleted
// after.

// In is args as a command run in network namespace ns.
func In(ns string, args ...string) []string {
	return append([]string{"ip", "netns", "exec", ns}, args...)
}

// Run runs each command in order and stops at the first that fails, its output in the error.
func Run(cmds ...[]string) error {
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v: %s", c, err, out)
		}
	}
	return nil
}

// DeleteNS deletes network namespaces, those already gone too.
func DeleteNS(names ...string) {
	for _, ns := range names {
		_ = exec.Command("ip", "netns", "delete", ns).Run()
	}
}
