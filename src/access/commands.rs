//! The team commands' answers: /invite, /users, /role, /revoke, /usage,
//! and /pair from someone who already has access.
//!
//! Each answer is checked against the actor's role first ([`super::roles`]);
//! the texts are the user's words. They never touch a running turn, so the
//! runner answers them at once, also mid-turn. An invite's code is shown
//! only in the reply to its creator, in a private chat.

use crate::limits::{usage_line, zone, Limits};
use crate::store::{AgentUsage, Jobs, Usage};
use crate::vocab::SessionSource;

use super::roles::{self, Origin, Role, Standing};
use super::Access;

/// What a team command needs to know.
pub struct TeamContext<'a> {
    /// Who may do what (`None`: no team, only /usage answers).
    pub access: Option<&'a Access>,
    /// Budgets (and their clock and days).
    pub limits: &'a Limits,
    /// Usage lives here.
    pub usage: &'a Usage,
    /// The chats' time zones (with the jobs).
    pub jobs: &'a Jobs,
    /// Who sent the command, where.
    pub actor: &'a SessionSource,
    /// The bot's username, for invite links.
    pub bot: Option<&'a str>,
}

/// Said when the store failed under a team command.
const STORE_FAILED: &str =
    "⚠️ I could not read or change the team right now; please try again later.";

impl TeamContext<'_> {
    fn standing(&self) -> Option<Standing> {
        let access = self.access?;
        self.actor.user_id.and_then(|u| access.standing(u))
    }

    fn team(&self) -> Result<&Access, String> {
        self.access
            .ok_or_else(|| "Teams (invites, roles) work with the Telegram bot.".to_string())
    }

    fn manager(&self) -> Result<(u64, Standing), String> {
        let user = self.actor.user_id.ok_or("I cannot tell who you are.")?;
        match self.standing() {
            Some(standing) if roles::manages_team(standing.role) => Ok((user, standing)),
            _ => Err("Only the owner or an admin can do that.".to_string()),
        }
    }
}

fn who(id: u64, name: Option<&str>) -> String {
    match name.filter(|n| !n.trim().is_empty()) {
        Some(name) => format!("{name} ({id})"),
        None => id.to_string(),
    }
}

/// /pair from someone who has access already.
pub fn already_paired(ctx: &TeamContext<'_>) -> String {
    match ctx.standing() {
        Some(standing) => format!(
            "You already have access to this bot (as {}).",
            standing.role.as_str()
        ),
        None => "This bot is already set up.".to_string(),
    }
}

/// /invite [admin|user].
pub async fn invite(ctx: &TeamContext<'_>, args: &str) -> String {
    let (actor, standing) = match ctx.manager() {
        Ok(manager) => manager,
        Err(text) => return text,
    };
    let role = match args.split_whitespace().next() {
        None => Role::User,
        Some(name) => match Role::parse(name) {
            Some(role) => role,
            None => return format!("Unknown role \"{name}\"; use /invite admin or /invite user."),
        },
    };
    if let Err(text) = roles::may_invite(standing.role, role) {
        return text;
    }
    if ctx.actor.chat_type.is_group() {
        return "Send /invite in a private chat with me, so the code is not shown to the group."
            .to_string();
    }
    let access = match ctx.team() {
        Ok(access) => access,
        Err(text) => return text,
    };
    match access.invite(actor, role).await {
        Ok(invite) => {
            tracing::info!(actor, role = role.as_str(), "invite created");
            let link = ctx
                .bot
                .map(|bot| format!("https://t.me/{bot}?start={}\n\nor they send ", invite.code))
                .unwrap_or_else(|| "They send ".to_string());
            format!(
                "🎟 Invite for a new {} (works once, for {} hours):\n\n{link}/start {} to me.",
                role.as_str(),
                invite.hours,
                invite.code
            )
        }
        Err(error) => {
            tracing::error!(%error, "could not create an invite");
            STORE_FAILED.to_string()
        }
    }
}

