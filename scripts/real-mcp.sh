#!/usr/bin/env bash
# The real clients, by script (not in CI): the npm MCP servers
# (@modelcontextprotocol/server-filesystem, server-everything) used by the
# openai backend against the fake LLM, the real Claude Code
# (@anthropic-ai/claude-code, pointed at a fake Anthropic Messages API with
# ANTHROPIC_BASE_URL) answering a permission prompt through telegate's MCP
# helper by button, and the real Codex (@openai/codex, a model_providers
# entry pointing at a fake Responses API, its key from CODEX_API_KEY) for
# the usage counted per turn. Every fake runs on 127.0.0.1 inside the test
# binary (tests/it/real_clients.rs); only npm is reached, to install.
#
#   scripts/real-mcp.sh            install (once) into the cache, run, print
#   TELEGATE_REAL_CACHE=DIR ...    another cache directory
#
# Prints a pass/fail table; exits 1 if any row failed.
set -uo pipefail
cd "$(dirname "$0")/.."

cache=${TELEGATE_REAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/telegate-real}
packages=(
    @modelcontextprotocol/server-filesystem
    @modelcontextprotocol/server-everything
    @anthropic-ai/claude-code
    @openai/codex
)
mkdir -p "$cache"
bin="$cache/node_modules/.bin"
if [ ! -x "$bin/claude" ] || [ ! -x "$bin/codex" ] || [ ! -x "$bin/mcp-server-filesystem" ] \
    || [ ! -x "$bin/mcp-server-everything" ]; then
    echo "installing ${packages[*]} into $cache" >&2
    npm install --prefix "$cache" --no-audit --no-fund "${packages[@]}" >&2 || {
        echo "npm install failed" >&2
        exit 1
    }
fi
version() { "$bin/$1" --version 2>/dev/null | head -n 1; }
npm_version() { node -p "require('$cache/node_modules/$1/package.json').version" 2>/dev/null; }

cargo build --locked --tests >&2 || exit 1

rows=(
    "real_filesystem_server_reads_and_writes_behind_the_card|server-filesystem $(npm_version @modelcontextprotocol/server-filesystem) (stdio): read, write behind the card"
    "real_everything_server_over_stdio_and_streamable_http|server-everything $(npm_version @modelcontextprotocol/server-everything) (stdio + streamable HTTP): echo, image described, minimal env, allowed_tools"
    "real_claude_code_asks_its_permission_prompt_on_the_card|Claude Code $(version claude): permission prompt answered by button"
    "real_codex_usage_after_resume_is_counted_per_turn|Codex $(version codex): CODEX_API_KEY, usage after resume per turn"
)
log_dir=$(mktemp -d)
failed=0
results=()
for row in "${rows[@]}"; do
    test=${row%%|*}
    what=${row#*|}
    log="$log_dir/$test.log"
    start=$(date +%s)
    if TELEGATE_REAL_BIN="$bin" cargo test --locked --test it -- "real_clients::$test" \
        --ignored --exact --test-threads=1 >"$log" 2>&1 \
        && grep -q "test result: ok. 1 passed" "$log"; then
        outcome=pass
    else
        outcome=FAIL
        failed=1
    fi
    results+=("$outcome|$(( $(date +%s) - start )) s|$what|$log")
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
