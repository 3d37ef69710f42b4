//! The built binary refuses unsafe or broken settings (issue 10):
//! `check-config` and `run` alike, each with one line naming the key.

use std::process::Command;

fn telegate() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_telegate"));
    for var in [
        "TELEGRAM_BOT_TOKEN",
        "TELEGRAM_WEBHOOK_SECRET",
        "OPENAI_API_KEY",
        "CREDENTIALS_DIRECTORY",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_COLOR", "1");
    cmd
}

/// Run `subcommand` on `text`; returns (success, stderr).
fn run_on(subcommand: &str, text: &str, env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bot.toml");
    std::fs::write(&path, text).unwrap();
    let out = telegate()
        .arg(subcommand)
        .arg("--config")
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `check-config` and `run` both refuse `text` with one line containing
/// every needle (and never `hidden`).
fn refused(text: &str, needles: &[&str], hidden: &str) {
    for subcommand in ["check-config", "run"] {
        let (ok, stderr) = run_on(subcommand, text, &[]);
        assert!(!ok, "{subcommand} accepted:\n{text}");
        let lines: Vec<_> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{subcommand}: {stderr}");
        for needle in needles {
            assert!(
                lines[0].contains(needle),
                "{subcommand}: {needle:?} not in {stderr}"
            );
        }
        if !hidden.is_empty() {
            assert!(
                !stderr.contains(hidden),
                "{subcommand} showed the secret: {stderr}"
            );
        }
    }
}

const ACCESS: &str = "allowed_users = [1]\n";

fn webhook(secret_line: &str) -> String {
    format!(
        "[telegram]\ntoken = \"1:abc\"\n{ACCESS}mode = \"webhook\"\n\n[telegram.webhook]\n\
         listen = \"127.0.0.1:0\"\npublic_url = \"https://example.com/hook\"\n{secret_line}"
    )
}

#[test]
fn empty_blank_and_malformed_webhook_secrets_are_refused() {
    refused(
        &webhook("secret_token = \"\"\n"),
        &["telegram.webhook.secret_token", "1 to 256 characters"],
        "",
    );
    refused(
        &webhook("secret_token = \"   \"\n"),
        &["telegram.webhook.secret_token"],
        "",
    );
    refused(
        &webhook("secret_token = \"no spaces! allowed\"\n"),
        &["telegram.webhook.secret_token"],
        "no spaces! allowed",
    );
    refused(
        &webhook(&format!("secret_token = \"{}\"\n", "a".repeat(257))),
        &["telegram.webhook.secret_token"],
        "",
    );
    let (ok, stderr) = run_on(
        "check-config",
        &webhook(""),
        &[("TELEGRAM_WEBHOOK_SECRET", "bad secret")],
    );
    assert!(!ok && stderr.contains("secret_token"), "{stderr}");
    let (ok, stderr) = run_on(
        "check-config",
        &webhook("secret_token = \"Good_secret-1\"\n"),
        &[],
    );
    assert!(ok, "{stderr}");
}

#[test]
fn empty_and_malformed_tokens_and_non_http_api_urls_are_refused() {
    refused(
        &format!("[telegram]\ntoken = \"\"\n{ACCESS}"),
        &["telegram.token is empty"],
        "",
    );
    refused(
        &format!("[telegram]\ntoken = \"nocolonhere\"\n{ACCESS}"),
        &["telegram.token is not a bot token"],
        "nocolonhere",
    );
    refused(
        &format!("[telegram]\ntoken = \"1:abc\"\napi_url = \"ftp://example.com\"\n{ACCESS}"),
        &["telegram.api_url", "http:// or https://"],
        "",
    );
}

#[test]
fn huge_durations_are_refused_not_a_panic_or_a_hang() {
    let max = u64::MAX;
    for (table, key) in [
        ("sessions", "shutdown_grace_secs"),
        ("sessions", "ack_interval_secs"),
        ("sessions", "stall_timeout_secs"),
        ("sessions", "cancel_wait_ms"),
        ("delivery", "per_chat_interval_ms"),
        ("delivery", "edit_interval_ms"),
        ("delivery", "typing_interval_ms"),
        ("delivery", "max_retry_wait_secs"),
        ("agent.echo", "delay_ms"),
        ("tools.terminal", "timeout_secs"),
        ("tools.terminal", "approval_timeout_secs"),
    ] {
        refused(
            &format!("[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[{table}]\n{key} = {max}\n"),
            &[&format!("{table}.{key} = {max} is too large")],
            "",
        );
    }
    for (table, extra, key) in [
        ("agent.openai", "model = \"m\"\n", "request_timeout_secs"),
        ("agent.command", "argv = [\"true\"]\n", "timeout_secs"),
        ("agent.command", "argv = [\"true\"]\n", "kill_grace_ms"),
        ("agent.acp", "program = \"x\"\n", "idle_secs"),
        ("agent.acp", "program = \"x\"\n", "start_timeout_secs"),
        ("agent.acp", "program = \"x\"\n", "permission_timeout_secs"),
        ("agent.acp", "program = \"x\"\n", "cancel_grace_ms"),
        ("agent.acp", "program = \"x\"\n", "kill_grace_ms"),
    ] {
        refused(
            &format!("[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[{table}]\n{extra}{key} = {max}\n"),
            &[&format!("{table}.{key} = {max} is too large")],
            "",
        );
    }
}

#[test]
fn secret_files_are_read_and_their_problems_named() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "1:FROMFILE\n").unwrap();
    let text = format!(
        "[telegram]\ntoken_file = {}\n{ACCESS}",
        toml::Value::String(token.display().to_string())
    );
    let (ok, stderr) = run_on("check-config", &text, &[]);
    assert!(ok, "{stderr}");
    refused(
        "[telegram]\ntoken_file = \"/nonexistent/token\"\nallowed_users = [1]\n",
        &["telegram.token_file: cannot read /nonexistent/token"],
        "",
    );
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\ntoken_file = {}\n{ACCESS}",
            toml::Value::String(token.display().to_string())
        ),
        &["both set"],
        "FROMFILE",
    );
    // A credential with a malformed token is named as such.
    let credentials = tempfile::tempdir().unwrap();
    std::fs::write(credentials.path().join("telegram_bot_token"), "garbage").unwrap();
    let (ok, stderr) = run_on(
        "check-config",
        &format!("[telegram]\n{ACCESS}"),
        &[(
            "CREDENTIALS_DIRECTORY",
            &credentials.path().display().to_string(),
        )],
    );
    assert!(!ok && stderr.contains("not a bot token"), "{stderr}");
    assert!(!stderr.contains("garbage"), "{stderr}");
}

