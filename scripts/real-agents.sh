#!/usr/bin/env bash
# The real ACP agents, by script (not in CI): the npm ACP adapters of
# Claude Code (@agentclientprotocol/claude-agent-acp, pointed at a fake
# Anthropic Messages API with ANTHROPIC_BASE_URL) and Codex
# (@agentclientprotocol/codex-acp, a model_providers entry pointing at a
# fake Responses API) run by the `acp` backend: an answer, a restart that
# continues the session (or says it starts fresh), /new, and for Claude a
# permission request answered by button. Every fake runs on 127.0.0.1
# inside the test binary (tests/it/real_agents.rs); only npm is reached,
# to install.
#
#   scripts/real-agents.sh            install (once) into the cache, run, print
#   TELEGATE_REAL_CACHE=DIR ...       another cache directory
#
# Not covered here: Gemini CLI (`gemini --acp`) needs a fake of Google's
# Gemini API, and OpenCode its providers' APIs; neither fake exists yet.
#
# Prints a pass/fail table; exits 1 if any row failed.
set -uo pipefail
cd "$(dirname "$0")/.."

cache=${TELEGATE_REAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/telegate-real-acp}
packages=(
    @agentclientprotocol/claude-agent-acp
    @agentclientprotocol/codex-acp
)
mkdir -p "$cache"
bin="$cache/node_modules/.bin"
if [ ! -x "$bin/claude-agent-acp" ] || [ ! -x "$bin/codex-acp" ]; then
    echo "installing ${packages[*]} into $cache" >&2
    npm install --prefix "$cache" --no-audit --no-fund "${packages[@]}" >&2 || {
        echo "npm install failed" >&2
        exit 1
    }
fi
npm_version() { node -p "require('$cache/node_modules/$1/package.json').version" 2>/dev/null; }

cargo build --locked --tests >&2 || exit 1

rows=(
    "real_claude_agent_acp_answers_continues_and_asks_on_the_card|claude-agent-acp $(npm_version @agentclientprotocol/claude-agent-acp): answer, restart, /new, permission by button"
    "real_codex_acp_answers_and_continues|codex-acp $(npm_version @agentclientprotocol/codex-acp): answer, restart, /new"
)
log_dir=$(mktemp -d)
failed=0
results=()
for row in "${rows[@]}"; do
    test=${row%%|*}
    what=${row#*|}
    log="$log_dir/$test.log"
    start=$(date +%s)
    if TELEGATE_REAL_ACP_BIN="$bin" cargo test --locked --test it -- "real_agents::$test" \
        --ignored --exact --test-threads=1 --nocapture >"$log" 2>&1 \
        && grep -q "test result: ok. 1 passed" "$log"; then
        outcome=pass
    else
        outcome=FAIL
        failed=1
    fi
    note=$(grep -o -e "after the restart: [a-z ()]*" -e "stop: told after [0-9]* ms" "$log" | paste -sd ";" -)
    results+=("$outcome|$(( $(date +%s) - start )) s|$what${note:+ ($note)}|$log")
done

printf '\n| result | time | what |\n|--------|------|------|\n'
for result in "${results[@]}"; do
    IFS='|' read -r outcome took what log <<<"$result"
    printf '| %s | %s | %s |\n' "$outcome" "$took" "$what"
    if [ "$outcome" != pass ]; then
        echo "  log: $log" >&2
    fi
done
exit $failed
