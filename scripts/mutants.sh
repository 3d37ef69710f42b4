#!/usr/bin/env bash
# Mutation testing of the session engine's core files with cargo-mutants
# (`cargo install cargo-mutants`). Not part of CI: a full run takes hours.
#
# Each group of files is tested with the test binaries that exercise it
# (unit tests in the library plus the integration tests named below), so a
# mutant is "caught" only by tests that claim to cover that code.
#
# Usage: scripts/mutants.sh [group...]   (default: every group)
#   groups: slots pending guard identity wakeup split entity
#           adapter runner ledger intake delivery
# Knobs (environment):
#   MUTANTS_JOBS      parallel builds (default 1: the machine is shared)
#   MUTANTS_TIMEOUT   per-mutant test timeout in seconds (default 300)
#   MUTANTS_TARGET    target dir for the mutated builds (default
#                     target/mutants, kept apart from the normal build;
#                     with MUTANTS_JOBS > 1 each job keeps its own)
#   PROPTEST_CASES    proptest cases per property inside mutant runs
#                     (default 64: enough to hit the engine's paths)
#   MUTANTS_ARGS      more cargo-mutants arguments, split on spaces: e.g.
#                     "-E controls\.rs:(18|66): -E src/runner/mod\.rs" to
#                     skip mutants an interrupted run already tested
# Survivors must be killed by a new test or listed, with the reason they
# are equivalent, in mutants-accepted.md (its `text accepted` block); the
# script exits 2 if any survivor is not listed there.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=${MUTANTS_JOBS:-1}
timeout=${MUTANTS_TIMEOUT:-300}
if [ "$jobs" -gt 1 ]; then
    # Parallel jobs must not share a target dir: one job's build would
    # overwrite the test binaries the other is running. Each of
    # cargo-mutants' build dirs keeps a target of its own instead (one cold
    # build each).
    if [ -n "${MUTANTS_TARGET:-}" ]; then
        echo "MUTANTS_TARGET cannot be shared by MUTANTS_JOBS=$jobs" >&2
        exit 2
    fi
    unset CARGO_TARGET_DIR
else
    export CARGO_TARGET_DIR=${MUTANTS_TARGET:-$PWD/target/mutants}
fi
export PROPTEST_CASES=${PROPTEST_CASES:-64}
# Most of a mutant's time is relinking the test binaries: no debug info
# (nobody reads a mutant's backtrace) and mold, when installed
# (`apt-get install mold`), make each link several times faster.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-0}
export CARGO_PROFILE_TEST_DEBUG=${CARGO_PROFILE_TEST_DEBUG:-0}
if command -v mold >/dev/null && [ -z "${RUSTFLAGS:-}" ]; then
    export RUSTFLAGS="-C link-arg=-fuse-ld=mold"
fi

# The integration tests are one binary (`it`), a module per area: a group
# names the modules that exercise its files (plus the library's unit tests).
engine_tests=(session_split_brain engine_behaviour adapter_alone engine_properties)

files_of() {
    case "$1" in
        slots) echo src/runner/slots.rs ;;
        pending) echo src/adapter/pending.rs ;;
        guard) echo src/adapter/guard.rs ;;
        identity) echo src/vocab/identity.rs ;;
        wakeup) echo src/tools/wakeup.rs ;;
        split) echo src/delivery/split.rs ;;
        entity) echo src/delivery/entity.rs ;;
        adapter) echo "src/adapter/mod.rs src/adapter/state.rs src/adapter/owner.rs src/adapter/handler.rs src/adapter/outcome.rs" ;;
        runner) echo "src/runner/mod.rs src/runner/turn.rs src/runner/outcome.rs src/runner/controls.rs src/runner/commands.rs src/runner/session_table.rs src/runner/watchdog.rs" ;;
        ledger) echo src/store/inbox.rs ;;
        intake) echo "src/transport/telegram/intake.rs src/transport/telegram/inbox_writer.rs src/transport/telegram/inbox_listener.rs src/transport/telegram/dispatch.rs src/transport/telegram/chat_stages.rs" ;;
        delivery) echo "src/delivery/telegram.rs src/delivery/lanes.rs" ;;
        *) echo "unknown group: $1" >&2; exit 2 ;;
    esac
}

