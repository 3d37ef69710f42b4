//! Pending approvals: a turn that needs the user's permission waits here
//! for an answer from the chat.
//!
//! Every agent's approvals go through this one gate and look and behave the
//! same: the terminal tool's dangerous commands, and the permission
//! requests of an ACP agent (`session/request_permission`). A request
//! carries a list of options ([`ApprovalOption`]: an id, a label and what
//! choosing it means, [`OptionKind`]); the terminal tool asks with the
//! two-option case (approve / deny, [`ApprovalOption::approve_deny`]), an
//! ACP agent with the options it offers (allow once, allow always,
//! reject…). The prompt goes out as a [`ToolEvent::Approval`] carrying a
//! one-time ticket and the options, shown as buttons; `/approve` and
//! `/deny` (and a bare yes / no) pick the first allowing or the first
//! rejecting option.
//!
//! Who may answer is the runner's question (`authority::may_decide`);
//! this gate only matches an answer to the request its ticket names. A
//! timeout refuses; `/stop`, `/new` and `/reset` refuse everything pending
//! for the slot ([`ApprovalGate::deny_all`]); a newer request of the same
//! slot replaces (refuses) the older one. Every way a request ends is
//! recorded in the store once the engine attached one
//! ([`ApprovalGate::record_in`]): who chose which option, when, or why
//! nobody did.
//!
//! This module owns the pending requests and their answers. It must never
//! run anything itself, decide who may answer, or let a pending request
//! outlive the call that waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use super::approval_options::{
    Answerer, ApprovalOption, ApprovalRequest, Choice, Decided, Decision, Denial, NotDecided,
    OptionKind, Verdict,
};
use super::approval_prompt::{request_text, settled_line, timeout_text_for};
use super::events::{ToolEvent, ToolEventSender};
use super::process::ProcessOwner;
use crate::store::{now_ms, ApprovalRecord, Approvals};
use crate::vocab::{Progress, SessionKey, SessionSource};

/// How often a waiting approval tells the stall watchdog it is alive.
const ALIVE_PING: Duration = Duration::from_secs(2);

/// At most this many characters of a request's subject are recorded.
const RECORDED_SUBJECT_CHARS: usize = 2000;

struct PendingApproval {
    id: u64,
    /// The one-time id shown in the request (`/approve <ticket>`).
    ticket: String,
    subject: String,
    options: Vec<ApprovalOption>,
    /// Who started the turn that asks, and where.
    owner: SessionSource,
    /// Unix ms when it was asked.
    asked_at: i64,
    answer: oneshot::Sender<Decision>,
}

/// A pending request as the runner sees it (to check who may answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingView {
    /// The slot whose turn waits.
    pub key: SessionKey,
    /// The one-time id.
    pub ticket: String,
    /// What it asks about, in full (the command).
    pub command: String,
    /// The user whose message started the turn.
    pub started_by: Option<u64>,
    /// Their display name, if known.
    pub started_by_name: Option<String>,
    /// The answers it offers.
    pub options: Vec<ApprovalOption>,
}

/// What an answer in a chat refers to (see [`ApprovalGate::lookup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// This request.
    Found(PendingView),
    /// The id names no request waiting in this chat (answered, timed out,
    /// or replaced).
    NoSuchTicket,
    /// A bare answer, but several requests wait in this chat: their ids.
    Several(Vec<String>),
    /// Nothing waits in this chat.
    Nothing,
}

struct GateInner {
    pending: Mutex<HashMap<SessionKey, PendingApproval>>,
    timeout: Duration,
    events: ToolEventSender,
    next_id: AtomicU64,
    /// Where every decision is recorded (once the engine attached it).
    store: OnceLock<Approvals>,
}

/// Pending approvals, one per chat slot at most (a slot runs one turn, and
/// a turn waits for one answer at a time). Cheap to clone; clones share
/// state.
#[derive(Clone)]
pub struct ApprovalGate {
    inner: Arc<GateInner>,
}

impl std::fmt::Debug for ApprovalGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalGate")
            .field("timeout", &self.inner.timeout)
            .field("pending", &self.pending().len())
            .finish()
    }
}

impl ApprovalGate {
    /// A gate whose requests time out after `timeout` and whose notices go
    /// to `events`.
    pub fn new(timeout: Duration, events: ToolEventSender) -> ApprovalGate {
        ApprovalGate {
            inner: Arc::new(GateInner {
                pending: Mutex::new(HashMap::new()),
                timeout,
                events,
                next_id: AtomicU64::new(1),
                store: OnceLock::new(),
            }),
        }
    }

