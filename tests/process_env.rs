//! Tests that change the process environment (`std::env::set_var`), in a
//! binary of their own: in the shared `it` binary a C library reading the
//! environment on another test's thread could race the write.
//!
//! Each checks that a child of telegate never sees a secret of its parent:
//! the command backend's argv program and the terminal tool's commands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use telegate::agent::{Agent, CommandAgent, CommandConfig, TurnRequest};
use telegate::tools::process::{ProcessOwner, ProcessRegistry, RegistryConfig, WaitOutcome};
use telegate::tools::tool_events;
use telegate::vocab::{Platform, Progress, SessionId, SessionKey, SessionSource, TurnGeneration};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(5);

fn turn(text: &str) -> TurnRequest {
    TurnRequest {
        session_key: SessionKey::from_raw("agent:main:console:dm:1"),
        session_id: SessionId::new("s1"),
        generation: TurnGeneration(1),
        source: SessionSource::dm(Platform::Console, 1),
        text: text.to_string(),
        history: Vec::new(),
        internal: false,
        cancel: CancellationToken::new(),
        progress: Progress::new(),
        model: None,
    }
}

/// A temp dir with `script.sh` holding `body`.
fn script(body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.sh");
    std::fs::write(&path, body).unwrap();
    (dir, path)
}

/// `sh <script> <args…>`.
fn sh(script: &Path, args: &[&str]) -> CommandConfig {
    let mut argv = vec!["sh".to_string(), script.display().to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    CommandConfig::new(argv)
}

fn owner(chat_id: i64) -> ProcessOwner {
    ProcessOwner {
        session_key: SessionKey::from_raw(format!("chat-{chat_id}")),
        source: SessionSource::dm(Platform::Telegram, chat_id),
        spawn_session_id: Some(SessionId::new(format!("session-{chat_id}"))),
    }
}

fn registry(config: RegistryConfig) -> (ProcessRegistry, telegate::tools::ToolEventReceiver) {
    let (events, receiver) = tool_events();
    (ProcessRegistry::new(config, events), receiver)
}

#[tokio::test]
async fn the_environment_is_scrubbed_and_extended() {
    // Names unique to this test: tests share the process environment.
    std::env::set_var("TELEGATE_TEST_STRIP_SECRET", "leak-1");
    std::env::set_var("TELEGATE_TEST_STRIP_REMOVED", "leak-2");
    std::env::set_var("TELEGATE_TEST_STRIP_KEPT", "kept");
    std::env::set_var("TELEGRAM_BOT_TOKEN", "leak-3");
    let (dir, path) = script(
        "echo \"${TELEGATE_TEST_STRIP_SECRET:-unset} ${TELEGATE_TEST_STRIP_REMOVED:-unset} \
         ${TELEGRAM_BOT_TOKEN:-unset} ${TELEGATE_TEST_STRIP_KEPT:-unset} \
         ${TELEGATE_TEST_STRIP_EXTRA:-unset} $TELEGATE_SESSION_ID $TELEGATE_CHAT_ID\"\npwd -P\n",
    );
    let mut config = sh(&path, &[]);
    config.workdir = Some(dir.path().to_path_buf());
    config.remove_env = vec!["TELEGATE_TEST_STRIP_REMOVED".to_string()];
    // Only listed names pass besides the minimal set (PATH, HOME, …).
    config.pass_env = vec![
        "TELEGATE_TEST_STRIP_KEPT".to_string(),
        "TELEGATE_TEST_STRIP_REMOVED".to_string(),
    ];
    config
        .env
        .insert("TELEGATE_TEST_STRIP_EXTRA".to_string(), "extra".to_string());
    config.validate().unwrap();
    let agent = CommandAgent::new(config, vec!["TELEGATE_TEST_STRIP_SECRET".to_string()]);
    let reply = agent.run(turn("hi")).await.unwrap();
    let workdir = dir.path().canonicalize().unwrap();
    assert_eq!(
        reply.text,
        format!("unset unset unset kept extra s1 1\n{}", workdir.display())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_in_the_workdir_without_the_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "TELEGATE_TEST_ONLY_SECRET";
    // Only this test in this binary reads this variable.
    std::env::set_var(secret, "hunter2");
    let (registry, _events) = registry(RegistryConfig {
        workdir: Some(dir.path().to_path_buf()),
        stripped_env: BTreeSet::from([secret.to_string()]),
        ..RegistryConfig::default()
    });
    let run = registry
        .spawn_foreground(
            format!("echo \"secret=[${secret}] pwd=$(pwd) chat=$TELEGATE_CHAT_ID\""),
            Some(owner(7)),
        )
        .unwrap();
    let outcome = run
        .wait(WAIT, &CancellationToken::new(), &Progress::new())
        .await;
    assert!(matches!(outcome, WaitOutcome::Exited(_)));
    let output = run.output();
    let dir: PathBuf = dir.path().canonicalize().unwrap();
    assert!(output.contains("secret=[]"), "{output}");
    assert!(
        output.contains(&format!("pwd={}", dir.display())),
        "{output}"
    );
    assert!(output.contains("chat=7"), "{output}");
}
