//! `[tools.terminal] run_as`: commands run as another user (issue 10,
//! SECURITY.md). Needs root (telegate switches each command's user); when
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
                    [tools.terminal]\nenabled = true\nrun_as = \"nobody\"\n";
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
