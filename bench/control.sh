#!/bin/sh
# bench/control.sh: kuport's control plane side by side with kube-proxy v1.36.3 in nftables
# mode, in one run in the embedded lab. Root: it starts the lab (network
# namespaces, a real API server, the real kuport-controller and kuport-agent of bin/).
#   sudo sh bench/control.sh                        # the figures BENCHMARKS.md records
#   sudo sh bench/control.sh -n 10 --changes 2 --bulk 10   # a smoke run
exec sh "$(dirname "$0")/lab.sh" control "$@"
