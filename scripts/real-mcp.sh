#!/usr/bin/env bash
# The real MCP servers and CLI clients now run in scripts/real-agents.sh,
# which prints one table for every real agent and server; this runs its
# real_clients rows only.
exec "$(dirname "$0")/real-agents.sh" real_clients:: "$@"
