//! The words of an approval request, shared by the gate that holds it,
//! the text that shows it and the events that carry it: the options a
//! request offers ([`ApprovalOption`], [`OptionKind`]), what an answer
//! picks ([`Choice`]) and who gave it ([`Answerer`]), how a request ended
//! ([`Decision`], [`Decided`], [`Denial`], [`Verdict`]).
//!
//! This module owns these types (plain data). It must never hold a
//! request or decide one: that is [`super::approval_gate`].

use serde::{Deserialize, Serialize};

use crate::vocab::SessionSource;

/// Why a request was refused without anybody choosing. The text is what
/// the terminal tool's model reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// The user said no.
    #[error("denied by the user; the command was not run")]
    ByUser,
    /// Nobody answered in time.
    #[error("approval timed out; the command was not run")]
    TimedOut,
    /// /stop, /new or /reset, or the turn ended.
    #[error("denied: the task was stopped; the command was not run")]
    Stopped,
    /// A newer approval request replaced this one.
    #[error("denied: another approval request replaced this one; the command was not run")]
    Superseded,
    /// There is no chat to ask (the call runs outside any turn).
    #[error("this command needs approval, but there is no chat to ask; it was not run")]
    NoChat,
}

impl Denial {
    /// The name recorded in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Denial::ByUser => "denied",
            Denial::TimedOut => "timed_out",
            Denial::Stopped => "stopped",
            Denial::Superseded => "superseded",
            Denial::NoChat => "no_chat",
        }
    }
}

/// The answer to a two-option (approve / deny) request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Approved,
    /// Do not.
    Denied(Denial),
}

/// What choosing an option means (ACP's `PermissionOptionKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    /// Allow this once.
    AllowOnce,
    /// Allow this and remember it.
    AllowAlways,
    /// Refuse this once.
    RejectOnce,
    /// Refuse this and remember it.
    RejectAlways,
}

impl OptionKind {
    /// True for the allowing kinds.
    pub fn allows(self) -> bool {
        matches!(self, OptionKind::AllowOnce | OptionKind::AllowAlways)
    }

    /// The name recorded in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            OptionKind::AllowOnce => "allow_once",
            OptionKind::AllowAlways => "allow_always",
            OptionKind::RejectOnce => "reject_once",
            OptionKind::RejectAlways => "reject_always",
        }
    }

    /// The mark shown before the option's label.
    pub fn emoji(self) -> &'static str {
        match self {
            OptionKind::AllowOnce => "✅",
            OptionKind::AllowAlways => "☑️",
            OptionKind::RejectOnce => "🚫",
            OptionKind::RejectAlways => "⛔",
        }
    }
}

/// One answer a request offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalOption {
    /// The id the asker knows it by (ACP's `optionId`).
    pub id: String,
    /// What the user sees.
    pub label: String,
    /// What it means.
    pub kind: OptionKind,
}

impl ApprovalOption {
    /// The id of the approving option of the two-option case.
    pub const APPROVE: &'static str = "approve";
    /// The id of the denying option of the two-option case.
    pub const DENY: &'static str = "deny";

    /// The two-option case the terminal tool asks with.
    pub fn approve_deny() -> Vec<ApprovalOption> {
        vec![
            ApprovalOption {
                id: Self::APPROVE.to_string(),
                label: "Approve".to_string(),
                kind: OptionKind::AllowOnce,
            },
            ApprovalOption {
                id: Self::DENY.to_string(),
                label: "Deny".to_string(),
                kind: OptionKind::RejectOnce,
            },
        ]
    }

    /// True when `options` are exactly the two-option case.
    pub fn is_approve_deny(options: &[ApprovalOption]) -> bool {
        options == Self::approve_deny().as_slice()
    }
}

/// What a chat is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// What asks, in one piece the answers repeat (the command; the tool
    /// and its title): shown in confirmations, recorded.
    pub subject: String,
    /// The prompt shown in the chat (the subject's input in full).
    pub text: String,
    /// The answers offered (at least one).
    pub options: Vec<ApprovalOption>,
}

/// How a request ended for the one that asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The user chose this option.
    Chosen(ApprovalOption),
    /// Refused without an option chosen (also `/deny` on a request that
    /// offers no rejecting option).
    Denied(Denial),
}

impl Decision {
    /// The two-option reading: an allowing option approves.
    pub fn verdict(&self) -> Verdict {
        match self {
            Decision::Chosen(option) if option.kind.allows() => Verdict::Approved,
            Decision::Chosen(_) => Verdict::Denied(Denial::ByUser),
            Decision::Denied(denial) => Verdict::Denied(*denial),
        }
    }
}

/// What an answer picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The first allowing option (`/approve`, yes).
    Allow,
    /// The first rejecting option, or a plain refusal when there is none
    /// (`/deny`, no).
    Reject,
    /// The option with this id (a button).
    Option(String),
}

impl Choice {
    /// `/approve` or `/deny`.
    pub fn of(approve: bool) -> Choice {
        if approve {
            Choice::Allow
        } else {
            Choice::Reject
        }
    }
}

/// A request that was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// What it asked about.
    pub subject: String,
    /// The option chosen (`None`: refused, the request offered no
    /// rejecting option).
    pub option: Option<ApprovalOption>,
    /// The request was the two-option case.
    pub approve_deny: bool,
}

impl Decided {
    /// True when what was chosen allows.
    pub fn allowed(&self) -> bool {
        self.option.as_ref().is_some_and(|o| o.kind.allows())
    }
}

/// Why an answer decided nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotDecided {
    /// That request no longer waits (answered, timed out or replaced).
    NotWaiting,
    /// It waits, but offers nothing of that kind (an `/approve` where no
    /// option allows, or an option id it does not have).
    NoSuchOption,
}

/// Who answered (for the record).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answerer {
    /// Their user id.
    pub user_id: Option<u64>,
    /// Their display name.
    pub name: Option<String>,
    /// By a button of the prompt (whose press edits the prompt itself).
    pub pressed: bool,
}

impl Answerer {
    /// The sender of `source`, typing an answer.
    pub fn of(source: &SessionSource) -> Answerer {
        Answerer {
            user_id: source.user_id,
            name: source.user_name.clone(),
            pressed: false,
        }
    }

    /// The presser of a button, as `source`.
    pub fn pressing(source: &SessionSource) -> Answerer {
        Answerer {
            pressed: true,
            ..Answerer::of(source)
        }
    }
}