/// /users: everyone with access, their role, last activity and usage today.
pub async fn users(ctx: &TeamContext<'_>) -> String {
    if let Err(text) = ctx.manager() {
        return text;
    }
    let tz = ctx.limits.day_zone();
    let now = ctx.limits.clock().now();
    let (from, to) = zone::day_range(&tz, now);
    let (today, last) = match (
        ctx.usage.usage_between(None, from, to).await,
        ctx.usage.last_turns().await,
    ) {
        (Ok(today), Ok(last)) => (today, last),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, "could not read usage for /users");
            return STORE_FAILED.to_string();
        }
    };
    let everyone = match ctx.team() {
        Ok(access) => access.everyone(),
        Err(text) => return text,
    };
    let mut text = format!("👥 People with access ({}):", everyone.len());
    for (id, standing, name) in everyone {
        let mut line = format!(
            "\n• {}: {}",
            who(id, name.as_deref()),
            standing.role.as_str()
        );
        if standing.origin == Origin::Config {
            line.push_str(" (from config)");
        }
        match last.get(&id) {
            Some(at) => line.push_str(&format!(
                " · active {} ago",
                ago(now.as_millisecond().saturating_sub(*at))
            )),
            None => line.push_str(" · never active"),
        }
        if let Some(usage) = today.get(&id) {
            line.push_str(&format!(" · today {}", usage_line(usage)));
        }
        text.push_str(&line);
    }
    text.push_str(
        "\n\n/invite adds someone, /role ID ROLE changes a role, /revoke ID takes access away.",
    );
    text
}

/// "45s", "12m", "3h", "2d".
fn ago(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn target_of(args: &str) -> Result<(u64, Option<&str>), String> {
    let mut words = args.split_whitespace();
    let id = words
        .next()
        .and_then(|w| w.parse::<u64>().ok())
        .ok_or("Which user? Give their numeric id; /users lists them.")?;
    Ok((id, words.next()))
}

/// /role ID ROLE.
pub async fn role(ctx: &TeamContext<'_>, args: &str) -> String {
    let Some(actor) = ctx.standing() else {
        return "Only the owner can change roles.".to_string();
    };
    let (target, name) = match target_of(args) {
        Ok(found) => found,
        Err(text) => return text,
    };
    let Some(new) = name.and_then(Role::parse) else {
        return "Which role? Send /role ID admin or /role ID user.".to_string();
    };
    let access = match ctx.team() {
        Ok(access) => access,
        Err(text) => return text,
    };
    let Some(standing) = access.standing(target) else {
        return format!("User {target} has no access; /invite them first.");
    };
    if let Err(text) = roles::may_set_role(actor, standing, new) {
        return text;
    }
    match access.set_role(target, new).await {
        Ok(true) => {
            tracing::info!(target, role = new.as_str(), "role changed");
            format!("✅ User {target} is {} {} now.", article(new), new.as_str())
        }
        Ok(false) => format!("User {target} has no access; /invite them first."),
        Err(error) => {
            tracing::error!(%error, "could not change a role");
            STORE_FAILED.to_string()
        }
    }
}

fn article(role: Role) -> &'static str {
    match role {
        Role::Owner => "the",
        Role::Admin => "an",
        Role::User => "a",
    }
}

/// What /revoke ended of the revoked user's work, for its answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// Their turns that were running (stopped).
    pub turns: usize,
    /// Their requests that waited for approval (refused).
    pub approvals: usize,
    /// Their messages waiting in a queue (dropped).
    pub queued: usize,
    /// Their active jobs (paused), by id.
    pub jobs: Vec<i64>,
}

/// /revoke ID: the checks, then the member removed (with the unused
/// invites they made). `Ok`: the user revoked (the caller ends their work
/// and answers with [`revoked_text`]); `Err`: the answer (refused, failed).
pub async fn revoke(ctx: &TeamContext<'_>, args: &str) -> Result<u64, String> {
    let Some(actor) = ctx.standing() else {
        return Err("Only the owner or an admin can revoke access.".to_string());
    };
    let (target, _) = target_of(args)?;
    let access = ctx.team()?;
    let Some(standing) = access.standing(target) else {
        return Err(format!("User {target} has no access."));
    };
    roles::may_revoke(actor, standing)?;
    match access.revoke(target).await {
        Ok(_) => {
            tracing::info!(target, "access revoked");
            Ok(target)
        }
        Err(error) => {
            tracing::error!(%error, "could not revoke access");
            Err(STORE_FAILED.to_string())
        }
    }
}

