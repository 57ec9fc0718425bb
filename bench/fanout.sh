#!/bin/sh
# bench/fanout.sh: many real agent streams (package agent's client, TLS and token auth) in one
# process against the real kuport-controller in the embedded lab; a class change touching
# every node, acknowledged by all. Root: it starts the lab.
#   sudo sh bench/fanout.sh                  # the figures BENCHMARKS.md records (1,000 agents)
#   sudo sh bench/fanout.sh --agents 10      # a smoke run
exec sh "$(dirname "$0")/lab.sh" fanout "$@"
