#!/usr/bin/env bash
# The session-engine property test with many more cases than CI runs
# (CI: 1,000 per property). Not part of CI: on a small machine this takes
# a long while. Usage: scripts/proptest-long.sh [cases]   (default 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-${PROPTEST_CASES:-10000}}
if [ "$cases" -lt 10000 ]; then
    echo "the long run uses at least 10,000 cases (got $cases)" >&2
    exit 2
fi
PROPTEST_CASES=$cases exec cargo test --locked --test it engine_properties:: -- --test-threads=2
