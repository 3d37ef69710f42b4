//! Per-user budgets (`[limits]`) and usage.
//!
//! A budget is up to three limits per user: tokens per day, cost per day
//! (US dollars, as the backend reports it) and turns per hour; any may be
//! unset. A role may have its own table (`[limits.owner]`, `[limits.admin]`,
//! `[limits.user]`), which then replaces the base limits for that role
//! entirely (an empty table: no limits).
//!
//! * **Before a turn** ([`Limits::check`]) the user's usage is read from
//!   the store: a turn over a limit is refused with which limit and when it
//!   resets, and nothing of it is charged (no usage row, no transcript).
//! * **During a turn** the backends report usage into the turn's
//!   [`meter`] (a task-local the runner binds), and the openai tool loop
//!   asks it between rounds: at the limit, the loop ends with a short note.
//! * **After a turn** the runner records what the meter saw, one row per
//!   turn ([`crate::store::usage`]), also for a turn that was stopped.
//!
//! "Today" is the day in the chat's time zone ([`zone::chat_time_zone`]):
//! daily limits reset at local midnight. The clock is injectable
//! ([`crate::clock::Clock`]).
//!
//! This module owns the limits and their wording. It must never refuse a
//! command (only turns) and never charge a refused turn.

pub mod meter;
pub mod zone;

use serde::Deserialize;

use crate::access::Role;
use crate::clock::Clock;
use crate::store::{AgentUsage, Jobs, StoreError, Usage};

pub use meter::TurnMeter;

/// One set of limits; `None` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Tokens (input, cached input and output) per day.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Cost in US dollars per day, as the backend reports it.
    #[serde(default)]
    pub daily_cost_usd: Option<f64>,
    /// Turns per hour (any 60 minutes).
    #[serde(default)]
    pub turns_per_hour: Option<u32>,
}

impl Budget {
    fn is_unlimited(&self) -> bool {
        self.daily_tokens.is_none()
            && self.daily_cost_usd.is_none()
            && self.turns_per_hour.is_none()
    }

    fn validate(&self, table: &str) -> Result<(), String> {
        if let Some(cost) = self.daily_cost_usd {
            if !cost.is_finite() || cost < 0.0 {
                return Err(format!(
                    "{table}.daily_cost_usd must be a number of dollars, 0 or more (it is {cost})"
                ));
            }
        }
        Ok(())
    }
}

/// `[limits]`: the base budget, and per-role tables replacing it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Tokens per day (base).
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Dollars per day (base).
    #[serde(default)]
    pub daily_cost_usd: Option<f64>,
    /// Turns per hour (base).
    #[serde(default)]
    pub turns_per_hour: Option<u32>,
    /// `[limits.owner]`: replaces the base for the owner.
    #[serde(default)]
    pub owner: Option<Budget>,
    /// `[limits.admin]`: replaces the base for admins.
    #[serde(default)]
    pub admin: Option<Budget>,
    /// `[limits.user]`: replaces the base for users (and for anyone let in
    /// by `allow_all_users` or `allowed_chats`).
    #[serde(default)]
    pub user: Option<Budget>,
}

impl LimitsConfig {
    /// Check the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.base().validate("limits")?;
        for (name, budget) in [
            ("limits.owner", &self.owner),
            ("limits.admin", &self.admin),
            ("limits.user", &self.user),
        ] {
            if let Some(budget) = budget {
                budget.validate(name)?;
            }
        }
        Ok(())
    }

    fn base(&self) -> Budget {
        Budget {
            daily_tokens: self.daily_tokens,
            daily_cost_usd: self.daily_cost_usd,
            turns_per_hour: self.turns_per_hour,
        }
    }

    /// The budget of a user of `role` (`None`: not a member, let in by an
    /// open chat, counted as a user).
    pub fn budget_for(&self, role: Option<Role>) -> Budget {
        let table = match role {
            Some(Role::Owner) => &self.owner,
            Some(Role::Admin) => &self.admin,
            Some(Role::User) | None => &self.user,
        };
        table.clone().unwrap_or_else(|| self.base())
    }

    /// No limit is set anywhere.
    pub fn is_unlimited(&self) -> bool {
        [
            Some(self.base()),
            self.owner.clone(),
            self.admin.clone(),
            self.user.clone(),
        ]
        .into_iter()
        .flatten()
        .all(|b| b.is_unlimited())
    }
}

/// Which limit a turn ran into.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitKind {
    /// Tokens per day (the limit).
    DailyTokens(u64),
    /// Dollars per day (the limit).
    DailyCost(f64),
    /// Turns per hour (the limit).
    TurnsPerHour(u32),
}

/// What a user spent, as the checks need it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    /// Tokens today.
    pub tokens_today: u64,
    /// Dollars today.
    pub cost_today: f64,
    /// Turns in the last hour.
    pub turns_last_hour: u32,
}

