//! The texts an approval request shows in the chat.
//!
//! The prompt shows the *whole* command, however long (delivery splits a
//! long notice over several messages, in order), and every dangerous
//! pattern it matched, so that `/approve` never runs a part nobody saw. It
//! names the request's one-time id, which binds an answer to exactly this
//! command: an answer carrying another id can never approve a command that
//! replaced it.
//!
//! This module owns the wording only (pure functions). It must never cut
//! the command shown in a request.

use std::time::Duration;

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
}
