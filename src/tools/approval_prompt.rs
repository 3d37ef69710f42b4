//! The texts an approval request shows in the chat.
//!
//! The prompt shows the *whole* command, however long (delivery splits a
//! long notice over several messages, in order), and every dangerous
//! pattern it matched, so that `/approve` never runs a part nobody saw. It
//! names the request's one-time id, which binds an answer to exactly this
//! command: an answer carrying another id can never approve a command that
//! replaced it.
//!
//! An agent's permission request (options beyond approve / deny) shows
//! the tool, its whole input and every option the same way
//! ([`options_request_text`]).
//!
//! This module owns the wording only (pure functions). It must never cut
//! the command or the input shown in a request.

use std::time::Duration;

use super::approval_options::{Answerer, ApprovalOption, Decision, Denial};

/// The approval request: header, the whole command, how to answer.
pub fn request_text(ticket: &str, command: &str, reason: &str, timeout: Duration) -> String {
    let length = command.chars().count();
    format!(
        "⚠️ Approval {ticket}: the agent wants to run this command ({length} characters, shown \
         in full), and {reason}:\n\n{command}\n\n\
         Reply /approve {ticket} to run it or /deny {ticket} to refuse (a bare /approve, /deny, \
         yes or no work too while it is the only request waiting). Only the user whose message \
         started this task, or an approver, can answer. Without an answer within {} it is \
         refused.",
        timeout_text(timeout)
    )
}

/// The prompt of a request that offers `options` (an agent's permission
/// request): who asks to do what (`title`), its `input` in full (it may
/// be empty), the options, how to answer.
pub fn options_request_text(
    ticket: &str,
    asker: &str,
    title: &str,
    input: &str,
    options: &[ApprovalOption],
    timeout: Duration,
) -> String {
    let mut text = format!("⚠️ Permission {ticket}: {asker} asks to use a tool: {title}");
    if !input.trim().is_empty() {
        let length = input.chars().count();
        text.push_str(&format!(
            "\n\nIts input ({length} characters, shown in full):\n{input}"
        ));
    }
    let labels: Vec<String> = options
        .iter()
        .map(|o| format!("{} {}", o.kind.emoji(), o.label))
        .collect();
    let first = |allows: bool| {
        options
            .iter()
            .find(|o| o.kind.allows() == allows)
            .map(|o| o.label.clone())
    };
    let approve = match first(true) {
        Some(label) => format!("/approve {ticket} ({label})"),
        None => "no /approve (nothing here allows it)".to_string(),
    };
    let deny = format!(
        "/deny {ticket} ({})",
        first(false).unwrap_or_else(|| "refuse".to_string())
    );
    text.push_str(&format!(
        "\n\nChoose: {}. Or reply {approve} or {deny} (a bare /approve, /deny, yes or no \
         work too while it is the only request waiting). Only the user whose message started \
         this task, or an approver, can answer. Without an answer within {} it is refused.",
        labels.join(", "),
        timeout_text(timeout)
    ));
    text
}

