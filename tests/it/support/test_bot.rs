//! `TestBot`: the one way the integration tests configure and start a
//! Telegram bot against the fake Bot API.
//!
//! It owns the test configuration's base: the `[telegram]` token and
//! `api_url` of the [`FakeBotApi`] the bot talks to, so no test writes that
//! table by hand again. Everything a test sets on top is a TOML fragment,
//! deep-merged into the base as tables (a fragment's `[delivery]` extends
//! or overrides the `[delivery]` already there instead of making a second
//! one, which TOML would refuse). [`FAST_DELIVERY`] and [`FAST_GROUPS`]
//! are the pacing most tests share, added where a test asks for them: a
//! test without them keeps telegate's defaults. The merged text is parsed
//! with [`Config::parse`] as `telegate run` parses a file;
//! [`TestBot::start`] is the only place tests call `TelegramBot::start`
//! (`tidy_tests_start_bots_through_test_bot` keeps it so), and a test that
//! runs the binary writes [`TestBot::text`] to its config file.
//!
//! A `TestBot` is a description, not a running bot: `start` can be called
//! again for a restart on the same settings, and a clone can change them.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use telegate::agent::Agent;
use telegate::config::{Config, Purpose};
use telegate::engine::AgentSetup;
use telegate::transport::telegram::{StartError, TelegramBot};
use telegate::wiring::fleet::Fleet;

use super::fake_bot::FakeBotApi;

/// `[delivery]` paced for tests: no waits between messages, edits and
/// typing notices close together, no global cap worth the name.
pub const FAST_DELIVERY: &str = "[delivery]\nper_chat_interval_ms = 1\nedit_interval_ms = 50\n\
                                 typing_interval_ms = 100\nglobal_messages_per_second = 100000\n";

/// `[delivery] group_messages_per_minute` out of the way, for tests in groups.
pub const FAST_GROUPS: &str = "[delivery]\ngroup_messages_per_minute = 100000\n";

/// A change to the parsed configuration that TOML cannot express (a
/// test clock, a `Limits` value built in code).
type Adjust = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// The settings of a bot under test and how it starts; see the module docs.
#[derive(Clone)]
pub struct TestBot {
    base: toml::Table,
    fragments: Vec<String>,
    agent: Option<Arc<dyn Agent>>,
    adjust: Vec<Adjust>,
}

impl TestBot {
    /// A bot talking to `fake`: `[telegram] token` and `api_url` are its.
    pub fn new(fake: &FakeBotApi) -> TestBot {
        let mut telegram = toml::Table::new();
        telegram.insert("token".into(), fake.token().into());
        telegram.insert("api_url".into(), fake.url().to_string().into());
        let mut base = toml::Table::new();
        base.insert("telegram".into(), telegram.into());
        TestBot {
            base,
            fragments: Vec::new(),
            agent: None,
            adjust: Vec::new(),
        }
    }

    /// Several bots in one process, one per fake: `[[bots]]` tables named
    /// `b0`, `b1`, … with each fake's token and `api_url` (the base has no
    /// `[telegram]`; [`TestBot::users`] and [`TestBot::approvers`] set
    /// every bot's). Started with [`TestBot::start_fleet`].
    pub fn bots(fakes: &[&FakeBotApi]) -> TestBot {
        let bots: toml::value::Array = fakes
            .iter()
            .enumerate()
            .map(|(index, fake)| {
                let mut bot = toml::Table::new();
                bot.insert("name".into(), format!("b{index}").into());
                bot.insert("token".into(), fake.token().into());
                bot.insert("api_url".into(), fake.url().to_string().into());
                bot.into()
            })
            .collect();
        let mut base = toml::Table::new();
        base.insert("bots".into(), bots.into());
        TestBot {
            base,
            fragments: Vec::new(),
            agent: None,
            adjust: Vec::new(),
        }
    }

    /// More settings for the `index`th of [`TestBot::bots`]: a TOML
    /// fragment deep-merged into its `[[bots]]` table.
    pub fn bot_toml(mut self, index: usize, fragment: impl fmt::Display) -> TestBot {
        let fragment = fragment.to_string();
        let table = toml::from_str::<toml::Table>(&fragment)
            .unwrap_or_else(|error| panic!("test TOML fragment {fragment:?}: {error}"));
        let bot = self.base["bots"]
            .as_array_mut()
            .and_then(|bots| bots.get_mut(index))
            .and_then(toml::Value::as_table_mut)
            .expect("TestBot::bot_toml needs TestBot::bots");
        merge(bot, table);
        self
    }

