//! Inline buttons, platform-neutral: what a button does when pressed.
//!
//! A reply may carry [`Button`]s (a Stop button on a running turn's preview,
//! Approve/Deny on an approval prompt or one per option an agent offers,
//! one button per model for /model, one per conversation for /sessions).
//! The transport turns them into its own controls; on Telegram each button
//! gets a short random id stored server-side (the 64-byte `callback_data`
//! carries only that id), is bound to the user whose session it acts on,
//! expires, and works once (a press of one button of a prompt uses up the
//! whole row).
//!
//! A press is never trusted to carry what it does: the action is read back
//! from the store by id. Every action is carried out through the same code
//! path as the typed command it stands for (/stop, /approve, /deny, an
//! option's button that of `/approve` choosing that option, /model NAME,
//! /pause ID, /resume ID, /unschedule ID), so a button can never do more
//! than its command.
//!
//! This module owns the action type and its wire format. It must never do
//! I/O: storing and pressing buttons is the transport's job.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What pressing a button does, always on behalf of the session it was
/// shown for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum ButtonAction {
    /// /stop, but only while the turn of this generation still runs; a
    /// press after it ended does nothing ("already finished"). Generations
    /// are unique across restarts, so a button from before a restart
    /// never matches a turn after it (buttons stored by an older telegate
    /// carry generations below every new one).
    Stop {
        /// The generation of the turn the button belongs to.
        generation: u64,
    },
    /// `/approve <ticket>`: this one approval request.
    Approve {
        /// The request's one-time id (the same ticket the prompt shows).
        ticket: String,
    },
    /// `/deny <ticket>`: this one approval request.
    Deny {
        /// The request's one-time id (the same ticket the prompt shows).
        ticket: String,
    },
    /// One option of an approval request that offers more than approve
    /// and deny (an ACP agent's permission request): choose it, like a
    /// typed `/approve <ticket>` would choose the first allowing one.
    Choose {
        /// The request's one-time id (the same ticket the prompt shows).
        ticket: String,
        /// The option's id, as the request named it.
        option: String,
    },
    /// /model NAME.
    Model {
        /// The model to switch to.
        name: String,
    },
    /// `/pause ID`, `/resume ID` or `/unschedule ID` for one scheduled
    /// job (the command checks that the presser made the job or is an
    /// approver).
    Job {
        /// The job.
        id: i64,
        /// What the press does to it.
        change: JobButton,
    },
    /// /resume ID: make this earlier conversation of the chat current.
    Resume {
        /// The session id.
        session: String,
    },
    /// `/merge` or `/discard` of one conversation's git worktree,
    /// confirmed (only while that conversation is still the slot's).
    Worktree {
        /// Merge into the base, or throw away.
        change: WorktreeButton,
        /// The session whose worktree it is.
        session: String,
        /// The confirmation only this button carries (`/merge confirm ID`
        /// typed by hand has none, and is asked again).
        #[serde(default)]
        token: String,
    },
}

/// What a worktree's confirmation button does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorktreeButton {
    /// `/merge`: the session's branch into the base.
    Merge,
    /// `/discard`: the worktree and its branch removed.
    Discard,
}

impl WorktreeButton {
    /// The command it confirms.
    pub fn command(self) -> &'static str {
        match self {
            WorktreeButton::Merge => "merge",
            WorktreeButton::Discard => "discard",
        }
    }
}

/// What a job's button does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobButton {
    /// `/pause ID`
    Pause,
    /// `/resume ID`
    Resume,
    /// `/unschedule ID`
    Delete,
}

impl JobButton {
    /// The command a press stands for.
    pub fn command(self, id: i64) -> String {
        match self {
            JobButton::Pause => format!("/pause {id}"),
            JobButton::Resume => format!("/resume {id}"),
            JobButton::Delete => format!("/unschedule {id}"),
        }
    }
}

impl ButtonAction {
    /// The approval request it answers, if it answers one.
    pub fn ticket(&self) -> Option<&str> {
        match self {
            ButtonAction::Approve { ticket }
            | ButtonAction::Deny { ticket }
            | ButtonAction::Choose { ticket, .. } => Some(ticket),
            _ => None,
        }
    }

    /// How long a button stays pressable. A Stop button lives as long as a
    /// turn may; the others belong to a prompt that is soon out of date.
    pub fn lifetime(&self) -> Duration {
        match self {
            ButtonAction::Stop { .. } => Duration::from_secs(24 * 3600),
            ButtonAction::Approve { .. }
            | ButtonAction::Deny { .. }
            | ButtonAction::Choose { .. } => Duration::from_secs(3600),
            ButtonAction::Model { .. }
            | ButtonAction::Resume { .. }
            | ButtonAction::Worktree { .. } => Duration::from_secs(600),
            ButtonAction::Job { .. } => Duration::from_secs(7 * 24 * 3600),
        }
    }