#[test]
fn secrets_cannot_be_passed_to_children() {
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[agent]\nbackend = \"command\"\n\
             [agent.command]\nargv = [\"true\"]\npass_env = [\"TELEGRAM_BOT_TOKEN\"]\n"
        ),
        &["agent.command.pass_env", "TELEGRAM_BOT_TOKEN"],
        "",
    );
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[agent]\nbackend = \"openai\"\n\
             [agent.openai]\nmodel = \"m\"\napi_key_env = \"MY_KEY\"\n\
             [tools.terminal]\npass_env = [\"MY_KEY\"]\n"
        ),
        &["tools.terminal.pass_env", "MY_KEY"],
        "",
    );
}

#[test]
fn a_startup_error_names_each_cause_once() {
    // Nothing listens on this port: the start fails with a network error
    // whose causes repeat each other's text.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let text = format!(
        "[telegram]\ntoken = \"1:abc\"\napi_url = \"http://127.0.0.1:{port}\"\n{ACCESS}\n\
         [store]\nin_memory = true\n[log]\nlevel = \"off\"\n"
    );
    let (ok, stderr) = run_on("run", &text, &[]);
    assert!(!ok);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("the bot could not start"), "{line}");
    let parts: Vec<&str> = line.split(": ").collect();
    for (i, part) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(part),
            "{part:?} is printed more than once: {line}"
        );
    }
    assert_eq!(line.matches("error sending request").count(), 1, "{line}");
}

/// A realistic token (BotFather's shape), never to be printed.
const PASTED_TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";

