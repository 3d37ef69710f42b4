//! The `command` backend against real processes: streaming, substitution
//! without a shell, stdin, failures, output caps, environment scrubbing, and
//! above all that stopping a turn leaves no process of it behind.
//!
//! Scripts are run as `sh <file>` (never executed directly): a freshly
//! written executable can fail with ETXTBSY when another test thread forks
//! while the file is still open.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use telegate::agent::{Agent, AgentError, CommandAgent, CommandConfig, TurnRequest};
use telegate::vocab::{Platform, Progress, SessionId, SessionKey, SessionSource, TurnGeneration};
use tokio_util::sync::CancellationToken;

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

fn agent(config: CommandConfig) -> CommandAgent {
    config.validate().unwrap();
    CommandAgent::new(config, Vec::new())
}

fn user_message(error: AgentError) -> String {
    match error {
        AgentError::Backend { user_message, .. } => user_message,
        other => panic!("expected a backend error, got {other:?}"),
    }
}

/// Wait for a script to write `pid pid…` to `path` (it writes a temp file
/// and renames it, so a read never sees half a line).
async fn read_pids(path: &Path) -> Vec<i32> {
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(state, process group)` of a process, if it exists.
fn stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _parent = fields.next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Can `pid` still run? Zombies cannot (and PID 1 here may never reap the
/// orphaned ones).
fn running(pid: i32) -> bool {
    stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// The processes of group `pgid` that can still run.
fn running_in_group(pgid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(s, g)| g == pgid && !matches!(s, 'Z' | 'X')))
        .collect()
}

/// Assert that none of `pids` and nothing in group `pgid` survives (after
/// a short poll: SIGKILL is asynchronous).
async fn assert_all_gone(pgid: i32, pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&p| running(p))
            .chain(running_in_group(pgid))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still running: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn stdout_streams_into_progress_while_the_command_runs() {
    let (_dir, path) = script("echo first\nsleep 0.3\necho second\n");
    let agent = agent(sh(&path, &[]));
    let turn = turn("hi");
    let mut watch = turn.progress.watch();
    let mut run = agent.run(turn);
    loop {
        tokio::select! {
            result = &mut run => panic!("finished before streaming anything: {result:?}"),
            changed = watch.changed() => {
                assert!(changed);
                if watch.latest().contains("first") {
                    break;
                }
            }
        }
    }
    let reply = run.await.unwrap();
    assert_eq!(reply.text, "first\nsecond");
}

#[tokio::test]
async fn placeholders_are_substituted_without_a_shell() {
    let (dir, path) = script("printf '%s|' \"$#\" \"$@\"\n");
    let marker = dir.path().join("pwned");
    let message = format!("$(touch {}); echo hi `id` {{chat_id}}", marker.display());
    let agent = agent(sh(
        &path,
        &["--", "{message}", "id={session_id}", "{chat_id}"],
    ));
    let reply = agent.run(turn(&message)).await.unwrap();
    assert_eq!(reply.text, format!("4|--|{message}|id=s1|1|"));
    assert!(!marker.exists(), "the message was run by a shell");
}

#[tokio::test]
async fn stdin_mode_writes_the_message_and_closes_stdin() {
    let (_dir, path) = script("cat\necho \"[eof]\"\n");
    let mut config = sh(&path, &[]);
    config.stdin = true;
    let message = "line one\n'quoted' $HOME\n";
    let reply = agent(config).run(turn(message)).await.unwrap();
    assert_eq!(reply.text, format!("{message}[eof]"));
}

#[tokio::test]
async fn failures_report_the_exit_code_and_the_end_of_stderr() {
    let (_dir, path) = script(
        "echo partial\nfor i in $(seq 1 500); do echo \"noise $i\" >&2; done\n\
         echo 'boom: the model is unreachable' >&2\nexit 3\n",
    );
    let error = agent(sh(&path, &[])).run(turn("hi")).await.unwrap_err();
    let message = user_message(error);
    assert!(message.contains("exit code 3"), "{message}");
    assert!(
        message.contains("boom: the model is unreachable"),
        "{message}"
    );
    assert!(!message.contains("noise 1\n"), "{message}");
    assert!(message.chars().count() < 1000, "{message}");

    let (_dir, path) = script("kill -KILL $$\n");
    let message = user_message(agent(sh(&path, &[])).run(turn("hi")).await.unwrap_err());
    assert!(message.contains("signal 9 (SIGKILL)"), "{message}");
}

#[tokio::test]
async fn empty_output_gets_a_placeholder_reply() {
    let (_dir, path) = script("echo '   '\n");
    let reply = agent(sh(&path, &[])).run(turn("hi")).await.unwrap();
    assert_eq!(reply.text, "(the command printed nothing)");
}

#[tokio::test]
async fn huge_output_is_capped_and_drained() {
    let (_dir, path) = script("yes | head -c 5000000\n");
    let turn = turn("hi");
    let progress = turn.progress.clone();
    let reply = agent(sh(&path, &[])).run(turn).await.unwrap();
    assert!(
        reply.text.ends_with("\n\n[output truncated at 64 KiB]"),
        "{}",
        &reply.text[reply.text.len() - 60..]
    );
    assert!(reply.text.len() < 64 * 1024 + 64);
    assert_eq!(progress.snapshot().len(), 64 * 1024);
}

#[tokio::test]
async fn a_missing_program_says_what_to_fix() {
    for program in ["telegate-test-no-such-program", "/nonexistent/dir/prog"] {
        let agent = agent(CommandConfig::new(vec![program.to_string()]));
        let message = user_message(agent.run(turn("hi")).await.unwrap_err());
        assert_eq!(
            message,
            format!("Could not start `{program}`: not found. Check agent.command.argv.")
        );
    }
}

/// Starts a grandchild and a child, records `grandchild-subshell leader`.
const TREE: &str = "(sleep 300; echo x) &\n\
                    echo \"$! $$\" > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"\n\
                    sleep 300\n";

#[tokio::test]
async fn cancelling_kills_the_whole_process_group() {
    let (dir, path) = script(TREE);
    let pidfile = dir.path().join("pids");
    let mut config = sh(&path, &[pidfile.to_str().unwrap()]);
    config.kill_grace_ms = 1000;
    let agent = agent(config);
    let turn = turn("hi");
    let cancel = turn.cancel.clone();
    let run = tokio::spawn(async move { agent.run(turn).await });
    let pids = read_pids(&pidfile).await;
    assert!(pids.iter().all(|&p| running(p)));

    let started = Instant::now();
    cancel.cancel();
    let result = run.await.unwrap();
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
    // Plain `sh` and `sleep` die on SIGTERM: no need for the grace period.
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_all_gone(pids[1], &pids).await;
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let (dir, path) = script(&format!("trap '' TERM\n{TREE}"));
    let pidfile = dir.path().join("pids");
    let mut config = sh(&path, &[pidfile.to_str().unwrap()]);
    config.kill_grace_ms = 300;
    let agent = agent(config);
    let turn = turn("hi");
    let cancel = turn.cancel.clone();
    let run = tokio::spawn(async move { agent.run(turn).await });
    let pids = read_pids(&pidfile).await;

    let started = Instant::now();
    cancel.cancel();
    let result = run.await.unwrap();
    let took = started.elapsed();
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(2300), "{took:?}");
    assert_all_gone(pids[1], &pids).await;
}

#[tokio::test]
async fn dropping_the_run_mid_way_kills_the_whole_process_group() {
    let (dir, path) = script(&format!("trap '' TERM\n{TREE}"));
    let pidfile = dir.path().join("pids");
    let agent = agent(sh(&path, &[pidfile.to_str().unwrap()]));
    let mut run = agent.run(turn("hi"));
    let pids = tokio::select! {
        result = &mut run => panic!("finished early: {result:?}"),
        pids = read_pids(&pidfile) => pids,
    };
    drop(run);
    assert_all_gone(pids[1], &pids).await;
}

#[tokio::test]
async fn a_timeout_stops_the_command() {
    let (dir, path) = script(TREE);
    let pidfile = dir.path().join("pids");
    let mut config = sh(&path, &[pidfile.to_str().unwrap()]);
    config.timeout_secs = 1;
    let started = Instant::now();
    let error = agent(config).run(turn("hi")).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    let message = user_message(error);
    assert!(message.contains("did not finish within 1 s"), "{message}");
    let pids = read_pids(&pidfile).await;
    assert_all_gone(pids[1], &pids).await;
}

#[tokio::test]
async fn processes_left_behind_after_a_normal_exit_are_stopped() {
    // The background job keeps stdout open: without the cleanup the turn
    // would wait for it for five minutes.
    let (dir, path) = script(
        "(sleep 300; echo late) &\n\
         echo \"$! $$\" > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"\necho done\n",
    );
    let pidfile = dir.path().join("pids");
    let started = Instant::now();
    let reply = agent(sh(&path, &[pidfile.to_str().unwrap()]))
        .run(turn("hi"))
        .await
        .unwrap();
    assert_eq!(reply.text, "done");
    assert!(started.elapsed() < Duration::from_secs(2));
    let pids = read_pids(&pidfile).await;
    assert_all_gone(pids[1], &pids).await;
}

#[tokio::test]
async fn configuration_problems_are_reported_per_turn() {
    // Not validated first: the turn says what is wrong instead of panicking.
    let unchecked = CommandAgent::new(
        CommandConfig::new(vec!["echo".to_string(), "{model}".to_string()]),
        Vec::new(),
    );
    let message = user_message(unchecked.run(turn("hi")).await.unwrap_err());
    assert!(message.contains("unknown placeholder {model}"), "{message}");

    // A working directory that disappeared after startup.
    let dir = tempfile::tempdir().unwrap();
    let mut config = CommandConfig::new(vec!["pwd".to_string()]);
    config.workdir = Some(dir.path().join("gone"));
    let message = user_message(
        CommandAgent::new(config, Vec::new())
            .run(turn("hi"))
            .await
            .unwrap_err(),
    );
    assert!(message.contains("agent.command.workdir"), "{message}");

    // A turn cancelled before it started never spawns anything.
    let (_dir, path) = script("echo ran\n");
    let turn = turn("hi");
    turn.cancel.cancel();
    let result = agent(sh(&path, &[])).run(turn).await;
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
}

fn history_turn(text: &str) -> TurnRequest {
    use telegate::vocab::{ChatMessage, Role};
    let mut turn = turn(text);
    turn.history = vec![
        ChatMessage::new(Role::User, "my name is Ann"),
        ChatMessage::new(Role::Assistant, "Hi Ann"),
    ];
    turn
}

#[tokio::test]
async fn history_env_file_names_a_private_json_file_that_is_removed_afterwards() {
    use telegate::agent::HistoryMode;
    let (_dir, path) = script(
        "stat -c %a \"$TELEGATE_HISTORY_FILE\"\ncat \"$TELEGATE_HISTORY_FILE\"\necho\necho \"$TELEGATE_HISTORY_FILE\"\n",
    );
    let mut config = sh(&path, &["{message}"]);
    config.history = HistoryMode::EnvFile;
    let reply = agent(config).run(history_turn("who am I?")).await.unwrap();
    let lines: Vec<&str> = reply.text.lines().collect();
    assert_eq!(lines[0], "600");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[1]).unwrap(),
        serde_json::json!([
            {"role": "user", "content": "my name is Ann"},
            {"role": "assistant", "content": "Hi Ann"}
        ])
    );
    assert!(!Path::new(lines[2]).exists(), "the history file is removed");
}

#[tokio::test]
async fn history_stdin_json_sends_the_message_and_the_history() {
    use telegate::agent::HistoryMode;
    let (_dir, path) = script("cat\n");
    let mut config = sh(&path, &[]);
    config.history = HistoryMode::StdinJson;
    let reply = agent(config).run(history_turn("who am I?")).await.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&reply.text).unwrap();
    assert_eq!(doc["message"], "who am I?");
    assert_eq!(doc["history"][0]["content"], "my name is Ann");
    assert_eq!(doc["history"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn the_history_example_script_reads_both_modes() {
    use telegate::agent::HistoryMode;
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("1")
        .output()
        .is_err()
    {
        eprintln!("python3 not available; skipping the example script test");
        return;
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/history-agent.py");
    for mode in [HistoryMode::StdinJson, HistoryMode::EnvFile] {
        let mut config =
            CommandConfig::new(vec!["python3".to_string(), example.display().to_string()]);
        config.history = mode;
        config.stdin = mode == HistoryMode::EnvFile;
        let reply = agent(config).run(history_turn("who am I?")).await.unwrap();
        assert_eq!(
            reply.text,
            "You said 1 thing(s) before this.\nLast time: my name is Ann\nNow: who am I?",
            "{mode:?}"
        );
    }
}