/// The limit `spent` has reached under `budget`, if any (pure).
pub fn reached(budget: &Budget, spent: &Spent) -> Option<LimitKind> {
    if let Some(limit) = budget.turns_per_hour {
        if spent.turns_last_hour >= limit {
            return Some(LimitKind::TurnsPerHour(limit));
        }
    }
    if let Some(limit) = budget.daily_tokens {
        if spent.tokens_today >= limit {
            return Some(LimitKind::DailyTokens(limit));
        }
    }
    if let Some(limit) = budget.daily_cost_usd {
        if spent.cost_today >= limit {
            return Some(LimitKind::DailyCost(limit));
        }
    }
    None
}

/// All tokens of a usage (input, cached input, output).
pub fn tokens_of(usage: &AgentUsage) -> u64 {
    usage
        .input_tokens
        .saturating_add(usage.cached_input_tokens)
        .saturating_add(usage.output_tokens)
}

/// What a limit is called in a sentence.
fn limit_name(kind: LimitKind) -> String {
    match kind {
        LimitKind::DailyTokens(n) => format!("daily budget of {} tokens", human_count(n)),
        LimitKind::DailyCost(usd) => format!("daily budget of ${usd:.2}"),
        LimitKind::TurnsPerHour(n) => format!("limit of {n} messages per hour"),
    }
}

/// The refusal of a turn at `kind`, free again at `resets` (local time
/// text, e.g. "00:00 (Europe/Berlin)").
pub fn refusal_text(kind: LimitKind, resets: &str) -> String {
    format!(
        "⏳ You have reached your {}. It resets at {resets}; this message was not run \
         (and not counted).",
        limit_name(kind)
    )
}

/// The note a tool loop ends with at `kind`.
pub fn stopped_note(kind: LimitKind, resets: &str) -> String {
    format!(
        "(Stopped: your {} was reached during this task; it resets at {resets}.)",
        limit_name(kind)
    )
}

/// 950, 12.3k, 4.5M.
pub fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// How a usage reads in /usage and /users: "3 turns, 12.3k tokens, $0.0123".
pub fn usage_line(usage: &AgentUsage) -> String {
    let turns = if usage.turns == 1 { "turn" } else { "turns" };
    let mut text = format!(
        "{} {turns}, {} tokens",
        usage.turns,
        human_count(tokens_of(usage))
    );
    if usage.cost_usd > 0.0 {
        text.push_str(&format!(", ${:.4}", usage.cost_usd));
    }
    text
}

/// The budgets and the clock they run on. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    config: LimitsConfig,
    clock: Clock,
    /// A zone for every chat (tests); `None`: the chat's own
    /// ([`zone::chat_time_zone`]).
    zone: Option<jiff::tz::TimeZone>,
    /// The zone of a chat without a `/timezone`; `None`: the system's.
    default_zone: Option<jiff::tz::TimeZone>,
}

/// Whether a turn may run.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// It may: what is left of its user's budget (for its meter).
    Go(Allowance),
    /// It may not: the refusal, in the user's words.
    Refused(String),
}

/// A turn may run: what is left of its user's budget (for its meter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allowance {
    /// Tokens left today.
    pub tokens_left: Option<u64>,
    /// Dollars left today.
    pub cost_left: Option<f64>,
    /// When the daily limits reset (local time text).
    pub resets: String,
}

impl Limits {
    /// Budgets from `config`, on `clock`.
    pub fn new(config: LimitsConfig, clock: Clock) -> Limits {
        Limits {
            config,
            clock,
            zone: None,
            default_zone: None,
        }
    }

    /// Chats without a `/timezone` of their own follow `zone`.
    pub fn with_default_zone(mut self, zone: jiff::tz::TimeZone) -> Limits {
        self.default_zone = Some(zone);
        self
    }

