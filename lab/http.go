package lab

import "fmt"

// ControllerHTTPSAddr is controller replica 0's --http-listen address (ReplicaHTTPSAddr(0)),
// deploy/controller.yaml's port: the dashboard and Prometheus metrics over TLS, to a bearer
// token the API server allows (the ClusterRole kuport-metrics-reader).
const ControllerHTTPSAddr = "127.0.0.1:9090"

// ControllerHTTPAddr is controller replica 0's --http-loopback-listen address
// (ReplicaHTTPAddr(0)), the port deploy/controller.yaml gives it: the dashboard at "/", its
// state at "/state" and Prometheus metrics at "/metrics", in plain HTTP without
// authentication.
const ControllerHTTPAddr = "127.0.0.1:9091"

// ReplicaHTTPSAddr is controller replica i's --http-listen address in the root namespace:
// 127.0.0.1:9090 for replica 0, 9092 for replica 1, and so on.
func ReplicaHTTPSAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", 9090+2*i) }

// ReplicaHTTPAddr is controller replica i's --http-loopback-listen address in the root
// namespace: 127.0.0.1:9091 for replica 0, 9093 for replica 1, and so on.
func ReplicaHTTPAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", 9091+2*i) }