    /// The buttons that are used up together: a job's buttons are used
    /// apart from another job's (one line each); `None`: the whole reply's
    /// buttons are one row.
    pub fn row_group(&self) -> Option<i64> {
        match self {
            ButtonAction::Job { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// One button: its label and what it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Button {
    /// What the user sees.
    pub label: String,
    /// What a press does.
    pub action: ButtonAction,
}

impl Button {
    /// A button.
    pub fn new(label: impl Into<String>, action: ButtonAction) -> Self {
        Button {
            label: label.into(),
            action,
        }
    }

    /// The Stop button of the turn of `generation`.
    pub fn stop(generation: u64) -> Self {
        Button::new("⏹ Stop", ButtonAction::Stop { generation })
    }

    /// The buttons of a job in a list or a reply: Pause (or Resume) and
    /// Delete.
    pub fn job_pair(id: i64, paused: bool) -> Vec<Button> {
        let first = if paused {
            Button::new(
                format!("▶️ Resume {id}"),
                ButtonAction::Job {
                    id,
                    change: JobButton::Resume,
                },
            )
        } else {
            Button::new(
                format!("⏸ Pause {id}"),
                ButtonAction::Job {
                    id,
                    change: JobButton::Pause,
                },
            )
        };
        vec![
            first,
            Button::new(
                format!("🗑 Delete {id}"),
                ButtonAction::Job {
                    id,
                    change: JobButton::Delete,
                },
            ),
        ]
    }

    /// Approve and Deny for the approval request with one-time id `ticket`.
    pub fn approval_pair(ticket: &str) -> Vec<Button> {
        vec![
            Button::new(
                "✅ Approve",
                ButtonAction::Approve {
                    ticket: ticket.to_string(),
                },
            ),
            Button::new(
                "🚫 Deny",
                ButtonAction::Deny {
                    ticket: ticket.to_string(),
                },
            ),
        ]
    }
}

impl Button {
    /// One button per option of the approval request `ticket`: Approve and
    /// Deny for the two-option case, else a button choosing each option
    /// (`options`: id, label and whether it allows).
    pub fn approval_choices(ticket: &str, options: &[(String, String, bool)]) -> Vec<Button> {
        let plain = options.len() == 2
            && options[0].0 == "approve"
            && options[0].2
            && options[1].0 == "deny"
            && !options[1].2;
        if plain {
            return Button::approval_pair(ticket);
        }
        options
            .iter()
            .map(|(id, label, _)| {
                Button::new(
                    label.clone(),
                    ButtonAction::Choose {
                        ticket: ticket.to_string(),
                        option: id.clone(),
                    },
                )
            })
            .collect()
    }
}

/// A fresh button id: 12 characters from `[0-9a-z]`, random per process
/// and distinct within it (well inside Telegram's 64-byte `callback_data`).
pub fn new_button_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let mut value = hasher.finish();
    let mut id = String::with_capacity(12);
    for _ in 0..12 {
        let digit = (value % 36) as u32;
        value /= 36;
        id.push(char::from_digit(digit, 36).unwrap_or('0'));
    }
    id
}

/// The `callback_data` of a button id (prefixed, so presses of buttons
/// from another bot version are recognised as foreign).
pub fn callback_data(id: &str) -> String {
    format!("b:{id}")
}

/// The button id in `callback_data`, if it is one of ours.
pub fn button_id(data: &str) -> Option<&str> {
    data.strip_prefix("b:")
        .filter(|id| !id.is_empty() && id.len() <= 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip_through_json() {
        for action in [
            ButtonAction::Stop { generation: 7 },
            ButtonAction::Approve {
                ticket: "a1b2c3".into(),
            },
            ButtonAction::Deny {
                ticket: "a1b2c3".into(),
            },
            ButtonAction::Choose {
                ticket: "a1b2c3".into(),
                option: "allow-always".into(),
            },
            ButtonAction::Model { name: "m".into() },
            ButtonAction::Job {
                id: 3,
                change: JobButton::Delete,
            },
            ButtonAction::Resume {
                session: "s".into(),
            },
        ] {
            let json = serde_json::to_string(&action).unwrap();
            assert_eq!(serde_json::from_str::<ButtonAction>(&json).unwrap(), action);
        }
    }

    #[test]
    fn ids_are_short_distinct_and_fit_callback_data() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| new_button_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let data = callback_data(id);
            assert!(data.len() <= 64);
            assert_eq!(button_id(&data), Some(id.as_str()));
        }
        assert_eq!(button_id("other"), None);
        assert_eq!(button_id("b:"), None);
    }
}
