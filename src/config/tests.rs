use super::*;
use crate::adapter::BusyMode;

fn parse(text: &str, purpose: Purpose) -> Result<Config, ConfigError> {
    Config::parse(Path::new("bot.toml"), text, purpose, |_| None)
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../config.example.toml");
    let config = Config::parse(
        Path::new("config.example.toml"),
        text,
        Purpose::Telegram,
        |_| Some("123:abc".to_string()),
    )
    .unwrap();
    assert_eq!(config.sessions.busy_mode, BusyMode::Interrupt);
    // Its placeholders are comments: a bot started from the example lets
    // nobody in by a made-up id, so its owner pairs with the printed code.
    assert!(config.telegram.allowed_users.is_empty());
    assert!(config.telegram.approvers.is_empty());
    assert!(config.telegram.allowed_chats.is_empty());
}

#[test]
fn answer_parts_and_files_per_answer_are_bounded() {
    let config = parse("[agent]\nbackend = \"echo\"\n", Purpose::Console).unwrap();
    assert_eq!(config.delivery.max_answer_parts, 10);
    assert_eq!(config.delivery_config().max_answer_parts, 10);
    assert_eq!(config.media.max_files_per_answer, 20);
    let config = parse(
        "[delivery]\nmax_answer_parts = 3\n[media]\nmax_files_per_answer = 5\n",
        Purpose::Console,
    )
    .unwrap();
    assert_eq!(config.delivery_config().max_answer_parts, 3);
    assert_eq!(config.media.max_files_per_answer, 5);
    for (text, key) in [
        (
            "[delivery]\nmax_answer_parts = 0\n",
            "delivery.max_answer_parts",
        ),
        (
            "[delivery]\nmax_answer_parts = 101\n",
            "delivery.max_answer_parts",
        ),
        (
            "[media]\nmax_files_per_answer = 0\n",
            "media.max_files_per_answer",
        ),
        (
            "[media]\nmax_files_per_answer = 201\n",
            "media.max_files_per_answer",
        ),
    ] {
        let error = parse(text, Purpose::Console).unwrap_err().to_string();
        assert!(error.contains(key), "{text}: {error}");
    }
}

#[test]
fn the_terminal_tool_is_off_by_default_and_needs_the_openai_backend() {
    let config = parse("[agent]\nbackend = \"echo\"\n", Purpose::Console).unwrap();
    assert!(!config.tools.terminal.enabled);
    let error = parse("[tools.terminal]\nenabled = true\n", Purpose::Console).unwrap_err();
    assert!(error.to_string().contains("agent.backend"), "{error}");
    let openai = "[agent]\nbackend = \"openai\"\n[agent.openai]\nmodel = \"m\"\n";
    let config = parse(
        &format!("{openai}[tools.terminal]\nenabled = true\napproval = \"always\"\n"),
        Purpose::Console,
    )
    .unwrap();
    assert!(config.tools.terminal.enabled);
    assert!(config.summary().contains("terminal on"));
    let error = parse(
        &format!("{openai}[tools.terminal]\nenabled = true\ntimeout_secs = 0\n"),
        Purpose::Console,
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("tools.terminal.timeout_secs"),
        "{error}"
    );
    let error = parse("[tools.terminal]\nenable = true\n", Purpose::Console).unwrap_err();
    assert!(
        matches!(error, ConfigError::Parse { line: 2, .. }),
        "{error}"
    );
}

#[test]
fn secrets_never_show_in_debug() {
    let config = parse(
        "[telegram]\ntoken = \"123:SECRET\"\nallow_all_users = true\n",
        Purpose::Telegram,
    )
    .unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("SECRET"), "{debug}");
    assert!(!config.summary().contains("SECRET"));
}

#[test]
fn token_comes_from_the_environment_when_the_file_has_none() {
    let config = Config::parse(
        Path::new("bot.toml"),
        "[telegram]\nallowed_users = [1]\n",
        Purpose::Telegram,
        |name| (name == TOKEN_ENV).then(|| "1:ENV".to_string()),
    )
    .unwrap();
    assert_eq!(config.telegram.token.unwrap().expose(), "1:ENV");
}

#[test]
fn the_listeners_limits_have_defaults_and_bounds() {
    let webhook = |extra: &str| {
        format!(
            "[telegram]\ntoken = \"1:a\"\nallow_all_users = true\nmode = \"webhook\"\n\
             [telegram.webhook]\nlisten = \"127.0.0.1:8443\"\n\
             public_url = \"https://bot.example.com/t\"\nsecret_token = \"s\"\n{extra}"
        )
    };
    let config = parse(&webhook(""), Purpose::Telegram).unwrap();
    let limits = config.telegram.webhook.as_ref().unwrap().limits();
    assert_eq!(limits.max_connections, 256);
    assert_eq!(limits.header_timeout, std::time::Duration::from_secs(10));
    assert_eq!(limits.body_timeout, std::time::Duration::from_secs(10));
    assert_eq!(config.metrics.limits().max_connections, 64);

    for (extra, named) in [
        (
            "connection_limit = 0\n",
            "telegram.webhook.connection_limit 0",
        ),
        (
            "header_timeout_secs = 0\n",
            "telegram.webhook.header_timeout_secs",
        ),
        (
            "body_timeout_secs = 601\n",
            "telegram.webhook.body_timeout_secs",
        ),
        (
            "max_connections = 50\nconnection_limit = 40\n",
            "below max_connections 50",
        ),
    ] {
        let error = parse(&webhook(extra), Purpose::Telegram).unwrap_err();
        assert!(error.to_string().contains(named), "{extra}: {error}");
    }
    let error = parse("[metrics]\nconnection_limit = 0\n", Purpose::Console).unwrap_err();
    assert!(
        error.to_string().contains("metrics.connection_limit"),
        "{error}"
    );
    // `metrics.listen` is parsed once, at load, and refused where it is.
    let error = parse("[metrics]\nlisten = \"localhost\"\n", Purpose::Console)
        .unwrap_err()
        .to_string();
    assert!(error.contains("bot.toml:2:"), "{error}");
    assert!(error.contains("metrics.listen"), "{error}");
    let config = parse("[metrics]\nlisten = \"127.0.0.1:9464\"\n", Purpose::Console).unwrap();
    assert_eq!(
        config.metrics.listen,
        Some("127.0.0.1:9464".parse().unwrap())
    );
}

#[test]
fn what_can_open_files_follows_the_backend_and_the_terminal_user() {
    use crate::media::FileAccess;
    let parse = |text: &str| {
        Config::parse(
            std::path::Path::new("t.toml"),
            text,
            Purpose::Console,
            |_| None,
        )
        .unwrap()
    };
    let openai = "[agent]\nbackend = \"openai\"\n[agent.openai]\nmodel = \"m\"\n";
    assert_eq!(parse(openai).file_access(), FileAccess::Names);
    let terminal = format!("{openai}[tools.terminal]\nenabled = true\napproval = \"always\"\n");
    let mut config = parse(&terminal);
    assert_eq!(config.file_access(), FileAccess::Paths { workdir: None });
    // Commands running as another user cannot read telegate's files.
    config.tools.terminal.run_as = Some("nobody".into());
    assert_eq!(config.file_access(), FileAccess::Names);
    let command = parse("[agent]\nbackend = \"command\"\n[agent.command]\nargv = [\"cat\"]\n");
    assert_eq!(command.file_access(), FileAccess::Paths { workdir: None });
    let echo = parse("[agent]\nbackend = \"echo\"\n");
    assert_eq!(echo.file_access(), FileAccess::Names);
}
