//! `[[bots]]` as loaded: each bot's own table, its agent, its directories,
//! and the rules between bots.

use std::path::Path;

use crate::config::{Backend, Config, ConfigError, Purpose, Updates};
use crate::vocab::BotId;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("bots.toml"), text, Purpose::Telegram, |_| None)
}

fn message(result: Result<Config, ConfigError>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(error) => error.to_string(),
    }
}

const TWO_BOTS: &str = r#"
[store]
data_dir = "/tmp/telegate-bots-test"

[agent]
backend = "echo"

[agents.coder]
backend = "command"
[agents.coder.command]
argv = ["cat"]

[[bots]]
name = "coder"
token = "111:AAA"
allowed_users = [7]
agent = "coder"

[[bots]]
name = "writer"
token = "222:BBB"
allow_all_users = true
mode = "webhook"
[bots.webhook]
listen = "127.0.0.1:8443"
public_url = "https://example.org"
secret_token = "s3cret"
"#;

#[test]
fn each_bot_runs_with_its_own_table_agent_and_directories() {
    let config = parse(TWO_BOTS).unwrap();
    let names: Vec<&str> = config.bots.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["coder", "writer"]);
    let coder = &config.bots[0];
    let writer = &config.bots[1];
    assert_eq!(coder.id, BotId(111));
    assert_eq!(writer.id, BotId(222));
    assert_eq!(coder.token.expose(), "111:AAA");
    let coder_config = coder.config(&config);
    let writer_config = writer.config(&config);
    assert_eq!(coder_config.agent.kind(), Backend::Command);
    assert_eq!(writer_config.agent.kind(), Backend::Echo);
    assert_eq!(coder_config.telegram.allowed_users, [7]);
    assert!(writer_config.telegram.allow_all_users);
    assert_eq!(
        coder_config.store.data_dir,
        Path::new("/tmp/telegate-bots-test/bots/111")
    );
    assert_eq!(
        writer_config.store.data_dir,
        Path::new("/tmp/telegate-bots-test/bots/222")
    );
    // The database stays where the file says: opened once for all.
    assert_eq!(config.store.data_dir, Path::new("/tmp/telegate-bots-test"));
    // A webhook without a path posts to /<name>.
    match &writer_config.telegram.updates {
        Updates::Webhook(webhook) => {
            assert_eq!(webhook.path, "/writer");
            assert_eq!(webhook.public_url.as_str(), "https://example.org/writer");
            assert_eq!(webhook.secret.expose(), "s3cret");
        }
        Updates::Polling => panic!("writer takes a webhook"),
    }
    assert!(matches!(coder_config.telegram.updates, Updates::Polling));
    assert!(config
        .summary()
        .contains("coder (bot 111, polling, agent command)"));
}

#[test]
fn a_single_telegram_table_is_one_bot_with_the_files_own_config() {
    let config = parse("[telegram]\ntoken = \"123:TEST\"\nallow_all_users = true\n").unwrap();
    assert_eq!(config.bots.len(), 1);
    assert_eq!(config.bots[0].name, "bot");
    assert_eq!(config.bots[0].id, BotId(123));
    assert!(config.bots[0].own.is_none());
    // The console needs no bot.
    let console = Config::parse(
        Path::new("bots.toml"),
        "[telegram]\nallow_all_users = true\n",
        Purpose::Console,
        |_| None,
    )
    .unwrap();
    assert!(console.bots.is_empty());
}

#[test]
fn a_single_bot_may_name_a_shared_agent() {
    let config = parse(
        "[telegram]\ntoken = \"123:TEST\"\nallow_all_users = true\nagent = \"a\"\n\
         [agents.a]\nbackend = \"command\"\n[agents.a.command]\nargv = [\"cat\"]\n",
    )
    .unwrap();
    assert_eq!(config.agent.kind(), Backend::Command);
}

#[test]
fn bots_take_their_token_from_a_file_but_never_from_telegram_bot_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "333:CCC\n").unwrap();
    let text = format!(
        "[[bots]]\nname = \"a\"\ntoken_file = {:?}\nallow_all_users = true\n\
         [[bots]]\nname = \"b\"\nallow_all_users = true\n",
        file.display().to_string()
    );
    let env = |name: &str| (name == "TELEGRAM_BOT_TOKEN").then(|| "444:DDD".to_string());
    let error = Config::parse(Path::new("bots.toml"), &text, Purpose::Telegram, env)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("[[bots]] \"b\""), "{error}");
    assert!(error.contains("token is missing"), "{error}");
    let text = text.replace("name = \"b\"\n", "name = \"b\"\ntoken = \"555:EEE\"\n");
    let config = Config::parse(Path::new("bots.toml"), &text, Purpose::Telegram, env).unwrap();
    assert_eq!(config.bots[0].token.expose(), "333:CCC");
    assert_eq!(config.bots[1].id, BotId(555));
}

