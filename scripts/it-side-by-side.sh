#!/usr/bin/env bash
# Runs the whole integration-test binary (`tests/it`) several times at once,
# side by side, to find tests that pass only on a quiet machine: an
# assertion that reads an asynchronous result without waiting for it
# fails here long before it fails in CI. Not part of CI (it loads the
# machine on purpose); run it before stopping. Expect zero failures.
#
# Usage: scripts/it-side-by-side.sh [copies] [test-filter...]
#   copies        how many copies run at once (default 4)
#   test-filter   passed to each copy (default: every test)
# Knobs (environment):
#   IT_ROUNDS     how many rounds of `copies` runs (default 1)
#   IT_TIMEOUT    seconds one copy may take before it counts as failed
#                 (default 1500)
# Each copy gets its own TMPDIR; its output is kept in target/side-by-side/
# (one log per copy and round). The last line is the usual
# "N passed, N failed" count of copies.
set -euo pipefail
cd "$(dirname "$0")/.."

copies=${1:-4}
shift || true
rounds=${IT_ROUNDS:-1}
timeout=${IT_TIMEOUT:-1500}

# Build once; find the binary cargo made.
binary=$(cargo test --locked --test it --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "it" and m.get("executable"):
        print(m["executable"])' | tail -1)
if [[ -z "$binary" || ! -x "$binary" ]]; then
    echo "could not build the it test binary (run: cargo test --test it --no-run)" >&2
    exit 1
fi

out=target/side-by-side
rm -rf "$out"
mkdir -p "$out"
passed=0
failed=0
for round in $(seq 1 "$rounds"); do
    pids=()
    for copy in $(seq 1 "$copies"); do
        tmp=$(mktemp -d)
        # Like /tmp: tests that run commands as another user (run_as) make
        # their directories there too.
        chmod 1777 "$tmp"
        log="$out/round$round-copy$copy.log"
        (
            # From the package root, as cargo runs it.
            status=0
            TMPDIR=$tmp timeout "$timeout" "$binary" "$@" >"$log" 2>&1 || status=$?
            rm -rf "$tmp"
            exit $status
        ) &
        pids+=("$!")
    done
    for i in "${!pids[@]}"; do
        copy=$((i + 1))
        log="$out/round$round-copy$copy.log"
        if wait "${pids[$i]}"; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
            echo "round $round copy $copy FAILED ($log):"
            grep -E '^test .* FAILED$|^---- ' "$log" | sed 's/^/    /' | head -40
        fi
    done
done
echo "side by side: $copies copies x $rounds rounds"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
