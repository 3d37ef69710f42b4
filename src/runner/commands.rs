//! The slash commands the runner answers, and their texts.
//!
//! Which commands exist and how they are parsed lives in
//! [`crate::vocab`]; this module only knows how the runner's replies read.
//! Pure functions: no state, no I/O.

use std::time::Duration;

use crate::store::AgentUsage;
use crate::tools::approval::{Decided, NotDecided};
use crate::tools::approval_prompt::preview;
use crate::vocab::COMMANDS;

/// The /help text.
pub fn help_text() -> String {
    let mut text = String::from("Commands:\n");
    for (name, description) in COMMANDS {
        text.push_str(&format!("/{name} — {description}\n"));
    }
    text.push_str("\nAnything else is sent to the agent.");
    text
}

/// The /start text.
pub(super) fn start_text(backend: &str) -> String {
    format!(
        "Hi! Messages you send here go to the agent ({backend}).\n\
         Send /stop to stop a running task, /new to start a fresh conversation, /help for more."
    )
}

/// The reply to an unknown command.
pub(super) fn unknown_command_text(name: &str) -> String {
    format!("Unknown command /{name}. Send /help to see what I understand.")
}

/// What /status shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusView {
    /// The current session id.
    pub session_id: String,
    /// Messages in the session's transcript, when a store keeps one.
    pub history_len: Option<usize>,
    /// Oldest messages the backend left out of the last turn to fit its budget.
    pub history_trimmed: usize,
    /// How long the running task has run, if one runs.
    pub running_for: Option<Duration>,
    /// True while a task is still being set up.
    pub starting: bool,
    /// Messages waiting for the slot.
    pub queue_depth: usize,
    /// The agent backend's name.
    pub backend: String,
    /// The chat's running background processes, one line each
    /// ([`process_line`]); `None` when the terminal tool is off.
    pub processes: Option<Vec<String>>,
    /// The CLI agent's usage and cost ([`usage_text`]), when any is recorded.
    pub agent_usage: Option<String>,
    /// The model the session uses, when the backend has a choice.
    pub model: Option<String>,
    /// The chat's next scheduled run, when it has one.
    pub next_job: Option<String>,
}

/// The /status text.
pub fn status_text(view: &StatusView) -> String {
    let state = match (view.running_for, view.starting) {
        (_, true) => "busy (starting)".to_string(),
        (Some(age), false) => format!("busy (running for {})", human_duration(age)),
        (None, false) => "idle".to_string(),
    };
    let mut text = format!(
        "Session: {}\nState: {}\nQueued messages: {}\nBackend: {}",
        view.session_id, state, view.queue_depth, view.backend
    );
    if let Some(model) = &view.model {
        text.push_str(&format!("\nModel: {model}"));
    }
    if let Some(processes) = &view.processes {
        if processes.is_empty() {
            text.push_str("\nBackground processes: none running");
        } else {
            text.push_str(&format!(
                "\nBackground processes running: {}",
                processes.len()
            ));
            for line in processes {
                text.push_str("\n  ");
                text.push_str(line);
            }
        }
    }
    if let Some(usage) = &view.agent_usage {
        text.push('\n');
        text.push_str(usage);
    }
    if let Some(next) = &view.next_job {
        text.push('\n');
        text.push_str(next);
    }
    if let Some(len) = view.history_len {
        text.push_str(&format!("\nHistory: {len} messages"));
        if view.history_trimmed > 0 {
            text.push_str(&format!(
                " ({} oldest left out of the last turn to fit the budget)",
                view.history_trimmed
            ));
        }
    }
    text
}

/// The agent's usage for /status: this session's and the total.
pub(super) fn usage_text(session: Option<&AgentUsage>, total: &AgentUsage) -> String {
    fn one(u: &AgentUsage) -> String {
        let turns = if u.turns == 1 { "turn" } else { "turns" };
        let mut text = format!(
            "{} {turns}, {} tokens in ({} cached), {} out",
            u.turns,
            human_count(u.input_tokens + u.cached_input_tokens),
            human_count(u.cached_input_tokens),
            human_count(u.output_tokens)
        );
        if u.cost_usd > 0.0 {
            text.push_str(&format!(", ${:.4}", u.cost_usd));
        }
        text
    }
    let this = session.map_or_else(|| "nothing yet".to_string(), one);
    format!(
        "Agent usage: this session {this}\nAgent usage, all sessions: {}",
        one(total)
    )
}