#[test]
fn the_rules_between_bots_are_checked() {
    let bot = |name: &str, token: &str| {
        format!("[[bots]]\nname = \"{name}\"\ntoken = \"{token}\"\nallow_all_users = true\n")
    };
    let cases = [
        (
            bot("a", "1:A") + &bot("a", "2:B"),
            "two [[bots]] tables are named \"a\"",
        ),
        (
            bot("a", "1:A") + &bot("b", "1:A"),
            "has the token of another",
        ),
        (
            bot("a b", "1:A"),
            "bots[0].name \"a b\" must be 1 to 32 characters",
        ),
        (
            "[[bots]]\ntoken = \"1:A\"\nallow_all_users = true\n".to_string(),
            "bots[0].name is missing",
        ),
        (
            bot("a", "1:A") + "agent = \"nope\"\n",
            "agent = \"nope\" names no [agents.nope] table",
        ),
        (
            "[telegram]\ntoken = \"9:Z\"\n".to_string() + &bot("a", "1:A"),
            "with [[bots]], every bot is a [[bots]] table",
        ),
        (bot("a", "1:A") + "require_mention = 3\n", "invalid type"),
        (bot("a", "1:A") + "tokn = \"x\"\n", "unknown field `tokn`"),
    ];
    for (text, expected) in cases {
        let error = message(parse(&text));
        assert!(error.contains(expected), "{text}\n=> {error}");
    }
}

#[test]
fn webhooks_sharing_a_listener_need_their_own_paths() {
    let bot = |name: &str, token: &str, url: &str| {
        format!(
            "[[bots]]\nname = \"{name}\"\ntoken = \"{token}\"\nallow_all_users = true\n\
             mode = \"webhook\"\n[bots.webhook]\nlisten = \"127.0.0.1:8443\"\n\
             public_url = \"{url}\"\nsecret_token = \"s-{name}\"\n"
        )
    };
    let clash = bot("a", "1:A", "https://x.org/hook") + &bot("b", "2:B", "https://x.org/hook");
    assert!(message(parse(&clash)).contains("posts to /hook on 127.0.0.1:8443, like another bot"));
    let config =
        parse(&(bot("a", "1:A", "https://x.org") + &bot("b", "2:B", "https://x.org"))).unwrap();
    assert_eq!(config.bots.len(), 2);
}

#[test]
fn every_agents_key_variable_is_kept_from_children() {
    let config = parse(
        "[agents.a]\nbackend = \"openai\"\n[agents.a.openai]\nbase_url = \"http://127.0.0.1:1\"\n\
         model = \"m\"\napi_key_env = \"KEY_OF_A\"\n\
         [[bots]]\nname = \"x\"\ntoken = \"1:A\"\nallow_all_users = true\nagent = \"a\"\n\
         [[bots]]\nname = \"y\"\ntoken = \"2:B\"\nallow_all_users = true\n\
         [bots.agent]\nbackend = \"openai\"\n[bots.agent.openai]\nbase_url = \"http://127.0.0.1:1\"\n\
         model = \"m\"\napi_key_env = \"KEY_OF_Y\"\n",
    )
    .unwrap();
    let names = config.secret_env_names();
    assert!(names.iter().any(|n| n == "KEY_OF_A"), "{names:?}");
    assert!(names.iter().any(|n| n == "KEY_OF_Y"), "{names:?}");
    let y = config.bots[1].config(&config);
    assert_eq!(y.agent.kind(), Backend::Openai);
}

#[test]
fn the_readmes_several_bots_example_loads() {
    let readme = include_str!("../../../README.md");
    let section = readme
        .split("### Several bots")
        .nth(1)
        .expect("README has a Several bots section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section shows a TOML example");
    // The files it names are the operator's: their contents inline here.
    let mut tokens = 0;
    let text: String = block
        .lines()
        .map(|line| {
            if line.starts_with("token_file") {
                tokens += 1;
                format!("token = \"{tokens}00:KEY\"")
            } else if line.starts_with("secret_token_file") {
                "secret_token = \"hook-secret\"".to_string()
            } else if line.starts_with("data_dir") {
                "in_memory = true".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = parse(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
    let names: Vec<&str> = config.bots.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["coder", "helper", "notes"]);
    let helper = config.bots[1].config(&config);
    match &helper.telegram.updates {
        Updates::Webhook(webhook) => assert_eq!(webhook.path, "/helper"),
        Updates::Polling => panic!("helper takes a webhook"),
    }
    assert_eq!(
        config.bots[0].config(&config).agent.kind(),
        Backend::Command
    );
    assert_eq!(config.bots[2].config(&config).agent.kind(), Backend::Echo);
}