/// The answer to a /revoke that took `target`'s access away, with what
/// was ended of their work.
pub fn revoked_text(target: u64, ended: &Ended) -> String {
    let mut text =
        format!("🚫 User {target} no longer has access (their unused invites are void too).");
    let mut parts = Vec::new();
    if ended.turns > 0 {
        parts.push(count(ended.turns, "running task", "running tasks") + " stopped");
    }
    if ended.approvals > 0 {
        parts.push(count(ended.approvals, "approval request", "approval requests") + " refused");
    }
    if ended.queued > 0 {
        parts.push(count(ended.queued, "waiting message", "waiting messages") + " dropped");
    }
    if !ended.jobs.is_empty() {
        let ids: Vec<String> = ended.jobs.iter().map(|id| id.to_string()).collect();
        parts.push(format!(
            "{} paused ({}; /resume ID starts one again)",
            count(ended.jobs.len(), "job", "jobs"),
            ids.join(", ")
        ));
    }
    if !parts.is_empty() {
        text.push_str(&format!(" Of theirs: {}.", parts.join(", ")));
    }
    text
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// /usage (mine today and this month), /usage all (owner, admins: everyone).
pub async fn usage(ctx: &TeamContext<'_>, args: &str) -> String {
    let all = args
        .split_whitespace()
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("all"));
    let Some(user) = ctx.actor.user_id else {
        return "I cannot tell who you are.".to_string();
    };
    if all {
        if let Err(text) = ctx.manager() {
            return text.replace("do that", "see everyone's usage");
        }
    }
    let tz = ctx.limits.day_zone();
    let now = ctx.limits.clock().now();
    let day = zone::day_range(&tz, now);
    let month = zone::month_range(&tz, now);
    let who_filter = (!all).then_some(user);
    let (today, this_month) = match (
        ctx.usage.usage_between(who_filter, day.0, day.1).await,
        ctx.usage.usage_between(who_filter, month.0, month.1).await,
    ) {
        (Ok(today), Ok(month)) => (today, month),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, "could not read usage");
            return STORE_FAILED.to_string();
        }
    };
    let line = |usage: Option<&AgentUsage>| usage.map_or_else(|| "nothing".to_string(), usage_line);
    if !all {
        let role = ctx.standing().map(|s| s.role);
        let budget = ctx.limits.config().budget_for(role);
        let mut text = format!(
            "📊 Your usage\nToday: {}\nThis month: {}",
            line(today.get(&user)),
            line(this_month.get(&user))
        );
        let mut limits = Vec::new();
        if let Some(n) = budget.daily_tokens {
            limits.push(format!("{} tokens a day", crate::limits::human_count(n)));
        }
        if let Some(usd) = budget.daily_cost_usd {
            limits.push(format!("${usd:.2} a day"));
        }
        if let Some(n) = budget.turns_per_hour {
            limits.push(format!("{n} messages an hour"));
        }
        if !limits.is_empty() {
            text.push_str(&format!(
                "\nYour limits: {} (days end at {})",
                limits.join(", "),
                zone::local_time_text(&tz, day.1)
            ));
        }
        return text;
    }
    let mut ids: Vec<u64> = this_month.keys().copied().collect();
    ids.sort_unstable();
    if ids.is_empty() {
        return "📊 Nobody used the bot this month yet.".to_string();
    }
    let names: std::collections::HashMap<u64, Option<String>> = ctx
        .access
        .map(Access::everyone)
        .unwrap_or_default()
        .into_iter()
        .map(|(id, _, name)| (id, name))
        .collect();
    let mut text = String::from("📊 Usage by user (today / this month):");
    for id in ids {
        let name = names.get(&id).cloned().flatten();
        text.push_str(&format!(
            "\n• {}: {} / {}",
            who(id, name.as_deref()),
            line(today.get(&id)),
            line(this_month.get(&id))
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_ago_read_in_one_unit() {
        assert_eq!(ago(5_000), "5s");
        assert_eq!(ago(125_000), "2m");
        assert_eq!(ago(7_200_000), "2h");
        assert_eq!(ago(3 * 86_400_000), "3d");
        assert_eq!(ago(-5), "0s");
    }

    #[test]
    fn a_revoke_says_what_it_ended() {
        let nothing = revoked_text(7, &Ended::default());
        assert_eq!(
            nothing,
            "🚫 User 7 no longer has access (their unused invites are void too)."
        );
        let all = revoked_text(
            7,
            &Ended {
                turns: 1,
                approvals: 2,
                queued: 3,
                jobs: vec![4, 9],
            },
        );
        assert!(all.ends_with(
            " Of theirs: 1 running task stopped, 2 approval requests refused, \
             3 waiting messages dropped, 2 jobs paused (4, 9; /resume ID starts one again)."
        ));
    }

    #[test]
    fn a_target_is_a_numeric_id() {
        assert_eq!(target_of("42 admin").unwrap(), (42, Some("admin")));
        assert!(target_of("@ann").is_err());
        assert!(target_of("").is_err());
        assert_eq!(who(7, Some("Ann")), "Ann (7)");
        assert_eq!(who(7, Some(" ")), "7");
    }
}
