//! Commands as typed: `/name args`, `/name@bot args`, `@bot /name args`,
//! and the commands telegate knows.
//!
//! Parsing lives here, once, for every layer that looks at a command (the
//! adapter's command path, the preparation stage's lanes, the runner's
//! dispatch, the command menu). Pure: no I/O, no state.

/// A parsed command: which of telegate's commands it is (if any), its name
/// as typed and the raw argument text. Parsed once; the adapter, the
/// preparation stage and the runner all decide on [`Command::known`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command<'a> {
    /// The command telegate knows by this name, or `None` (answered as
    /// unknown by the runner).
    pub known: Option<KnownCommand>,
    /// The name without the slash or `@botname`, as typed.
    pub name: &'a str,
    /// Everything after the name, trimmed.
    pub args: &'a str,
}

impl Command<'_> {
    /// This is the known command `command`.
    pub fn is(&self, command: KnownCommand) -> bool {
        self.known == Some(command)
    }

    /// It takes the adapter's command path while a turn runs (see
    /// [`KnownCommand::is_control`]).
    pub fn is_control(&self) -> bool {
        self.known.is_some_and(KnownCommand::is_control)
    }

    /// It gives the slot a new session (see [`KnownCommand::rotates`]).
    pub fn rotates(&self) -> bool {
        self.known.is_some_and(KnownCommand::rotates)
    }
}

/// Parse `/cmd`, `/cmd args`, `/cmd@botname args` (case-insensitive) and the
/// same preceded by a leading `@mention` (as people type in groups).
///
/// Returns `None` for ordinary text, for `/` alone, and for a command
/// addressed to another bot when `bot_username` is known.
pub fn parse_command<'a>(text: &'a str, bot_username: Option<&str>) -> Option<Command<'a>> {
    let mut rest = text.trim_start();
    if let Some(after_at) = rest.strip_prefix('@') {
        // A leading mention: "@bot /stop". Skip the mention word.
        let end = after_at.find(char::is_whitespace).unwrap_or(after_at.len());
        rest = after_at[end..].trim_start();
    }
    let body = rest.strip_prefix('/')?;
    let word_end = body.find(char::is_whitespace).unwrap_or(body.len());
    let word = &body[..word_end];
    let args = body[word_end..].trim();
    let (name, target) = match word.split_once('@') {
        Some((name, target)) => (name, Some(target)),
        None => (word, None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    if let (Some(target), Some(me)) = (target, bot_username) {
        if !target.eq_ignore_ascii_case(me.trim_start_matches('@')) {
            return None;
        }
    }
    Some(Command {
        known: KnownCommand::parse(name),
        name,
        args,
    })
}

/// The commands telegate knows, with a one-line description (also used for
/// Telegram's command menu).
pub const COMMANDS: &[(&str, &str)] = &[
    ("start", "Say hello and show what I can do"),
    ("help", "List the commands"),
    (
        "status",
        "Show the session, whether a task runs, and the queue",
    ),
    ("stop", "Stop the running task"),
    ("new", "Start a fresh conversation"),
    ("reset", "Reset the conversation (same as /new)"),
    ("ps", "List this chat's background processes"),
    (
        "kill",
        "Stop a background process and all it started: /kill ID",
    ),
    ("approve", "Run the command waiting for your approval"),
    ("deny", "Refuse the command waiting for your approval"),
    (
        "retry",
        "Run your last message again, replacing the last answer",
    ),
    ("undo", "Remove the last exchange from the conversation"),
    ("model", "Show or switch the model: /model NAME"),
    ("jobs", "List this chat's scheduled jobs"),
    ("at", "Run or remind at a time: /at 18:00 remind: call Anna"),
    (
        "in",
        "Run or remind after a while: /in 30m remind: call Anna",
    ),
    (
        "every",
        "Repeat: /every weekday 08:00 summarise my inbox, /every 1h …",
    ),
    (
        "cron",
        "Repeat by cron: /cron \"0 8 * * 1-5\" summarise my inbox",
    ),
    ("pause", "Pause a scheduled job: /pause ID"),
    ("unschedule", "Delete a scheduled job: /unschedule ID"),
    (
        "timezone",
        "Show or set this chat's time zone: /timezone Europe/Berlin",
    ),
    ("sessions", "List this chat's conversations to go back to"),
    (
        "resume",
        "Go back to a conversation, or resume a paused job: /resume ID",
    ),
    ("title", "Name this conversation: /title TEXT"),
    ("usage", "Show your usage today and this month"),
    ("voice", "Answer with voice notes: /voice on, off or auto"),
    (
        "diff",
        "Send this conversation's changes (its git worktree)",
    ),
    ("merge", "Merge this conversation's worktree into its base"),
    ("discard", "Throw this conversation's worktree away"),
    (
        "invite",
        "Invite someone (owner, admins): /invite [admin|user]",
    ),
    ("users", "List who has access (owner, admins)"),
    ("role", "Change someone's role (owner): /role ID ROLE"),
    ("revoke", "Take someone's access away: /revoke ID"),
];

/// A command the runner recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownCommand {
    /// /start
    Start,
    /// /help
    Help,
    /// /status
    Status,
    /// /stop
    Stop,
    /// /new
    New,
    /// /reset
    Reset,
    /// /ps
    Ps,
    /// /kill ID
    Kill,
    /// /approve
    Approve,
    /// /deny
    Deny,
    /// /retry
    Retry,
    /// /undo
    Undo,
    /// /model [NAME]
    Model,
    /// /jobs
    Jobs,
    /// /at WHEN ACTION
    At,
    /// /in DURATION ACTION
    In,
    /// /every SCHEDULE ACTION
    Every,
    /// /cron "EXPR" ACTION
    Cron,
    /// /pause ID
    Pause,
    /// /resume ID
    Resume,
    /// /unschedule ID
    Unschedule,
    /// /timezone [NAME]
    Timezone,
    /// /pair CODE (from someone who has access already)
    Pair,
    /// /invite [ROLE]
    Invite,
    /// /users
    Users,
    /// /role ID ROLE
    Role,
    /// /revoke ID
    Revoke,
    /// /usage [all]
    Usage,
    /// /sessions
    Sessions,
    /// /title TEXT
    Title,
    /// /voice on|off|auto
    Voice,
    /// /diff: the conversation's worktree changes
    Diff,
    /// /merge: the conversation's worktree into its base
    Merge,
    /// /discard: the conversation's worktree thrown away
    Discard,
}

