//! Wakeups: telling a chat that its background process finished.
//!
//! When a background process started with `notify_on_complete` ends, the
//! registry produces a [`Wakeup`] (command, exit, the tail of the output).
//! The engine turns it into an *internal* event for the owner's chat
//! ([`Wakeup::into_event_checked`]): the adapter starts it as a turn when the chat is
//! idle, or queues it silently behind the running turn (no interrupt, no
//! acknowledgement), and never drops it.
//!
//! **Which session the wakeup turn belongs to.** The process recorded its
//! spawn-time owner session from the task-local turn identity. The chat may
//! have moved on since (`/new`), or — the bug this design learns from —
//! something may have resolved the chat's session from racy global state.
//! [`resolve_wakeup_target`] cross-checks: when the recorded owner positively
//! differs from the session the chat key resolves to now, the owner wins
//! (logged at info level with the reason when the owner is an earlier
//! session of the same chat, i.e. after a legitimate `/new`; at error level
//! only when the records are inconsistent, which means a misroute);
//! when they agree, or the owner is unknown, the resolved session passes
//! through unchanged. The resolver never suppresses a wakeup. The turn then
//! runs against the target session through
//! [`MessageEvent::session_override`], so its history and transcript are the
//! ones of the conversation that started the process, and its text says so
//! when that is not the chat's current session.
//!
//! This module must never drop a wakeup, and never route one by anything
//! but the process record and the session table.

use std::time::Duration;

use super::process::{ExitInfo, ProcessId, ProcessOwner, ProcessRecord};
use crate::vocab::{MessageEvent, SessionId};

/// About this many characters of output go into a wakeup.
pub const WAKEUP_TAIL_CHARS: usize = 2000;

/// A finished background process whose owner must be told.
#[derive(Clone, Debug)]
pub struct Wakeup {
    /// The process as it ended.
    pub process: ProcessRecord,
    /// How it ended.
    pub exit: ExitInfo,
    /// The last lines of its output (at most about [`WAKEUP_TAIL_CHARS`]).
    pub output_tail: String,
}

impl Wakeup {
    /// The wakeup for `process`, which ended as `exit` with `output`.
    pub fn new(process: ProcessRecord, exit: ExitInfo, output: &str) -> Wakeup {
        Wakeup {
            process,
            exit,
            output_tail: output_tail(output, WAKEUP_TAIL_CHARS),
        }
    }

    /// Who started the process (where to deliver the wakeup).
    pub fn owner(&self) -> Option<&ProcessOwner> {
        self.process.owner.as_ref()
    }

    /// The internal event for the owner's chat, given the session the
    /// owner's chat key resolves to now and what the session history says
    /// about the recorded owner session: the event runs against the session
    /// [`resolve_wakeup_target_checked`] picks. `None` without an owner
    /// (such a process cannot ask for a wakeup in the first place).
    pub fn into_event_checked(
        self,
        resolved_session_id: SessionId,
        history: OwnerHistory,
    ) -> Option<MessageEvent> {
        let target = resolve_wakeup_target_checked(
            &self.process.id,
            resolved_session_id.clone(),
            Some(&self.process),
            history,
        );
        let text = self.text(&target, &resolved_session_id);
        let source = self.owner()?.source.clone();
        Some(MessageEvent::internal(source, text).with_session_override(target))
    }

    /// The wakeup turn's text: what ended, how, its output, and (when the
    /// chat has moved on) which session this turn continues.
    pub fn text(&self, target: &SessionId, current: &SessionId) -> String {
        let mut text = format!(
            "[telegate] Background process {} finished: {}, after {}.\nCommand: {}\n",
            self.process.id,
            self.exit.describe(),
            seconds(self.exit.runtime),
            self.process.command
        );
        if target != current {
            text.push_str(&format!(
                "It was started in session {target} of this chat. The chat has moved on to a \
                 new session ({current}) since; this turn continues session {target}, the one \
                 that started the process.\n"
            ));
        }
        if self.output_tail.trim().is_empty() {
            text.push_str("It printed nothing.\n");
        } else {
            let fence = fence_for(&self.output_tail);
            text.push_str(&format!(
                "Last output:\n{fence}\n{}\n{fence}\n",
                self.output_tail.trim_end()
            ));
        }
        text.push_str(
            "This is an automatic notification, not a message from the user. \
             Tell the user what came of it.",
        );
        text
    }
}