    /// `[telegram] allowed_users`.
    pub fn users(self, ids: &[i64]) -> TestBot {
        self.telegram_ids("allowed_users", ids)
    }

    /// `[telegram] approvers`.
    pub fn approvers(self, ids: &[i64]) -> TestBot {
        self.telegram_ids("approvers", ids)
    }

    fn telegram_ids(mut self, key: &str, ids: &[i64]) -> TestBot {
        let ids: toml::value::Array = ids.iter().map(|&id| id.into()).collect();
        let tables: Vec<&mut toml::Table> = match self.base.get_mut("telegram") {
            Some(telegram) => telegram.as_table_mut().into_iter().collect(),
            None => self.base["bots"]
                .as_array_mut()
                .expect("the base has [telegram] or [[bots]]")
                .iter_mut()
                .filter_map(toml::Value::as_table_mut)
                .collect(),
        };
        for table in tables {
            table.insert(key.into(), ids.clone().into());
        }
        self
    }

    /// More settings: a TOML fragment deep-merged over what is there
    /// (tables merge, any other value replaces the one before).
    pub fn toml(mut self, fragment: impl fmt::Display) -> TestBot {
        self.fragments.push(fragment.to_string());
        self
    }

    /// Start with this agent instead of the configured `[agent]` backend.
    pub fn agent(mut self, agent: Arc<dyn Agent>) -> TestBot {
        self.agent = Some(agent);
        self
    }

    /// Change the parsed configuration before the bot starts (for what
    /// is not a TOML value, such as a test clock).
    pub fn adjust(mut self, change: impl Fn(&mut Config) + Send + Sync + 'static) -> TestBot {
        self.adjust.push(Arc::new(change));
        self
    }

    /// The merged configuration text.
    pub fn text(&self) -> String {
        let mut merged = self.base.clone();
        for fragment in &self.fragments {
            let table = toml::from_str::<toml::Table>(fragment)
                .unwrap_or_else(|error| panic!("test TOML fragment {fragment:?}: {error}"));
            merge(&mut merged, table);
        }
        toml::to_string(&merged).expect("a TOML table serializes")
    }

    /// The parsed configuration the bot starts with.
    pub fn config(&self) -> Config {
        let text = self.text();
        let mut config =
            Config::parse(Path::new("test_bot.toml"), &text, Purpose::Telegram, |_| {
                None
            })
            .unwrap_or_else(|error| panic!("test config is valid: {error}\n{text}"));
        for change in &self.adjust {
            change(&mut config);
        }
        config
    }

    /// Start the bot against the fake.
    pub async fn start(&self) -> Result<TelegramBot, StartError> {
        let config = self.config();
        let setup = self.agent.clone().map(AgentSetup::without_tools);
        TelegramBot::start(&config, setup).await
    }
}

impl TestBot {
    /// Start every bot of the configuration as `telegate run` does (one
    /// alone, several sharing the store and listeners), each with the
    /// test's agent when it gives one.
    pub async fn start_fleet(&self) -> Result<Fleet, StartError> {
        let config = self.config();
        let agent = self.agent.clone();
        Fleet::start(&config, |_| agent.clone().map(AgentSetup::without_tools)).await
    }
}

/// `from` merged into `into`: a table into a table key by key, any other
/// value replacing what was there.
fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new)) => merge(old, new),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[test]
fn fragments_merge_into_the_base_tables() {
    let merged = |fragments: &[&str]| {
        let mut into = toml::Table::new();
        for fragment in fragments {
            merge(&mut into, toml::from_str(fragment).unwrap());
        }
        into
    };
    let table = merged(&[
        "[delivery]\na = 1\nb = 2\n[delivery.inner]\nx = [1]\n",
        "[delivery]\nb = 3\n[delivery.inner]\ny = 4\n[store]\nin_memory = true\n",
        "[delivery.inner]\nx = [5]\n",
    ]);
    let expected: toml::Table = toml::from_str(
        "[delivery]\na = 1\nb = 3\n[delivery.inner]\nx = [5]\ny = 4\n[store]\nin_memory = true\n",
    )
    .unwrap();
    assert_eq!(table, expected);
}
