#!/usr/bin/env python3
"""A minimal agent for telegate's `command` backend that sees the conversation.

telegate runs a program per message. A program without sessions of its own
can still see the chat's earlier messages:

    [agent.command]
    argv = ["python3", "examples/history-agent.py"]
    history = "stdin-json"     # or "env-file"

* history = "stdin-json": stdin is one JSON document,
  {"message": "...", "history": [{"role": "user", "content": "..."}, ...]}
* history = "env-file": the message is wherever argv puts it (here: stdin
  with `stdin = true`, or `{message}` in argv), and TELEGATE_HISTORY_FILE
  names a JSON file holding the history array.

History entries are oldest first, with "role" (user, assistant, tool) and
"content" (tool calls keep "tool_calls", "tool_call_id" and "name").
Whatever the program prints is the answer. Replace the last lines with a
call to your model of choice.
"""
import json
import os
import sys


def main() -> None:
    history_file = os.environ.get("TELEGATE_HISTORY_FILE")
    if history_file:
        with open(history_file, encoding="utf-8") as f:
            history = json.load(f)
        message = " ".join(sys.argv[1:]) or sys.stdin.read()
    else:
        document = json.load(sys.stdin)
        history, message = document["history"], document["message"]

    said_before = [m["content"] for m in history if m["role"] == "user"]
    print(f"You said {len(said_before)} thing(s) before this.")
    if said_before:
        print(f"Last time: {said_before[-1]}")
    print(f"Now: {message.strip()}")


if __name__ == "__main__":
    main()