/// 950, 12.3k, 4.5M.
fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// One process in /ps and /status: id, state, runtime, command (long
/// commands are cut).
pub fn process_line(id: &str, state: &str, runtime: Duration, command: &str) -> String {
    const MAX_COMMAND_CHARS: usize = 80;
    let command = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown = if command.chars().count() > MAX_COMMAND_CHARS {
        let cut: String = command.chars().take(MAX_COMMAND_CHARS).collect();
        format!("{cut}…")
    } else {
        command
    };
    format!("{id}  {state}  {}  {shown}", human_duration(runtime))
}

/// The /ps text, from [`process_line`]s.
pub fn ps_text(lines: &[String]) -> String {
    if lines.is_empty() {
        return "No background processes in this chat.".to_string();
    }
    let mut text = String::from("Background processes (id, state, runtime, command):");
    for line in lines {
        text.push('\n');
        text.push_str(line);
    }
    text.push_str("\n\nStop one with /kill ID.");
    text
}

/// Said when a tool command is used but the terminal tool is off.
pub(super) const NO_TOOLS_TEXT: &str =
    "This bot does not run commands, so there are no processes or approvals.";

/// "4s", "2m 05s", "1h 02m".
pub(super) fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h {:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

/// The reply to `/approve` or `/deny` of request `ticket`: what was
/// chosen (the two-option case keeps its plain "running" / "not running").
pub(super) fn decided_text(ticket: &str, decided: &Result<Decided, NotDecided>) -> String {
    let decided = match decided {
        Ok(decided) => decided,
        Err(NotDecided::NotWaiting) => {
            return format!("Approval {ticket} is not waiting any more; nothing was run.")
        }
        Err(NotDecided::NoSuchOption) => {
            return format!(
                "Approval {ticket} offers no option that allows it; nothing was allowed. \
                 Use one of its buttons, or /deny {ticket}."
            )
        }
    };
    let subject = preview(&decided.subject);
    match (&decided.option, decided.approve_deny) {
        (_, true) if decided.allowed() => format!("✅ Approved {ticket}, running:\n{subject}"),
        (_, true) => format!("🚫 Denied {ticket}, not running:\n{subject}"),
        (Some(option), false) if decided.allowed() => {
            format!("✅ Approved {ticket} ({}):\n{subject}", option.label)
        }
        (Some(option), false) => format!("🚫 Denied {ticket} ({}):\n{subject}", option.label),
        (None, false) => format!("🚫 Denied {ticket}:\n{subject}"),
    }
}

/// /stop's reply while a finished turn's answer is still going out: what
/// had not gone out yet is not sent (a line saying what follows).
pub(super) const STOPPED_SENDING_TEXT: &str = "⏹ Stopped sending the answer.";

/// Said when /retry or /undo come while a task runs.
pub(super) const BUSY_HISTORY_TEXT: &str =
    "A task is running. Wait for it to finish (or /stop it), then send this again.";

/// The /undo reply.
pub(super) fn undone_text(user_text: &str, entries: usize) -> String {
    const SHOWN_CHARS: usize = 80;
    let one_line = user_text.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown = if one_line.chars().count() > SHOWN_CHARS {
        let cut: String = one_line.chars().take(SHOWN_CHARS).collect();
        format!("{cut}…")
    } else {
        one_line
    };
    format!(
        "↩️ Removed the last exchange from the conversation ({entries} message{}): \"{shown}\". \
         The transcript keeps it, marked as undone.",
        if entries == 1 { "" } else { "s" }
    )
}

/// The /model reply listing the choices.
pub(super) fn models_text(current: &str, models: &[String]) -> String {
    if models.is_empty() {
        return format!(
            "Model: {current}\nThis bot offers no other model to switch to (its owner can add some)."
        );
    }
    let mut text = format!("Model: {current}\nChoose one (or send /model NAME):");
    for name in models {
        text.push_str(&format!("\n• {name}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ps_lists_or_says_there_is_nothing() {
        assert!(ps_text(&[]).contains("No background processes"));
        let long = "x".repeat(200);
        let line = process_line("p1", "exit code 0", Duration::from_secs(61), &long);
        assert!(line.starts_with("p1  exit code 0  1m 01s  xxx"));
        assert!(line.ends_with('…'));
        assert!(ps_text(&[line]).contains("/kill ID"));
    }

    #[test]
    fn start_names_the_backend_and_the_controls() {
        let text = start_text("claude");
        assert!(text.contains("(claude)"), "{text}");
        for command in ["/stop", "/new", "/help"] {
            assert!(text.contains(command), "{command} missing: {text}");
        }
    }

    #[test]
    fn status_leaves_out_what_is_zero() {
        let text = status_text(&StatusView {
            session_id: "abc".into(),
            history_len: Some(3),
            history_trimmed: 0,
            running_for: None,
            starting: false,
            queue_depth: 0,
            backend: "echo".into(),
            processes: None,
            agent_usage: Some(usage_text(
                None,
                &AgentUsage {
                    turns: 1,
                    ..AgentUsage::default()
                },
            )),
            model: None,
            next_job: None,
        });
        assert!(text.contains("History: 3 messages"), "{text}");
        assert!(!text.contains("left out"), "nothing was trimmed: {text}");
        assert!(!text.contains('$'), "a cost of zero is not shown: {text}");
        assert!(text.contains("all sessions: 1 turn,"), "{text}");
    }

    #[test]
    fn counts_read_as_units_thousands_and_millions() {
        assert_eq!(human_count(950), "950");
        assert_eq!(human_count(12_300), "12.3k");
        assert_eq!(human_count(4_500_000), "4.5M");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1_000), "1.0k");
        assert_eq!(human_count(1_000_000), "1.0M");
    }

    #[test]
    fn undo_quotes_the_message_on_one_line_cut_past_80_characters() {
        let text = undone_text("fix\n  the   build", 2);
        assert!(text.contains("(2 messages): \"fix the build\""), "{text}");
        let text = undone_text("hi", 1);
        assert!(text.contains("(1 message): \"hi\""), "{text}");
        let exact = "z".repeat(80);
        assert!(undone_text(&exact, 2).contains(&format!("\"{exact}\"")));
        let longer = "z".repeat(81);
        assert!(undone_text(&longer, 2).contains(&format!("\"{exact}…\"")));
    }

    #[test]
    fn model_lists_the_choices_or_says_how_to_offer_some() {
        let text = models_text("big", &["big".into(), "small".into()]);
        assert_eq!(
            text,
            "Model: big\nChoose one (or send /model NAME):\n• big\n• small"
        );
        let text = models_text("big", &[]);
        assert!(text.starts_with("Model: big\n"), "{text}");
        assert!(text.contains("no other model"), "{text}");
        assert!(!text.contains("agent.openai"), "{text}");
    }

    #[test]
    fn durations_change_unit_exactly_at_a_minute_and_an_hour() {
        let read = |secs| human_duration(Duration::from_secs(secs));
        assert_eq!(read(59), "59s");
        assert_eq!(read(60), "1m 00s");
        assert_eq!(read(3599), "59m 59s");
        assert_eq!(read(3600), "1h 00m");
        assert_eq!(read(3 * 3600 + 5 * 60 + 9), "3h 05m");
    }

    #[test]
    fn a_command_of_exactly_the_limit_is_shown_whole() {
        let exact = "y".repeat(80);
        let line = process_line("p1", "running", Duration::from_secs(1), &exact);
        assert!(line.ends_with(&exact) && !line.contains('…'), "{line}");
        let longer = "y".repeat(81);
        let line = process_line("p1", "running", Duration::from_secs(1), &longer);
        assert!(line.ends_with(&format!("{}…", "y".repeat(80))), "{line}");
    }

    #[test]
    fn status_reads_well() {
        let text = status_text(&StatusView {
            session_id: "abc".into(),
            history_len: Some(12),
            history_trimmed: 4,
            running_for: Some(Duration::from_secs(125)),
            starting: false,
            queue_depth: 2,
            backend: "echo".into(),
            processes: Some(vec![process_line(
                "p1a2b",
                "running",
                Duration::from_secs(3),
                "sleep  9",
            )]),
            agent_usage: Some(usage_text(
                Some(&AgentUsage {
                    turns: 2,
                    input_tokens: 1200,
                    cached_input_tokens: 300,
                    output_tokens: 45,
                    cost_usd: 0.0123,
                }),
                &AgentUsage {
                    turns: 5,
                    cost_usd: 0.5,
                    ..AgentUsage::default()
                },
            )),
            model: Some("big".into()),
            next_job: Some("Next job: #3 tomorrow 09:00 UTC — remind: x".into()),
        });
        assert!(
            text.contains("\nNext job: #3 tomorrow 09:00 UTC — remind: x\nHistory"),
            "{text}"
        );
        assert!(text.contains("Session: abc"));
        assert!(text.contains("busy (running for 2m 05s)"));
        assert!(text.contains("Queued messages: 2"));
        assert!(text.contains("Backend: echo\nModel: big"));
        assert!(text.contains("History: 12 messages (4 oldest left out"));
        assert!(text.contains("Background processes running: 1\n  p1a2b  running  3s  sleep 9"));
        assert!(
            text.contains(
                "Agent usage: this session 2 turns, 1.5k tokens in (300 cached), 45 out, $0.0123"
            ),
            "{text}"
        );
        assert!(text.contains("all sessions: 5 turns, 0 tokens in (0 cached), 0 out, $0.5000"));
    }
}