#[test]
fn a_token_pasted_into_another_key_is_never_printed() {
    refused(
        &format!("[telegram]\ntoken = \"1:abc\"\nallowed_users = [\"{PASTED_TOKEN}\"]\n"),
        &["bot.toml:3:", "expected u64"],
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    );
    refused(
        &format!("[telegram]\ntoken = \"1:abc\"\nallowed_users = \"{PASTED_TOKEN}\"\n"),
        &["bot.toml:3:"],
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    );
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[sessions]\nbusy_mode = \"{PASTED_TOKEN}\"\n"
        ),
        &["bot.toml:6:", "unknown variant", "interrupt"],
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    );
    // Also where a value is echoed after validation.
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}mode = \"webhook\"\n\n[telegram.webhook]\n\
             listen = \"{PASTED_TOKEN}\"\npublic_url = \"https://example.com/hook\"\n\
             secret_token = \"Good_secret-1\"\n"
        ),
        &["telegram.webhook.listen"],
        "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
    );
    // In the environment's user list too.
    let out = telegate()
        .arg("check-config")
        .current_dir(tempfile::tempdir().unwrap().path())
        .env("TELEGRAM_BOT_TOKEN", "1:abc")
        .env("TELEGATE_ALLOWED_USERS", format!("42,{PASTED_TOKEN}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("TELEGATE_ALLOWED_USERS"), "{stderr}");
    assert!(!stderr.contains("AAHdqTcv"), "{stderr}");
}

#[test]
fn a_secret_file_that_never_ends_is_refused_as_too_large() {
    refused(
        &format!("[telegram]\ntoken_file = \"/dev/zero\"\n{ACCESS}"),
        &["bot.toml:2:", "telegram.token_file", "too large"],
        "",
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.key");
    std::fs::write(&big, "x".repeat(64 * 1024)).unwrap();
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[agent]\nbackend = \"openai\"\n\
             [agent.openai]\nmodel = \"m\"\napi_key_file = {}\n",
            toml::Value::String(big.display().to_string())
        ),
        &["agent.openai.api_key_file", "too large"],
        "xxxxxxxx",
    );
}

fn command_argv(argv: &str) -> String {
    format!(
        "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[agent]\nbackend = \"command\"\n\
         [agent.command]\nargv = {argv}\n"
    )
}

#[test]
fn a_message_inside_a_shell_script_is_refused_as_an_argument_it_is_not() {
    for argv in [
        r#"["sh", "-c", "llm {message}"]"#,
        r#"["/bin/bash", "-lc", "echo '{message}' | llm"]"#,
        r#"["zsh", "-c", "llm \"{message}\""]"#,
        r#"["dash", "-c", "{message}"]"#,
        r#"["env", "-i", "sh", "-c", "llm {message}"]"#,
        r#"["/usr/bin/env", "bash", "-c", "llm {message}"]"#,
    ] {
        refused(
            &command_argv(argv),
            &["bot.toml:8:", "inject shell syntax", "\"$1\""],
            "",
        );
    }
    let (ok, stderr) = run_on(
        "check-config",
        &command_argv(r#"["sh", "-c", "llm -- \"$1\"", "sh", "{message}"]"#),
        &[],
    );
    assert!(ok, "the safe form was refused: {stderr}");
}

#[test]
fn a_data_dir_that_cannot_be_a_directory_is_refused() {
    refused(
        &format!("[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[store]\ndata_dir = \"/dev/null\"\n"),
        &["bot.toml:6:12:", "store.data_dir", "not a directory"],
        "",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    refused(
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[store]\ndata_dir = {}\n",
            toml::Value::String(file.join("data").display().to_string())
        ),
        &["bot.toml:6:12:", "store.data_dir", "cannot be created"],
        "",
    );
    let (ok, stderr) = run_on(
        "check-config",
        &format!(
            "[telegram]\ntoken = \"1:abc\"\n{ACCESS}\n[store]\ndata_dir = {}\n",
            toml::Value::String(dir.path().join("new/data").display().to_string())
        ),
        &[],
    );
    assert!(ok, "a directory that can be created was refused: {stderr}");
}

#[test]
fn a_per_chat_workdir_pattern_may_not_climb_out() {
    for workdir in ["/srv/work/{chat_id}/../shared", "/srv/../{chat_id}"] {
        refused(
            &format!(
                "{}workdir = \"{workdir}\"\n",
                command_argv(r#"["llm", "--", "{message}"]"#)
            ),
            &["bot.toml:9:11:", "agent.command.workdir", "'..'"],
            "",
        );
    }
}