    /// Every chat's days follow `zone` (tests).
    pub fn with_zone(mut self, zone: jiff::tz::TimeZone) -> Limits {
        self.zone = Some(zone);
        self
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The settings.
    pub fn config(&self) -> &LimitsConfig {
        &self.config
    }

    /// The time zone of `chat_id`'s days.
    pub async fn zone(&self, jobs: &Jobs, chat_id: i64) -> jiff::tz::TimeZone {
        match &self.zone {
            Some(zone) => zone.clone(),
            None => {
                let default = self
                    .default_zone
                    .clone()
                    .unwrap_or_else(jiff::tz::TimeZone::system);
                zone::chat_time_zone(jobs, chat_id, &default).await
            }
        }
    }

    /// May `user` (of `role`) start a turn in `chat_id`? Reads the
    /// store's usage only when a limit is set.
    pub async fn check(
        &self,
        usage: &Usage,
        jobs: &Jobs,
        user: u64,
        role: Option<Role>,
        chat_id: i64,
    ) -> Result<Verdict, StoreError> {
        let budget = self.config.budget_for(role);
        let tz = self.zone(jobs, chat_id).await;
        let now = self.clock.now();
        let today = zone::day_range(&tz, now);
        let resets = zone::local_time_text(&tz, today.1);
        if budget.is_unlimited() {
            return Ok(Verdict::Go(Allowance {
                resets,
                ..Allowance::default()
            }));
        }
        let used = usage
            .usage_between(Some(user), today.0, today.1)
            .await?
            .remove(&user)
            .unwrap_or_default();
        let hour_ago = now.as_millisecond() - 3_600_000;
        let last_hour = usage.turn_times_since(user, hour_ago).await?;
        let spent = Spent {
            tokens_today: tokens_of(&used),
            cost_today: used.cost_usd,
            turns_last_hour: u32::try_from(last_hour.len()).unwrap_or(u32::MAX),
        };
        if let Some(kind) = reached(&budget, &spent) {
            let resets = match kind {
                // A turn is free again an hour after the oldest one counted.
                LimitKind::TurnsPerHour(_) => {
                    let free_at = last_hour.first().copied().unwrap_or(hour_ago) + 3_600_000;
                    zone::local_time_text(&tz, free_at)
                }
                _ => resets,
            };
            return Ok(Verdict::Refused(refusal_text(kind, &resets)));
        }
        Ok(Verdict::Go(Allowance {
            tokens_left: budget
                .daily_tokens
                .map(|limit| limit.saturating_sub(spent.tokens_today)),
            cost_left: budget
                .daily_cost_usd
                .map(|limit| (limit - spent.cost_today).max(0.0)),
            resets,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(text: &str) -> LimitsConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_role_table_replaces_the_base_entirely() {
        let config = limits(
            "daily_tokens = 100\nturns_per_hour = 5\n[owner]\n[admin]\ndaily_tokens = 1000\n",
        );
        assert_eq!(config.budget_for(Some(Role::Owner)), Budget::default());
        assert_eq!(
            config.budget_for(Some(Role::Admin)),
            Budget {
                daily_tokens: Some(1000),
                ..Budget::default()
            }
        );
        let user = config.budget_for(Some(Role::User));
        assert_eq!(
            (user.daily_tokens, user.turns_per_hour),
            (Some(100), Some(5))
        );
        assert_eq!(config.budget_for(None), user);
        assert!(!config.is_unlimited());
        assert!(LimitsConfig::default().is_unlimited());
        assert!(toml::from_str::<LimitsConfig>("daily_tokns = 1").is_err());
        assert!(limits("daily_cost_usd = -1.0").validate().is_err());
        assert!(limits("[user]\ndaily_cost_usd = nan").validate().is_err());
    }

    #[test]
    fn each_limit_is_reached_at_its_value_not_before() {
        let budget = Budget {
            daily_tokens: Some(100),
            daily_cost_usd: Some(1.0),
            turns_per_hour: Some(3),
        };
        let under = Spent {
            tokens_today: 99,
            cost_today: 0.99,
            turns_last_hour: 2,
        };
        assert_eq!(reached(&budget, &under), None);
        let tokens = Spent {
            tokens_today: 100,
            ..under
        };
        assert_eq!(reached(&budget, &tokens), Some(LimitKind::DailyTokens(100)));
        let cost = Spent {
            cost_today: 1.0,
            ..under
        };
        assert_eq!(reached(&budget, &cost), Some(LimitKind::DailyCost(1.0)));
        let turns = Spent {
            turns_last_hour: 3,
            ..under
        };
        assert_eq!(reached(&budget, &turns), Some(LimitKind::TurnsPerHour(3)));
        assert_eq!(reached(&Budget::default(), &turns), None);
    }

    #[test]
    fn refusals_say_which_limit_and_when_it_resets() {
        let text = refusal_text(LimitKind::DailyTokens(200_000), "00:00 (Europe/Berlin)");
        assert!(text.contains("daily budget of 200.0k tokens"), "{text}");
        assert!(text.contains("resets at 00:00 (Europe/Berlin)"), "{text}");
        assert!(text.contains("not counted"), "{text}");
        assert!(refusal_text(LimitKind::DailyCost(2.0), "x").contains("$2.00"));
        assert!(refusal_text(LimitKind::TurnsPerHour(20), "x").contains("20 messages per hour"));
        assert!(stopped_note(LimitKind::DailyTokens(5), "00:00").starts_with("(Stopped"));
        let line = usage_line(&AgentUsage {
            turns: 1,
            input_tokens: 1000,
            cached_input_tokens: 200,
            output_tokens: 34,
            cost_usd: 0.5,
        });
        assert_eq!(line, "1 turn, 1.2k tokens, $0.5000");
    }
}