/// The session a wakeup for `process_id` must run against.
///
/// `resolved_session_id` is the session the process's chat key resolves to
/// now; `process` is the registry record with the spawn-time owner. If the
/// recorded owner is known and positively differs, the owner is returned
/// and an error logged (after `/new` in the owner chat that is expected;
/// otherwise it is a misroute caught here). If they agree, the owner is
/// unknown (none or empty), or the record is missing, `resolved_session_id`
/// passes through unchanged. Never suppresses a wakeup.
pub fn resolve_wakeup_target(
    process_id: &ProcessId,
    resolved_session_id: SessionId,
    process: Option<&ProcessRecord>,
) -> SessionId {
    resolve_wakeup_target_checked(
        process_id,
        resolved_session_id,
        process,
        OwnerHistory::Unchecked,
    )
}

/// What the session history says about a process's recorded owner session,
/// looked up when it differs from the session its chat key resolves to now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerHistory {
    /// An earlier session of the same chat key: the chat moved on with
    /// `/new` or `/reset` after the process started. A legitimate reroute.
    EarlierSessionOfTheChat,
    /// The session belongs to another chat key (named): the records are
    /// inconsistent.
    OtherChat(String),
    /// The store never issued this session: the records are inconsistent.
    NeverIssued,
    /// Not looked up (no store, or it could not be read).
    Unchecked,
}

/// [`resolve_wakeup_target`], logging a reroute according to `history`:
/// info level, with the reason, after a legitimate `/new`; error level when
/// the records are inconsistent (a misroute caught here); warn level when
/// it could not be checked. The target is the same in every case.
pub fn resolve_wakeup_target_checked(
    process_id: &ProcessId,
    resolved_session_id: SessionId,
    process: Option<&ProcessRecord>,
    history: OwnerHistory,
) -> SessionId {
    let Some(owner) = process.and_then(ProcessRecord::spawn_session_id) else {
        return resolved_session_id;
    };
    if *owner == resolved_session_id {
        return resolved_session_id;
    }
    match history {
        OwnerHistory::EarlierSessionOfTheChat => tracing::info!(
            process = %process_id,
            owner_session = %owner,
            resolved_session = %resolved_session_id,
            reason = "the chat started a new session (/new or /reset) after the process started",
            "wakeup rerouted to the session that spawned the process"
        ),
        OwnerHistory::OtherChat(key) => tracing::error!(
            process = %process_id,
            owner_session = %owner,
            owner_session_key = %key,
            resolved_session = %resolved_session_id,
            "wakeup target mismatch: the spawning session belongs to another chat (a misroute); \
             waking the recorded owner"
        ),
        OwnerHistory::NeverIssued => tracing::error!(
            process = %process_id,
            owner_session = %owner,
            resolved_session = %resolved_session_id,
            "wakeup target mismatch: the spawning session was never issued (a misroute); \
             waking the recorded owner"
        ),
        OwnerHistory::Unchecked => tracing::warn!(
            process = %process_id,
            owner_session = %owner,
            resolved_session = %resolved_session_id,
            "wakeup target differs from the chat's current session (expected after /new; \
             not checked against the session history); waking the owner"
        ),
    }
    owner.clone()
}

/// The last `max_chars` characters of `text`, starting at a line boundary
/// when the cut falls inside a line (unless that would leave nothing).
pub fn output_tail(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        return text.to_string();
    }
    let start = text
        .char_indices()
        .nth(count - max_chars)
        .map_or(text.len(), |(i, _)| i);
    let tail = &text[start..];
    let at_line_start = text[..start].ends_with('\n');
    match tail.find('\n') {
        Some(newline) if !at_line_start && newline + 1 < tail.len() => {
            tail[newline + 1..].to_string()
        }
        _ => tail.to_string(),
    }
}

/// A Markdown code fence longer than any backtick run in `text`.
fn fence_for(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_starts_at_a_line_boundary() {
        let text = "first line\nsecond line\nthird\n";
        assert_eq!(output_tail(text, 100), text);
        // 12 chars: "e\nthird\n" would cut "second line" mid-line.
        assert_eq!(output_tail(text, 12), "third\n");
        // A single long line keeps its end.
        assert_eq!(output_tail("abcdefgh", 3), "fgh");
        assert_eq!(output_tail("héllo\nwörld", 5), "wörld");
    }

    #[test]
    fn a_tail_that_starts_a_line_is_kept_whole() {
        // The cut falls exactly after a newline: nothing to trim.
        assert_eq!(output_tail("ab\ncd\nef", 5), "cd\nef");
        // The tail's only newline is its last character: trimming up to it
        // would leave nothing, so the tail is kept.
        assert_eq!(output_tail("abcdef\n", 3), "ef\n");
    }

    #[test]
    fn runtimes_read_in_seconds() {
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(seconds(Duration::ZERO), "0.0 s");
    }

    #[test]
    fn fences_outgrow_backticks() {
        assert_eq!(fence_for("x"), "```");
        assert_eq!(fence_for("a ```` b"), "`````");
    }
}
