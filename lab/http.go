package lab

import "fmt"

// ControllerHTTPAddr is controller replica 0's --http-listen address (ReplicaHTTPAddr(0)):
// the dashboard at "/", its state at "/api/state" and Prometheus metrics at "/metrics".
const ControllerHTTPAddr = "127.0.0.1:9090"

// ReplicaHTTPAddr is controller replica i's HTTP listener on loopback in the root namespace:
// 127.0.0.1:9090 for replica 0, 9091 for replica 1, and so on.
func ReplicaHTTPAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", 9090+i) }