tests_of() {
    case "$1" in
        slots | pending | guard) echo "${engine_tests[*]}" ;;
        identity | wakeup) echo "xsession_wakeup terminal_e2e" ;;
        split | entity) echo "telegram_e2e" ;;
        adapter | runner) echo "${engine_tests[*]} instant_control xsession_wakeup telegram_e2e terminal_e2e approval_authority_e2e terminal_approval_e2e controls_e2e cli_agents_e2e media_e2e" ;;
        ledger) echo "crash_recovery telegram_e2e outbox_once" ;;
        intake) echo "crash_recovery telegram_e2e outbox_once media_e2e media_queue_e2e webhook_lifecycle store_integrity instance_lock controls_e2e inbound_fuzz" ;;
        delivery) echo "telegram_e2e outbox_once chaos delivery_retries" ;;
    esac
}

groups=("$@")
if [ ${#groups[@]} -eq 0 ]; then
    groups=(slots pending guard identity wakeup split entity adapter runner ledger intake delivery)
fi

# cargo-nextest runs the test binaries' tests in parallel: the e2e tests
# mostly wait (on fakes and timers), so a surviving mutant takes seconds to
# test instead of a minute of binaries run one after the other.
test_tool=()
if cargo nextest --version >/dev/null 2>&1; then
    test_tool=(--test-tool nextest)
fi

# Split on spaces only (no globbing: the arguments are regexes).
read -r -a extra_args <<<"${MUTANTS_ARGS:-}"

# Prints the survivors listed in `$1` that mutants-accepted.md does not
# accept (names compared without line and column; each accepted line
# covers one survivor) and fails if there is any.
unexplained() {
    python3 - "$1" mutants-accepted.md <<'PY'
import re, sys
from collections import Counter
missed_path, accepted_path = sys.argv[1], sys.argv[2]
text = open(accepted_path, encoding="utf-8").read()
block = re.search(r"```text accepted\n(.*?)```", text, re.S)
accepted = Counter(l.strip() for l in (block.group(1) if block else "").splitlines() if l.strip())
try:
    missed = [l.strip() for l in open(missed_path, encoding="utf-8") if l.strip()]
except FileNotFoundError:
    missed = []
bad = []
for name in missed:
    key = re.sub(r"^([^:]+):\d+:\d+:", r"\1:", name)
    if accepted[key] > 0:
        accepted[key] -= 1
        print(f"   accepted   {name}")
    else:
        bad.append(name)
for name in bad:
    print(f"   UNEXPLAINED {name}")
sys.exit(1 if bad else 0)
PY
}

mkdir -p target/mutants-out
status=0
failed=0
for group in "${groups[@]}"; do
    file_args=()
    for f in $(files_of "$group"); do file_args+=(-f "$f"); done
    echo "== mutants: $group ($(files_of "$group"))"
    # The test targets go to every cargo invocation (--cargo-arg), not only
    # to `cargo test` after `--`: otherwise each mutant's build links all
    # of the crate's ~36 test binaries, which took over 30 minutes a mutant
    # on a loaded two-core machine.
    # Only the library and the `it` binary are built (--cargo-arg goes to
    # every cargo invocation, so each mutant links two test binaries), and
    # of `it` only the group's modules run: a nextest filterset where
    # nextest is installed, else the whole binary.
    target_args=(--cargo-arg=--lib --cargo-arg=--test --cargo-arg=it)
    if [ ${#test_tool[@]} -gt 0 ]; then
        filter="kind(lib)"
        for module in $(tests_of "$group"); do filter+=" | test(/^${module}::/)"; done
        target_args+=("--cargo-test-arg=-E" "--cargo-test-arg=$filter")
    fi
    cargo mutants "${file_args[@]}" -j "$jobs" --timeout "$timeout" \
        "${test_tool[@]}" \
        --build-timeout 1800 --baseline skip --copy-target false \
        --output "target/mutants-out/$group" \
        "${extra_args[@]}" "${target_args[@]}" || status=$?
    # cargo-mutants writes the outcome lists; summarise them.
    out="target/mutants-out/$group/mutants.out"
    for kind in caught missed unviable timeout; do
        printf '   %-8s %s\n' "$kind" "$(wc -l <"$out/$kind.txt" 2>/dev/null || echo 0)"
    done
    # Survivors are fine only when mutants-accepted.md lists them.
    if ! unexplained "$out/missed.txt"; then
        failed=1
    fi
done
# 0: every survivor is listed in mutants-accepted.md (timeouts count as
# caught: the mutant hung a test); 2: unexplained survivors.
if [ "$failed" -ne 0 ]; then
    exit 2
fi
if [ "$status" -ne 0 ] && [ "$status" -ne 2 ] && [ "$status" -ne 3 ]; then
    exit "$status"
fi
exit 0