/// `HH:MM` of the Unix time `ms`, in UTC.
pub fn clock_utc(ms: i64) -> String {
    let minutes = ms.div_euclid(60_000).rem_euclid(24 * 60);
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

/// The line added to a prompt once `who` chose `option` (`None`: refused
/// without one) at `at` (`HH:MM`): Approved / Denied for the two-option
/// case, the option's label otherwise.
pub fn chosen_line(option: Option<&ApprovalOption>, who: &str, at: &str) -> String {
    match option {
        Some(o) if o.id == ApprovalOption::APPROVE && o.kind.allows() => {
            format!("✅ Approved by {who} ({at} UTC).")
        }
        Some(o) if o.id == ApprovalOption::DENY && !o.kind.allows() => {
            format!("🚫 Denied by {who} ({at} UTC).")
        }
        Some(o) => format!(
            "{} {} — chosen by {who} ({at} UTC).",
            o.kind.emoji(),
            o.label
        ),
        None => format!("🚫 Denied by {who} ({at} UTC)."),
    }
}

/// The line added to a prompt when its request ended by `decision` (of
/// `by`, if someone answered) at Unix time `at_ms`.
pub fn settled_line(decision: &Decision, by: Option<&Answerer>, at_ms: i64) -> String {
    let at = clock_utc(at_ms);
    let who = by
        .and_then(|a| {
            a.name
                .clone()
                .or_else(|| a.user_id.map(|id| format!("user {id}")))
        })
        .unwrap_or_else(|| "someone".to_string());
    match decision {
        Decision::Chosen(option) => chosen_line(Some(option), &who, &at),
        Decision::Denied(Denial::ByUser) => chosen_line(None, &who, &at),
        Decision::Denied(Denial::TimedOut) => format!("⌛ No answer in time: refused ({at} UTC)."),
        Decision::Denied(Denial::Superseded) => {
            format!("Replaced by a newer request: refused ({at} UTC).")
        }
        Decision::Denied(Denial::Stopped | Denial::NoChat) => {
            format!("⏹ Refused: the task was stopped ({at} UTC).")
        }
    }
}

/// Told when a request timed out.
pub fn timeout_text_for(ticket: &str, command: &str) -> String {
    format!(
        "⌛ No answer in time, so approval {ticket} was refused and this was not run:\n{}",
        preview(command)
    )
}

/// The start of a command, for confirmations (the request showed it all).
pub fn preview(command: &str) -> String {
    const MAX: usize = 200;
    if command.chars().count() <= MAX {
        return command.to_string();
    }
    let cut: String = command.chars().take(MAX).collect();
    format!("{cut}… (shown in full in the request)")
}

fn timeout_text(timeout: Duration) -> String {
    let secs = timeout.as_secs();
    match secs {
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s if s >= 60 => format!("{} min {} s", s / 60, s % 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_command_and_the_id_are_shown() {
        let tail = "rm -rf /important";
        let command = format!("echo {}; {tail}", "x".repeat(5000));
        let text = request_text("a1b2c3", &command, "why", Duration::from_secs(300));
        assert!(text.contains(&command), "the whole command is shown");
        assert!(text.contains("/approve a1b2c3") && text.contains("5 min"));
    }

    #[test]
    fn how_a_request_ended_is_one_line() {
        let ann = Answerer {
            user_id: Some(1),
            name: Some("Ann".into()),
            pressed: false,
        };
        let at = 13 * 3_600_000 + 5 * 60_000 + 999;
        let pair = ApprovalOption::approve_deny();
        assert_eq!(
            settled_line(&Decision::Chosen(pair[0].clone()), Some(&ann), at),
            "✅ Approved by Ann (13:05 UTC)."
        );
        assert_eq!(
            settled_line(&Decision::Chosen(pair[1].clone()), Some(&ann), at),
            "🚫 Denied by Ann (13:05 UTC)."
        );
        let always = ApprovalOption {
            id: "a".into(),
            label: "Always allow".into(),
            kind: crate::tools::approval_options::OptionKind::AllowAlways,
        };
        assert_eq!(
            settled_line(&Decision::Chosen(always), Some(&ann), at),
            "☑️ Always allow — chosen by Ann (13:05 UTC)."
        );
        assert!(settled_line(&Decision::Denied(Denial::TimedOut), None, at)
            .contains("No answer in time"));
        assert!(settled_line(&Decision::Denied(Denial::Stopped), None, at).contains("stopped"));
        assert_eq!(clock_utc(-1), "23:59");
    }

    #[test]
    fn an_option_request_shows_its_input_and_every_option() {
        use crate::tools::approval_options::OptionKind;
        let options = vec![
            ApprovalOption {
                id: "a".into(),
                label: "Allow always".into(),
                kind: OptionKind::AllowAlways,
            },
            ApprovalOption {
                id: "r".into(),
                label: "Reject".into(),
                kind: OptionKind::RejectOnce,
            },
        ];
        let input = format!("{{\"path\": \"{}\"}}", "p".repeat(5000));
        let text = options_request_text(
            "a1b2c3",
            "gemini",
            "Write notes.txt",
            &input,
            &options,
            Duration::from_secs(90),
        );
        assert!(text.contains(&input), "the whole input is shown");
        assert!(text.contains("Write notes.txt") && text.contains("gemini"));
        assert!(text.contains("☑️ Allow always") && text.contains("🚫 Reject"));
        assert!(text.contains("/approve a1b2c3 (Allow always)"));
        assert!(text.contains("/deny a1b2c3 (Reject)") && text.contains("1 min 30 s"));
    }
}
