#!/bin/sh
# bench/dashboard.sh: the controller's dashboard at 1, 1,000 and 10,000 mappings,
# one BENCH line per size: the first screen's state (/state's first page, encoded), the
# page drawn in headless chromium (make deps installs it; n/a without), one counter sample,
# and the memory of the 15-minute history and of the whole sampler (rates and history).
#   bench/dashboard.sh
set -eu
cd "$(dirname "$0")/.."
go test -run '^$' -bench '^BenchmarkDashboard$' -benchtime 3x ./controller/dashboard/ | grep '^BENCH '
