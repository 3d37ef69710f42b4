//! The built binary: `check-config` on good and bad files, and `console`
//! driven from a pipe.

use std::io::Write;
use std::process::{Command, Stdio};

fn telegate() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_telegate"));
    cmd.env_remove("TELEGRAM_BOT_TOKEN").env_remove("RUST_LOG");
    cmd
}

fn write_config(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Run `check-config` on `text`; returns (success, stdout, stderr).
fn check(text: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(&dir, "bot.toml", text);
    let out = telegate()
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(stderr: &str, needles: &[&str]) {
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{needle:?} not in {stderr:?}");
    }
}

#[test]
fn a_valid_config_passes_with_a_summary_and_no_secret() {
    let (ok, stdout, _) = check(
        "[telegram]\ntoken = \"123:VERYSECRET\"\nallowed_users = [42]\n\n[sessions]\nbusy_mode = \"queue\"\n",
    );
    assert!(ok);
    assert!(stdout.contains("OK"));
    assert!(stdout.contains("busy_mode Queue"));
    assert!(!stdout.contains("VERYSECRET"));
}

#[test]
fn an_unknown_key_names_the_key_and_its_line_and_column() {
    let (ok, _, stderr) = check(
        "[telegram]\ntoken = \"1:a\"\nallowed_users = [1]\n\n[sessions]\nbusy_mod = \"queue\"\n",
    );
    assert!(!ok);
    assert_one_line_error(&stderr, &["bot.toml:6:1", "unknown field `busy_mod`"]);
}

#[test]
fn a_wrong_type_is_reported_with_its_position() {
    let (ok, _, stderr) = check("[telegram]\ntoken = \"1:a\"\nallowed_users = \"me\"\n");
    assert!(!ok);
    assert_one_line_error(&stderr, &["bot.toml:3:17", "invalid type"]);
}

#[test]
fn a_bad_enum_value_lists_the_choices() {
    let (ok, _, stderr) = check("[sessions]\nbusy_mode = \"panic\"\n");
    assert!(!ok);
    assert_one_line_error(
        &stderr,
        &[
            "bot.toml:2",
            "unknown variant `panic`",
            "interrupt",
            "queue",
        ],
    );
}

#[test]
fn a_missing_token_says_where_to_put_it() {
    let (ok, _, stderr) = check("[telegram]\nallowed_users = [1]\n");
    assert!(!ok);
    assert_one_line_error(
        &stderr,
        &["telegram.token is missing", "TELEGRAM_BOT_TOKEN"],
    );
}

#[test]
fn an_empty_allowlist_is_accepted_and_said_to_pair_at_start() {
    // Nobody in the config: the start shows a pairing code (see
    // tests/it/teams_pairing.rs), so the file is valid.
    let (ok, stdout, stderr) = check("[telegram]\ntoken = \"1:a\"\n");
    assert!(ok, "{stderr}");
    assert!(stdout.contains("pairing code"), "{stdout}");
    let (ok, _, _) = check("[telegram]\ntoken = \"1:a\"\nallow_all_users = true\n");
    assert!(ok);
}

#[test]
fn an_empty_file_is_an_error() {
    let (ok, _, stderr) = check("   \n\n");
    assert!(!ok);
    assert_one_line_error(&stderr, &["bot.toml", "is empty"]);
}

#[test]
fn a_missing_file_is_an_error() {
    let out = telegate()
        .args(["check-config", "--config", "/nonexistent/telegate.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_one_line_error(
        &String::from_utf8_lossy(&out.stderr),
        &["/nonexistent/telegate.toml", "cannot read"],
    );
}

#[test]
fn console_from_a_pipe_stops_a_slow_turn_and_answers_the_follow_up() {
    let dir = tempfile::tempdir().unwrap();
    // A slow echo (2 s, streamed word by word) makes /stop land mid-turn.
    let path = write_config(
        &dir,
        "console.toml",
        "[agent]\nbackend = \"echo\"\n\n[agent.echo]\ndelay_ms = 2000\n\n[log]\nlevel = \"warn\"\n\n[store]\nin_memory = true\n",
    );
    let mut child = telegate()
        .args(["console", "--config"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"please take your time\n/stop\nfollow up\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<_> = stdout.lines().collect();
    // The turn may be caught while still starting or already running.
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("⏹ Stopped"), "{stdout}");
    assert_eq!(lines[1], "echo: follow up", "{stdout}");
    assert!(!stdout.contains("echo: please"), "{stdout}");
}

#[test]
fn console_queues_in_queue_mode_and_runs_commands() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        "console.toml",
        "[sessions]\nbusy_mode = \"queue\"\n\n[agent.echo]\ndelay_ms = 300\n\n[store]\nin_memory = true\n",
    );
    let mut child = telegate()
        .args(["console", "--config"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"one\ntwo\nthree\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<_> = stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            "[⏳ Queued (position 1)…]",
            "echo: one",
            "echo: two",
            "echo: three"
        ],
        "{stdout}"
    );
}
