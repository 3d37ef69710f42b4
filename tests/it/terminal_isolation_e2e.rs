//! `[tools.terminal] run_as`: commands run as another user (issue 10,
//! SECURITY.md), and `send_file` sends only what that user could read
//! (issue 21). Needs root (telegate switches each command's user); when
//! the tests do not run as root this says so and checks only that the
//! configuration is refused.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::json;
use support::fake_openai::{last_user_contains, messages, tool_result_after, Script};
use support::tools_bot::{ToolsBot, CHAT_A};
use telegate::config::{Config, Purpose};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_as_runs_commands_as_that_user_who_cannot_read_roots_secrets() {
    if !is_root() {
        let text = "[agent]\nbackend = \"openai\"\n[agent.openai]\nmodel = \"m\"\n\
                    [tools.terminal]\nenabled = true\nrun_as = \"nobody\"\nworkdir = \"/tmp\"\n";
        let error = Config::parse(Path::new("t.toml"), text, Purpose::Console, |_| None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs telegate to start as root"), "{error}");
        eprintln!("not root: only the refusal of run_as was checked");
        return;
    }
    let t = ToolsBot::start("approval = \"never\"\nrun_as = \"nobody\"\n").await;
    // The workdir must be usable by that user; the secret must not be.
    std::fs::set_permissions(t.workdir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("token");
    std::fs::write(&secret, "123:ROOT_ONLY_SECRET").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(secrets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let command = format!(
        "echo uid=$(id -u) home=$HOME; cat {} || echo FILE-DENIED; \
         cat /proc/{}/environ >/dev/null || echo PROC-DENIED",
        secret.display(),
        std::process::id()
    );
    t.llm.push_when(
        last_user_contains("who am i"),
        Script::tool_call("terminal", &json!({ "command": command }).to_string(), "c1"),
    );
    t.llm
        .push_when(tool_result_after("who am i"), Script::text("checked"));
    t.send(CHAT_A, "who am i");
    assert!(
        t.wait_text(CHAT_A, "checked").await,
        "{:?}",
        t.texts(CHAT_A)
    );
    let request = &t.llm.requests_matching(&tool_result_after("who am i"))[0];
    let (_, result) = messages(request).pop().unwrap();
    assert!(result.contains("uid=65534"), "{result}");
    assert!(result.contains("FILE-DENIED"), "{result}");
    assert!(result.contains("PROC-DENIED"), "{result}");
    assert!(!result.contains("ROOT_ONLY_SECRET"), "{result}");
    t.shutdown().await;
}

/// With `run_as`, `send_file` sends only what that user could read: a
/// root-only 0600 file in the workspace stays there (telegate, as root,
/// could read it; the user could not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_file_with_run_as_sends_only_what_that_user_could_read() {
    if !is_root() {
        eprintln!("not root: run_as cannot be set up");
        return;
    }
    let t = ToolsBot::start("approval = \"never\"\nrun_as = \"nobody\"\n").await;
    let ws = t.workdir.path();
    std::fs::set_permissions(ws, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(ws.join("private.txt"), "ROOT_ONLY_SECRET").unwrap();
    std::fs::set_permissions(
        ws.join("private.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(ws.join("shared.txt"), "for everyone").unwrap();
    std::fs::set_permissions(
        ws.join("shared.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    t.llm.push_when(
        last_user_contains("send both"),
        Script::tool_call("send_file", r#"{"path": "private.txt"}"#, "c1"),
    );
    t.llm.push_when(
        tool_result_after("send both"),
        Script::tool_call("send_file", r#"{"path": "shared.txt"}"#, "c2"),
    );
    t.llm
        .push_when(tool_result_after("send both"), Script::text("tried both"));
    t.send(CHAT_A, "send both");
    assert!(
        t.wait_text(CHAT_A, "tried both").await,
        "{:?}",
        t.texts(CHAT_A)
    );
    let uploads = t.fake.files().uploads();
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    assert_eq!(uploads[0].bytes, b"for everyone");
    let results: Vec<String> = t
        .llm
        .requests()
        .iter()
        .filter_map(support::fake_openai::last_tool_result)
        .collect();
    assert!(
        results
            .iter()
            .any(|r| r.contains("private.txt is not readable by the user commands run as")),
        "{results:?}"
    );
    t.shutdown().await;
}