impl KnownCommand {
    /// Look a command name up (case-insensitive).
    pub fn parse(name: &str) -> Option<KnownCommand> {
        let known = [
            ("start", KnownCommand::Start),
            ("help", KnownCommand::Help),
            ("status", KnownCommand::Status),
            ("stop", KnownCommand::Stop),
            ("new", KnownCommand::New),
            ("reset", KnownCommand::Reset),
            ("ps", KnownCommand::Ps),
            ("kill", KnownCommand::Kill),
            ("approve", KnownCommand::Approve),
            ("deny", KnownCommand::Deny),
            ("retry", KnownCommand::Retry),
            ("undo", KnownCommand::Undo),
            ("model", KnownCommand::Model),
            ("jobs", KnownCommand::Jobs),
            ("at", KnownCommand::At),
            ("in", KnownCommand::In),
            ("every", KnownCommand::Every),
            ("cron", KnownCommand::Cron),
            ("pause", KnownCommand::Pause),
            ("resume", KnownCommand::Resume),
            ("unschedule", KnownCommand::Unschedule),
            ("timezone", KnownCommand::Timezone),
            ("pair", KnownCommand::Pair),
            ("invite", KnownCommand::Invite),
            ("users", KnownCommand::Users),
            ("role", KnownCommand::Role),
            ("revoke", KnownCommand::Revoke),
            ("usage", KnownCommand::Usage),
            ("sessions", KnownCommand::Sessions),
            ("title", KnownCommand::Title),
            ("voice", KnownCommand::Voice),
            ("diff", KnownCommand::Diff),
            ("merge", KnownCommand::Merge),
            ("discard", KnownCommand::Discard),
        ];
        known
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| *c)
    }

    /// The commands that take the adapter's command path while a turn
    /// runs: they must reach the runner even though the slot is busy.
    pub fn is_control(self) -> bool {
        matches!(
            self,
            KnownCommand::Stop | KnownCommand::New | KnownCommand::Reset
        )
    }

    /// The commands that give the slot a new session (and so discard what
    /// is queued for the old one).
    pub fn rotates(self) -> bool {
        matches!(self, KnownCommand::New | KnownCommand::Reset)
    }

    /// The scheduling commands (answered with the sender known, mid-turn
    /// too: they never touch the running turn).
    pub fn is_job_command(self) -> bool {
        matches!(
            self,
            KnownCommand::Jobs
                | KnownCommand::At
                | KnownCommand::In
                | KnownCommand::Every
                | KnownCommand::Cron
                | KnownCommand::Pause
                | KnownCommand::Resume
                | KnownCommand::Unschedule
                | KnownCommand::Timezone
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_command, KnownCommand, COMMANDS};

    #[test]
    fn every_listed_command_is_known() {
        for (name, _) in COMMANDS {
            assert!(KnownCommand::parse(name).is_some(), "/{name}");
        }
    }

    #[test]
    fn commands_parse_case_insensitively_with_bot_suffix_and_mention() {
        let c = parse_command("/STOP", None).unwrap();
        assert!(c.is(KnownCommand::Stop));
        assert!(c.is_control() && !c.rotates());
        let c = parse_command("/Reset", None).unwrap();
        assert!(c.is_control() && c.rotates());
        let c = parse_command("/frobnicate now", None).unwrap();
        assert_eq!((c.known, c.name, c.args), (None, "frobnicate", "now"));
        assert!(!c.is_control());
        let c = parse_command("/model@MyBot gpt-4 --fast", Some("mybot")).unwrap();
        assert_eq!((c.name, c.args), ("model", "gpt-4 --fast"));
        assert!(parse_command("/stop@otherbot", Some("mybot")).is_none());
        let c = parse_command("@mybot /new  hello ", Some("mybot")).unwrap();
        assert_eq!((c.name, c.args), ("new", "hello"));
        assert!(parse_command("hello /stop", None).is_none());
        assert!(parse_command("/", None).is_none());
        assert!(parse_command("/ stop", None).is_none());
        assert!(parse_command("/path/to/file", None).is_none());
    }

    #[test]
    fn commands_parse_case_insensitively() {
        assert_eq!(KnownCommand::parse("STOP"), Some(KnownCommand::Stop));
        assert_eq!(KnownCommand::parse("Model"), Some(KnownCommand::Model));
        assert_eq!(KnownCommand::parse("models"), None);
    }
}