    /// Record every decision in `store` from now on (the first store wins).
    pub fn record_in(&self, store: &Approvals) {
        let _ = self.inner.store.set(store.clone());
    }

    /// How long a request waits for an answer.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<SessionKey, PendingApproval>> {
        // Inserts and removes only: a poisoned lock is consistent.
        self.inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ask `owner`'s chat to approve `command` (needed because of
    /// `reason`) and wait for the answer, the timeout, or `cancel`.
    /// `progress` is pinged while waiting so the stall watchdog does not
    /// stop the turn. If this future is dropped, the request is withdrawn.
    pub async fn ask(
        &self,
        owner: &ProcessOwner,
        command: &str,
        reason: &str,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Verdict {
        let timeout = self.inner.timeout;
        let request = ApprovalRequest {
            subject: command.to_string(),
            text: String::new(),
            options: ApprovalOption::approve_deny(),
        };
        self.ask_with(
            &owner.session_key,
            &owner.source,
            request,
            |ticket| request_text(ticket, command, reason, timeout),
            cancel,
            progress,
        )
        .await
        .verdict()
    }

    /// Ask the chat of `source` (the turn of slot `key`) `request` and
    /// wait for the option chosen, the timeout, or `cancel` (see
    /// [`ApprovalGate::ask`]). `request.text` is the prompt; it should
    /// name the ticket, which [`ApprovalGate::ask_request_with`] lets it.
    pub async fn ask_request(
        &self,
        key: &SessionKey,
        source: &SessionSource,
        request: ApprovalRequest,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Decision {
        let text = request.text.clone();
        self.ask_with(key, source, request, |_| text, cancel, progress)
            .await
    }

    /// [`ApprovalGate::ask_request`] whose prompt is written once the
    /// ticket is known.
    pub async fn ask_request_with(
        &self,
        key: &SessionKey,
        source: &SessionSource,
        request: ApprovalRequest,
        prompt: impl FnOnce(&str) -> String,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Decision {
        self.ask_with(key, source, request, prompt, cancel, progress)
            .await
    }

    async fn ask_with(
        &self,
        key: &SessionKey,
        source: &SessionSource,
        request: ApprovalRequest,
        prompt: impl FnOnce(&str) -> String,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Decision {
        if request.options.is_empty() {
            return Decision::Denied(Denial::ByUser);
        }
        let (answer, mut answered) = oneshot::channel();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let ticket;
        let replaced = {
            let mut pending = self.pending();
            ticket = new_ticket(|t| pending.values().any(|p| p.ticket == t));
            pending.insert(
                key.clone(),
                PendingApproval {
                    id,
                    ticket: ticket.clone(),
                    subject: request.subject.clone(),
                    options: request.options.clone(),
                    owner: source.clone(),
                    asked_at: now_ms(),
                    answer,
                },
            )
        };
        if let Some(old) = replaced {
            self.settle(key, old, Decision::Denied(Denial::Superseded), None);
        }
        let _withdraw = Withdraw {
            gate: self.clone(),
            key: key.clone(),
            id,
        };
        tracing::info!(session_key = %key, %ticket, "a request waits for the user's approval");
        self.inner.events.send(ToolEvent::Approval {
            to: source.clone(),
            ticket: ticket.clone(),
            text: prompt(&ticket),
            options: request.options.clone(),
        });
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        loop {
            tokio::select! {
                biased;
                decision = &mut answered => {
                    return decision.unwrap_or(Decision::Denied(Denial::Stopped));
                }
                () = cancel.cancelled() => {
                    if let Some(pending) = self.take(key, id) {
                        self.settle(key, pending, Decision::Denied(Denial::Stopped), None);
                    }
                    return Decision::Denied(Denial::Stopped);
                }
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(session_key = %key, "approval timed out");
                    if let Some(pending) = self.take(key, id) {
                        self.settle(key, pending, Decision::Denied(Denial::TimedOut), None);
                    }
                    self.inner.events.send(ToolEvent::Notice {
                        to: source.clone(),
                        text: timeout_text_for(&ticket, &request.subject),
                    });
                    return Decision::Denied(Denial::TimedOut);
                }
                () = tokio::time::sleep(ALIVE_PING) => progress.still_working(),
            }
        }
    }

    /// The request `id` of `key`, taken out if it is still the one
    /// waiting there.
    fn take(&self, key: &SessionKey, id: u64) -> Option<PendingApproval> {
        let mut pending = self.pending();
        if pending.get(key).is_some_and(|p| p.id == id) {
            pending.remove(key)
        } else {
            None
        }
    }

    /// End `pending` with `decision`: the waiting call gets it (it may
    /// have just been dropped: then nothing runs) and it is recorded.
    fn settle(
        &self,
        key: &SessionKey,
        pending: PendingApproval,
        decision: Decision,
        by: Option<&Answerer>,
    ) {
        tracing::info!(session_key = %key, ticket = pending.ticket, ?decision, "approval settled");
        if let Some(store) = self.inner.store.get() {
            let (outcome, option) = match &decision {
                Decision::Chosen(option) => ("chosen", Some(option.clone())),
                Decision::Denied(denial) => (denial.as_str(), None),
            };
            let record = ApprovalRecord {
                ticket: pending.ticket.clone(),
                session_key: key.as_str().to_string(),
                chat_id: pending.owner.chat_id,
                subject: pending
                    .subject
                    .chars()
                    .take(RECORDED_SUBJECT_CHARS)
                    .collect(),
                outcome: outcome.to_string(),
                option_id: option.as_ref().map(|o| o.id.clone()),
                option_label: option.as_ref().map(|o| o.label.clone()),
                option_kind: option.as_ref().map(|o| o.kind.as_str().to_string()),
                decided_by: by.and_then(|a| a.user_id),
                decided_by_name: by.and_then(|a| a.name.clone()),
                asked_at: pending.asked_at,
                decided_at: now_ms(),
            };
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let store = store.clone();
                runtime.spawn(async move {
                    if let Err(error) = store.record_approval(record).await {
                        tracing::error!(%error, "could not record an approval decision");
                    }
                });
            }
        }
        if !by.is_some_and(|a| a.pressed) {
            self.inner.events.send(ToolEvent::Settled {
                to: pending.owner.clone(),
                ticket: pending.ticket.clone(),
                line: settled_line(&decision, by, now_ms()),
            });
        }
        let _ = pending.answer.send(decision);
    }

    /// Answer the request `ticket` pending for `key` (any request of
    /// `key` without a ticket) with `choice`, on behalf of `by`. A request
    /// that replaced it in the meantime is left waiting.
    pub fn decide(
        &self,
        key: &SessionKey,
        ticket: Option<&str>,
        choice: &Choice,
        by: &Answerer,
    ) -> Result<Decided, NotDecided> {
        let (pending, option) = {
            let mut pending = self.pending();
            let Some(waiting) = pending.get(key) else {
                return Err(NotDecided::NotWaiting);
            };
            if ticket.is_some_and(|t| !waiting.ticket.eq_ignore_ascii_case(t)) {
                return Err(NotDecided::NotWaiting);
            }
            let option = match choice {
                Choice::Allow => Some(
                    waiting
                        .options
                        .iter()
                        .find(|o| o.kind.allows())
                        .ok_or(NotDecided::NoSuchOption)?,
                ),
                Choice::Reject => waiting.options.iter().find(|o| !o.kind.allows()),
                Choice::Option(id) => Some(
                    waiting
                        .options
                        .iter()
                        .find(|o| o.id == *id)
                        .ok_or(NotDecided::NoSuchOption)?,
                ),
            }
            .cloned();
            let Some(taken) = pending.remove(key) else {
                return Err(NotDecided::NotWaiting);
            };
            (taken, option)
        };
        let decided = Decided {
            subject: pending.subject.clone(),
            option: option.clone(),
            approve_deny: ApprovalOption::is_approve_deny(&pending.options),
        };
        let decision = match option {
            Some(option) => Decision::Chosen(option),
            None => Decision::Denied(Denial::ByUser),
        };
        self.settle(key, pending, decision, Some(by));
        Ok(decided)
    }

    /// Answer the approval pending for `key`: run it (`approve`) or not.
    /// Returns the command that was decided, or `None` if nothing waited.
    pub fn answer(&self, key: &SessionKey, approve: bool) -> Option<String> {
        self.decide(key, None, &Choice::of(approve), &Answerer::default())
            .ok()
            .map(|d| d.subject)
    }

    /// Answer the request `ticket` pending for `key`, and only that one: a
    /// request that replaced it in the meantime is left waiting. Returns
    /// the command decided, or `None` if `ticket` no longer waits there.
    pub fn answer_ticket(&self, key: &SessionKey, ticket: &str, approve: bool) -> Option<String> {
        self.decide(
            key,
            Some(ticket),
            &Choice::of(approve),
            &Answerer::default(),
        )
        .ok()
        .map(|d| d.subject)
    }

    /// The request waiting for `key`'s turn, if any.
    pub fn pending_view(&self, key: &SessionKey) -> Option<PendingView> {
        self.pending().get(key).map(|p| view(key, p))
    }

    /// Which request an answer sent in `slot` (of chat `chat_id`) refers
    /// to: the one named by `ticket` among the chat's requests; without a
    /// ticket, the slot's own request, else the chat's only one.
    pub fn lookup(&self, slot: &SessionKey, chat_id: i64, ticket: Option<&str>) -> Lookup {
        let pending = self.pending();
        let mut in_chat = pending
            .iter()
            .filter(|(_, p)| p.owner.chat_id == chat_id)
            .map(|(key, p)| view(key, p));
        match ticket {
            Some(ticket) => in_chat
                .find(|v| v.ticket.eq_ignore_ascii_case(ticket))
                .map_or(Lookup::NoSuchTicket, Lookup::Found),
            None => {
                if let Some(own) = pending.get(slot) {
                    return Lookup::Found(view(slot, own));
                }
                let mut all: Vec<PendingView> = in_chat.collect();
                match all.len() {
                    0 => Lookup::Nothing,
                    1 => Lookup::Found(all.remove(0)),
                    _ => {
                        let mut tickets: Vec<String> = all.into_iter().map(|v| v.ticket).collect();
                        tickets.sort();
                        Lookup::Several(tickets)
                    }
                }
            }
        }
    }

    /// Deny whatever is pending for `key` (/stop, /new, /reset). Returns
    /// how many requests were denied (0 or 1).
    pub fn deny_all(&self, key: &SessionKey, denial: Denial) -> usize {
        let taken = self.pending().remove(key);
        match taken {
            Some(pending) => {
                self.settle(key, pending, Decision::Denied(denial), None);
                1
            }
            None => 0,
        }
    }

    /// Deny every request whose turn `user` started, in whatever slot
    /// (their access was taken away). Returns how many were denied.
    pub fn deny_started_by(&self, user: u64, denial: Denial) -> usize {
        let taken: Vec<(SessionKey, PendingApproval)> = {
            let mut pending = self.pending();
            let keys: Vec<SessionKey> = pending
                .iter()
                .filter(|(_, p)| p.owner.user_id == Some(user))
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter()
                .filter_map(|key| pending.remove(&key).map(|p| (key, p)))
                .collect()
        };
        let denied = taken.len();
        for (key, pending) in taken {
            self.settle(&key, pending, Decision::Denied(denial), None);
        }
        denied
    }

    /// True while an approval waits for `key`.
    pub fn is_pending(&self, key: &SessionKey) -> bool {
        self.pending().contains_key(key)
    }

    /// The command waiting for approval in `key`, if any.
    pub fn pending_command(&self, key: &SessionKey) -> Option<String> {
        self.pending().get(key).map(|p| p.subject.clone())
    }
}

/// Removes a request when its waiting call ends in any way (answered,
/// timed out, cancelled, or dropped), unless a newer one replaced it.
struct Withdraw {
    gate: ApprovalGate,
    key: SessionKey,
    id: u64,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if let Some(pending) = self.gate.take(&self.key, self.id) {
            // The call that waited is gone (its turn ended): recorded as
            // stopped; nobody receives the answer.
            self.gate
                .settle(&self.key, pending, Decision::Denied(Denial::Stopped), None);
        }
    }
}

/// A bare reply that answers a pending approval: `Some(true)` for yes,
/// `Some(false)` for no, `None` for anything else.
pub fn approval_reply(text: &str) -> Option<bool> {
    let word = text.trim().trim_end_matches(['.', '!']).to_lowercase();
    match word.as_str() {
        "yes" | "y" | "approve" => Some(true),
        "no" | "n" | "deny" => Some(false),
        _ => None,
    }
}

fn view(key: &SessionKey, pending: &PendingApproval) -> PendingView {
    PendingView {
        key: key.clone(),
        ticket: pending.ticket.clone(),
        command: pending.subject.clone(),
        started_by: pending.owner.user_id,
        started_by_name: pending.owner.user_name.clone(),
        options: pending.options.clone(),
    }
}

/// A fresh one-time id: six hex digits, not `taken` by a waiting request.
fn new_ticket(taken: impl Fn(&str) -> bool) -> String {
    loop {
        let ticket = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
        if !taken(&ticket) {
            return ticket;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn bare_replies_are_recognised() {
        assert_eq!(approval_reply(" Yes! "), Some(true));
        assert_eq!(approval_reply("no."), Some(false));
        assert_eq!(approval_reply("yes please do it"), None);
        assert_eq!(approval_reply("ok"), None, "too vague to approve a command");
    }

    #[tokio::test]
    async fn answers_reach_the_waiting_request_and_withdraw_it() {
        let (events, mut rx) = super::super::events::tool_events();
        let gate = ApprovalGate::new(Duration::from_secs(60), events);
        let owner = ProcessOwner {
            session_key: SessionKey::from_raw("k"),
            source: crate::vocab::SessionSource::dm(crate::vocab::Platform::Console, 1),
            spawn_session_id: None,
        };
        let key = owner.session_key.clone();
        let waiting = {
            let gate = gate.clone();
            let owner = owner.clone();
            tokio::spawn(async move {
                gate.ask(
                    &owner,
                    "rm -rf x",
                    "why",
                    &CancellationToken::new(),
                    &Progress::new(),
                )
                .await
            })
        };
        while !gate.is_pending(&key) {
            tokio::task::yield_now().await;
        }
        let Some(ToolEvent::Approval { ticket, .. }) = rx.recv().await else {
            panic!("the prompt is an approval event");
        };
        assert_eq!(
            gate.answer_ticket(&key, "zzzzzz", true),
            None,
            "another request's button"
        );
        assert!(gate.is_pending(&key));
        assert_eq!(
            gate.answer_ticket(&key, &ticket, true).as_deref(),
            Some("rm -rf x")
        );
        assert_eq!(waiting.await.unwrap(), Verdict::Approved);
        assert!(!gate.is_pending(&key));
        assert_eq!(gate.answer(&key, false), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_times_out_and_a_dropped_one_is_withdrawn() {
        let (events, _rx) = super::super::events::tool_events();
        let gate = ApprovalGate::new(Duration::from_secs(300), events);
        let owner = ProcessOwner {
            session_key: SessionKey::from_raw("k"),
            source: crate::vocab::SessionSource::dm(crate::vocab::Platform::Console, 1),
            spawn_session_id: None,
        };
        let cancel = CancellationToken::new();
        let verdict = gate
            .ask(&owner, "sudo x", "why", &cancel, &Progress::new())
            .await;
        assert_eq!(verdict, Verdict::Denied(Denial::TimedOut));
        assert!(!gate.is_pending(&owner.session_key));

        let progress = Progress::new();
        let asking = gate.ask(&owner, "sudo y", "why", &cancel, &progress);
        let dropped = tokio::time::timeout(Duration::from_secs(1), asking).await;
        assert!(dropped.is_err());
        assert!(!gate.is_pending(&owner.session_key));
    }

    fn three_options() -> Vec<ApprovalOption> {
        let option = |id: &str, kind| ApprovalOption {
            id: id.to_string(),
            label: id.to_string(),
            kind,
        };
        vec![
            option("once", OptionKind::AllowOnce),
            option("always", OptionKind::AllowAlways),
            option("never", OptionKind::RejectAlways),
        ]
    }

    /// Ask `options` for slot `k` in a task; the ticket once it is shown.
    async fn asking(
        gate: &ApprovalGate,
        rx: &mut super::super::events::ToolEventReceiver,
        options: Vec<ApprovalOption>,
    ) -> (tokio::task::JoinHandle<Decision>, String) {
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                let request = ApprovalRequest {
                    subject: "Edit main.rs".to_string(),
                    text: "prompt".to_string(),
                    options,
                };
                gate.ask_request(
                    &SessionKey::from_raw("k"),
                    &SessionSource::dm(crate::vocab::Platform::Console, 1),
                    request,
                    &CancellationToken::new(),
                    &Progress::new(),
                )
                .await
            })
        };
        // The ending of an earlier request (its prompt settled) comes first.
        let mut event = rx.recv().await;
        while let Some(ToolEvent::Settled { .. }) = event {
            event = rx.recv().await;
        }
        let Some(ToolEvent::Approval {
            ticket, options, ..
        }) = event
        else {
            panic!("the prompt is an approval event");
        };
        assert_eq!(options.len(), 3, "the prompt carries the options");
        (waiting, ticket)
    }

    #[tokio::test]
    async fn an_option_is_chosen_by_id_and_approve_deny_pick_the_first_of_their_kind() {
        let (events, mut rx) = super::super::events::tool_events();
        let gate = ApprovalGate::new(Duration::from_secs(60), events);
        let key = SessionKey::from_raw("k");
        let ann = Answerer {
            user_id: Some(1),
            name: Some("Ann".into()),
            pressed: false,
        };

        let (waiting, ticket) = asking(&gate, &mut rx, three_options()).await;
        let chosen = Choice::Option("maybe".into());
        assert_eq!(
            gate.decide(&key, Some(&ticket), &chosen, &ann),
            Err(NotDecided::NoSuchOption),
            "an option it does not offer decides nothing"
        );
        let decided = gate
            .decide(&key, Some(&ticket), &Choice::Option("always".into()), &ann)
            .unwrap();
        assert!(decided.allowed() && !decided.approve_deny);
        assert_eq!(
            waiting.await.unwrap(),
            Decision::Chosen(three_options()[1].clone())
        );

        let (waiting, ticket) = asking(&gate, &mut rx, three_options()).await;
        gate.decide(&key, Some(&ticket), &Choice::Allow, &ann)
            .unwrap();
        assert_eq!(
            waiting.await.unwrap(),
            Decision::Chosen(three_options()[0].clone())
        );

        let (waiting, _) = asking(&gate, &mut rx, three_options()).await;
        let decided = gate.decide(&key, None, &Choice::Reject, &ann).unwrap();
        assert!(!decided.allowed());
        assert_eq!(
            waiting.await.unwrap(),
            Decision::Chosen(three_options()[2].clone())
        );

        // Nothing to allow with: /approve decides nothing, /deny refuses.
        let rejects = vec![three_options()[2].clone(); 3];
        let (waiting, _) = asking(&gate, &mut rx, rejects).await;
        assert_eq!(
            gate.decide(&key, None, &Choice::Allow, &ann),
            Err(NotDecided::NoSuchOption)
        );
        assert!(gate.is_pending(&key));
        gate.deny_all(&key, Denial::Stopped);
        assert_eq!(waiting.await.unwrap(), Decision::Denied(Denial::Stopped));
        assert_eq!(
            gate.decide(&key, None, &Choice::Reject, &ann),
            Err(NotDecided::NotWaiting)
        );
    }

    #[tokio::test]
    async fn every_ending_is_recorded_with_who_and_what() {
        let store = Store::open_in_memory().unwrap();
        let (events, mut rx) = super::super::events::tool_events();
        let gate = ApprovalGate::new(Duration::from_secs(60), events);
        gate.record_in(&store.approvals());
        let key = SessionKey::from_raw("k");
        let ann = Answerer {
            user_id: Some(7),
            name: Some("Ann".into()),
            pressed: false,
        };
        let (waiting, ticket) = asking(&gate, &mut rx, three_options()).await;
        gate.decide(&key, None, &Choice::Option("always".into()), &ann)
            .unwrap();
        waiting.await.unwrap();
        let (waiting, stopped) = asking(&gate, &mut rx, three_options()).await;
        gate.deny_all(&key, Denial::Stopped);
        waiting.await.unwrap();

        let mut records = Vec::new();
        for _ in 0..200 {
            records = store
                .approvals()
                .approval_records(key.as_str())
                .await
                .unwrap();
            if records.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(records.len(), 2, "{records:?}");
        let chosen = records.iter().find(|r| r.ticket == ticket).unwrap();
        assert_eq!(chosen.outcome, "chosen");
        assert_eq!(chosen.option_id.as_deref(), Some("always"));
        assert_eq!(chosen.option_kind.as_deref(), Some("allow_always"));
        assert_eq!(
            (chosen.decided_by, chosen.decided_by_name.as_deref()),
            (Some(7), Some("Ann"))
        );
        assert_eq!(chosen.subject, "Edit main.rs");
        assert!(chosen.decided_at >= chosen.asked_at);
        let refused = records.iter().find(|r| r.ticket == stopped).unwrap();
        assert_eq!(
            (refused.outcome.as_str(), refused.decided_by),
            ("stopped", None)
        );
    }
}
