//! Button presses (`callback_query` updates): recorded in the inbox like
//! messages, then carried out (by the dispatcher's handler, never behind
//! the chat's messages) and always answered with `answerCallbackQuery`.
//!
//! A press is checked against the button as stored (never against what
//! the update says): unknown, expired and used buttons do nothing; only the
//! user whose session the button acts on, or one of `[telegram] approvers`,
//! may press it (others get a short toast). An allowed press uses up its
//! button row (atomically, remembered by update id, so a press replayed
//! after a restart is carried out once) and then goes down the same path
//! as the command it stands for, on behalf of that session:
//!
//! * Stop: /stop for the slot, but only while the turn of the button's
//!   generation runs; otherwise "already finished" and nothing is touched
//!   (generations are unique across restarts, so a button or a draft from
//!   an earlier process never matches);
//! * Approve / Deny: exactly `/approve <ticket>` / `/deny <ticket>` from
//!   the presser (the prompt's one-time ticket, `may_decide`), never a
//!   newer request; an option's button (a request offering more than two
//!   answers) chooses that option the same way; the prompt is edited to
//!   say what was decided, by whom and when (the gate records it);
//! * a model: /model NAME;
//! * a job's Pause, Resume or Delete: `/pause ID`, `/resume ID`,
//!   `/unschedule ID` from the presser, allowed for the job's creator or
//!   an approver (checked before the row is used up, so someone else's
//!   press leaves the buttons to their owner).
//! * a conversation: /resume ID.
//!
//! Telegram's own stop control on a streamed draft (a
//! `stopped_message_generation` update, [`DraftStop`]) takes the same road
//! as a Stop button: recorded first, then /stop only while the turn whose
//! generation is the draft id still runs.
//!
//! This module owns interpreting presses. It must never trust
//! `callback_data` beyond looking up the id, and never await a turn.

use std::sync::Arc;

use serde_json::Value;
use teloxide::payloads::AnswerCallbackQuerySetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::CallbackQuery;

use super::TransportTables;
use crate::delivery::{ChatTarget, Delivery, FormattedText};
use crate::engine::Engine;
use crate::runner::ApprovalPress;
use crate::store::{now_ms, StoreError, StoredButton};
use crate::tools::approval::Decided;
use crate::tools::approval_prompt::{chosen_line, clock_utc};
use crate::tools::authority::may_decide;
use crate::vocab::{
    button_id, ButtonAction, ChatType, InboxState, MessageEvent, Platform, SessionSource,
    TurnGeneration,
};

/// Carries out button presses.
pub struct CallbackHandler {
    engine: Engine,
    delivery: Delivery,
    store: TransportTables,
    approvers: Vec<u64>,
}

/// How a press ended (recorded on its inbox row).
type Outcome = (InboxState, Option<&'static str>);

impl CallbackHandler {
    /// A handler acting on `engine`; `approvers` may press any button.
    pub fn new(
        engine: Engine,
        delivery: Delivery,
        store: TransportTables,
        approvers: Vec<u64>,
    ) -> Self {
        CallbackHandler {
            engine,
            delivery,
            store,
            approvers,
        }
    }

    /// Record the press of update `update_id` (before it is confirmed to
    /// Telegram); the dispatcher carries it out ([`CallbackHandler::handle`]).
    /// `false`: it was recorded before (a redelivery) and is ignored.
    pub async fn record(
        &self,
        update_id: i64,
        chat_id: i64,
        raw: Value,
    ) -> Result<bool, StoreError> {
        self.store
            .inbox
            .record_update(update_id, chat_id, None, raw, InboxState::Received, None)
            .await
    }

    /// Carry out one press and record how it ended.
    pub async fn handle(&self, update_id: i64, query: CallbackQuery) {
        let (state, reason) = self.press(update_id, &query).await;
        if let Err(error) = self
            .store
            .inbox
            .set_update_state(update_id, state, reason.map(str::to_string))
            .await
        {
            tracing::error!(update_id, %error, "could not record a button press's outcome");
        }
    }

    /// A button press: read, checked, then carried out by its action.
    async fn press(&self, update_id: i64, query: &CallbackQuery) -> Outcome {
        let presser = query.from.id.0;
        let (id, stored, action) = match self.read_button(update_id, query).await {
            Ok(button) => button,
            Err(outcome) => return outcome,
        };
        if let Err(outcome) = self
            .check_press(update_id, query, presser, &stored, &action)
            .await
        {
            return outcome;
        }
        let owner = owner_source(&stored);
        let key = self.engine.adapter.session_key(&owner);
        let press = (id, update_id);
        match action {
            ButtonAction::Stop { generation } => {
                self.press_stop(press, query, owner, &key, generation).await
            }
            ButtonAction::Approve { .. }
            | ButtonAction::Deny { .. }
            | ButtonAction::Choose { .. } => {
                self.press_approval(press, query, &owner, &action).await
            }
            ButtonAction::Job { id: job, change } => {
                self.press_job(press, query, &owner, job, change).await
            }
            ButtonAction::Model { name } => {
                if !self.claim(id, update_id).await {
                    self.toast(query, "Already chosen.").await;
                    return (InboxState::Dropped, Some("already used"));
                }
                self.toast(query, &format!("Model: {name}")).await;
                self.rewrite_prompt(query, &owner, &format!("Chosen: {name}"))
                    .await;
                self.engine
                    .adapter
                    .handle_message(MessageEvent::text(owner, format!("/model {name}")))
                    .await;
                (InboxState::Answered, None)
            }
            ButtonAction::Resume { session } => {
                if !self.claim(id, update_id).await {
                    self.toast(query, "Already chosen.").await;
                    return (InboxState::Dropped, Some("already used"));
                }
                self.toast(query, "Going back to that conversation…").await;
                // The same path as a typed /resume from the session's user.
                self.engine
                    .adapter
                    .handle_message(MessageEvent::text(owner, format!("/resume {session}")))
                    .await;
                (InboxState::Answered, None)
            }
            ButtonAction::Worktree {
                change,
                session,
                token,
            } => {
                if !self.claim(id, update_id).await {
                    self.toast(query, "Already done.").await;
                    return (InboxState::Dropped, Some("already used"));
                }
                self.toast(query, "On it…").await;
                // The same path as a typed `/merge confirm ID`, with the
                // button's own confirmation.
                let text = format!("/{} confirm {session} {token}", change.command());
                self.engine
                    .adapter
                    .handle_message(MessageEvent::text(owner, text))
                    .await;
                (InboxState::Answered, None)
            }
        }
    }

    /// The pressed button's id, its stored row and its action; `Err`: the
    /// press ends here (not ours, unknown, unreadable).
    async fn read_button<'q>(
        &self,
        update_id: i64,
        query: &'q CallbackQuery,
    ) -> Result<(&'q str, StoredButton, ButtonAction), Outcome> {
        let Some(id) = query.data.as_deref().and_then(button_id) else {
            self.toast(query, "This button is not mine.").await;
            return Err((InboxState::Dropped, Some("foreign button")));
        };
        let stored = match self.store.buttons.button(id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                self.toast(query, "This button is no longer valid.").await;
                return Err((InboxState::Dropped, Some("unknown button")));
            }
            Err(error) => {
                tracing::error!(update_id, %error, "could not look a button up");
                self.toast(query, "⚠️ Could not read this button; try again.")
                    .await;
                return Err((InboxState::Failed, Some("store error")));
            }
        };
        let action: ButtonAction = match serde_json::from_value(stored.button.action.clone()) {
            Ok(action) => action,
            Err(_) => {
                self.toast(query, "This button is no longer valid.").await;
                return Err((InboxState::Dropped, Some("unknown action")));
            }
        };
        Ok((id, stored, action))
    }

    /// May `presser` press this button now (allowed, not used by another
    /// press, not expired)? `Err`: the press ends here, told why.
    async fn check_press(
        &self,
        update_id: i64,
        query: &CallbackQuery,
        presser: u64,
        stored: &StoredButton,
        action: &ButtonAction,
    ) -> Result<(), Outcome> {
        // A job's button is checked against the job's creator instead of
        // the user the list was shown to (below, by its command's rule).
        let job_button = matches!(action, ButtonAction::Job { .. });
        // Every button, whoever it was shown to: the presser's standing now.
        if !self
            .engine
            .runner
            .deciders()
            .may_use(presser, stored.button.chat_id)
        {
            tracing::info!(
                update_id,
                presser,
                "button pressed by someone without access"
            );
            self.toast(query, "🔒 You no longer have access to this bot.")
                .await;
            return Err((InboxState::Dropped, Some("not allowed")));
        }
        if !job_button && !self.may_press(stored, presser) {
            let whose = stored
                .button
                .owner_name
                .clone()
                .unwrap_or_else(|| "the person whose session it is".to_string());
            tracing::info!(
                update_id,
                presser,
                "button pressed by someone not allowed to"
            );
            self.toast(
                query,
                &format!("Only {whose} (or an admin) can use this button."),
            )
            .await;
            return Err((InboxState::Dropped, Some("not allowed")));
        }
        let replay = stored.used_by == Some(update_id);
        if stored.used_by.is_some() && !replay {
            self.toast(query, used_text(action)).await;
            return Err((InboxState::Dropped, Some("already used")));
        }
        if stored.button.expires_at < now_ms() && !replay {
            self.toast(query, "This button has expired.").await;
            return Err((InboxState::Dropped, Some("expired")));
        }
        Ok(())
    }

    /// A Stop button: /stop from the session's user, while its turn runs.
    async fn press_stop(
        &self,
        (id, update_id): (&str, i64),
        query: &CallbackQuery,
        owner: SessionSource,
        key: &crate::vocab::SessionKey,
        generation: u64,
    ) -> Outcome {
        let running = self.engine.runner.running_agent(key).is_some()
            && self
                .engine
                .runner
                .is_current(key, TurnGeneration(generation));
        if !running {
            self.toast(query, "Already finished.").await;
            return (InboxState::Dropped, Some("turn already finished"));
        }
        if !self.claim(id, update_id).await {
            self.toast(query, "Already finished.").await;
            return (InboxState::Dropped, Some("already used"));
        }
        self.toast(query, "Stopping…").await;
        // The same path as a typed /stop from the session's user.
        self.engine
            .adapter
            .handle_message(MessageEvent::text(owner, "/stop"))
            .await;
        (InboxState::Answered, None)
    }

    /// An approval's button: `/approve <ticket>` (or `/deny <ticket>`, or
    /// the choice of one option) from the presser: the same ticket, the
    /// same authority rule.
    async fn press_approval(
        &self,
        (id, update_id): (&str, i64),
        query: &CallbackQuery,
        owner: &SessionSource,
        action: &ButtonAction,
    ) -> Outcome {
        let actor = presser_source(owner, query);
        let decided = match action {
            ButtonAction::Choose { ticket, option } => {
                self.engine.runner.press_option(&actor, ticket, option)
            }
            ButtonAction::Approve { ticket } => {
                self.engine.runner.press_approval(&actor, ticket, true)
            }
            ButtonAction::Deny { ticket } => {
                self.engine.runner.press_approval(&actor, ticket, false)
            }
            _ => ApprovalPress::NotWaiting,
        };
        let decided = match decided {
            ApprovalPress::NotAllowed(who_may) => {
                self.toast(query, &format!("🔒 {who_may}")).await;
                return (InboxState::Dropped, Some("not allowed"));
            }
            ApprovalPress::NotWaiting => {
                self.toast(query, "This request is no longer waiting.")
                    .await;
                self.rewrite_prompt(query, owner, "(No longer waiting for an answer.)")
                    .await;
                return (InboxState::Dropped, Some("approval no longer pending"));
            }
            ApprovalPress::Decided(decided) => decided,
        };
        let (toast, outcome) = decided_lines(&decided, &query.from.full_name());
        // Remember the press (a replay after a restart is this one).
        self.claim(id, update_id).await;
        self.toast(query, &toast).await;
        self.rewrite_prompt(query, owner, &outcome).await;
        (InboxState::Answered, None)
    }

    /// A job's button: `/pause ID` (or resume, unschedule) from the
    /// presser: the same command, the same rule (its creator or an
    /// approver).
    async fn press_job(
        &self,
        (id, update_id): (&str, i64),
        query: &CallbackQuery,
        owner: &SessionSource,
        job: i64,
        change: crate::vocab::JobButton,
    ) -> Outcome {
        let actor = presser_source(owner, query);
        if let Err(refusal) = self.engine.runner.may_change_job(&actor, job).await {
            self.toast(query, &refusal).await;
            return (InboxState::Dropped, Some("not allowed"));
        }
        if !self.claim(id, update_id).await {
            self.toast(query, "Already done.").await;
            return (InboxState::Dropped, Some("already used"));
        }
        self.toast(query, "OK").await;
        self.engine
            .adapter
            .handle_message(MessageEvent::text(actor, change.command(job)))
            .await;
        (InboxState::Answered, None)
    }

    /// The session's own user, or an approver (with teams: the owner and
    /// the admins), who may use the bot in the button's chat now: the one
    /// rule ([`may_decide`]) every control acting on someone's turn asks,
    /// with the presser's standing at the press (not when the button was
    /// made).
    fn may_press(&self, stored: &StoredButton, presser: u64) -> bool {
        let (owner, chat) = (stored.button.owner_id, stored.button.chat_id);
        match self.engine.runner.access() {
            Some(access) => may_decide(owner, Some(presser), chat, access),
            None => may_decide(owner, Some(presser), chat, &self.approvers),
        }
    }

    async fn claim(&self, id: &str, update_id: i64) -> bool {
        match self.store.buttons.claim_button(id, update_id).await {
            Ok(claimed) => claimed,
            Err(error) => {
                tracing::error!(update_id, %error, "could not use a button");
                false
            }
        }
    }

    /// Answer the press (best effort: a toast that cannot be shown changes
    /// nothing, and an old query may no longer be answerable).
    async fn toast(&self, query: &CallbackQuery, text: &str) {
        let request = self
            .delivery
            .bot()
            .answer_callback_query(query.id.clone())
            .text(text.to_string());
        if let Err(error) = request.send().await {
            tracing::debug!(%error, "could not answer a button press");
        }
    }

    /// Edit the message the buttons were under: its text plus `outcome`,
    /// without buttons.
    async fn rewrite_prompt(&self, query: &CallbackQuery, owner: &SessionSource, outcome: &str) {
        let Some(message) = &query.message else {
            return;
        };
        let before = message
            .regular_message()
            .and_then(|m| m.text())
            .unwrap_or_default();
        let text = if before.is_empty() {
            outcome.to_string()
        } else {
            format!("{before}\n\n{outcome}")
        };
        let target = ChatTarget {
            chat_id: message.chat().id.0,
            ..ChatTarget::of(owner)
        };
        if let Err(error) = self
            .delivery
            .edit_chunk(target, message.id().0, &FormattedText::plain(text))
            .await
        {
            tracing::debug!(%error, "could not edit the message of a pressed button");
        }
    }
}

/// Telegram's own stop control on a streamed draft: a
/// `stopped_message_generation` update (private chats only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftStop {
    /// The private chat (its id is the user's id).
    pub chat_id: i64,
    /// The forum topic, if any.
    pub thread_id: Option<i32>,
    /// The draft's id: the generation of the turn that streamed it.
    pub draft_id: i64,
}

impl DraftStop {
    /// Read the update's `stopped_message_generation` object, if it is one.
    pub fn parse(raw: &Value) -> Option<DraftStop> {
        let stop = raw.get(super::registration::DRAFT_STOP_UPDATE)?;
        Some(DraftStop {
            chat_id: stop.get("chat")?.get("id")?.as_i64()?,
            thread_id: stop
                .get("message_thread_id")
                .and_then(Value::as_i64)
                .and_then(|t| i32::try_from(t).ok()),
            draft_id: stop.get("draft_id")?.as_i64()?,
        })
    }
}

impl CallbackHandler {
    /// Record a draft stop of update `update_id` (before it is confirmed),
    /// then carry it out in the background. `false`: a redelivery.
    pub async fn take_draft_stop(
        self: &Arc<Self>,
        update_id: i64,
        raw: Value,
        stop: DraftStop,
    ) -> Result<bool, StoreError> {
        let new = self
            .store
            .inbox
            .record_update(
                update_id,
                stop.chat_id,
                None,
                raw,
                InboxState::Received,
                None,
            )
            .await?;
        if new {
            let handler = self.clone();
            tokio::spawn(async move { handler.handle_draft_stop(update_id, stop).await });
        }
        Ok(new)
    }

    /// Carry out a draft stop and record how it ended.
    pub async fn handle_draft_stop(&self, update_id: i64, stop: DraftStop) {
        let (state, reason) = self.draft_stop(stop).await;
        if let Err(error) = self
            .store
            .inbox
            .set_update_state(update_id, state, reason.map(str::to_string))
            .await
        {
            tracing::error!(update_id, %error, "could not record a draft stop's outcome");
        }
    }

    /// /stop for the private chat's session, but only while the turn that
    /// streamed this draft runs (like a Stop button of that turn).
    async fn draft_stop(&self, stop: DraftStop) -> Outcome {
        let owner = SessionSource {
            platform: Platform::Telegram,
            chat_id: stop.chat_id,
            chat_type: ChatType::Dm,
            thread_id: stop.thread_id,
            user_id: u64::try_from(stop.chat_id).ok(),
            user_name: None,
        };
        let key = self.engine.adapter.session_key(&owner);
        let generation = u64::try_from(stop.draft_id).unwrap_or(0);
        let running = self.engine.runner.running_agent(&key).is_some()
            && self
                .engine
                .runner
                .is_current(&key, TurnGeneration(generation));
        if !running {
            tracing::info!(
                chat_id = stop.chat_id,
                draft_id = stop.draft_id,
                "draft stop for a turn already finished"
            );
            return (InboxState::Dropped, Some("turn already finished"));
        }
        self.engine
            .adapter
            .handle_message(MessageEvent::text(owner, "/stop"))
            .await;
        (InboxState::Answered, None)
    }
}

/// What a second press of a used button is told.
fn used_text(action: &ButtonAction) -> &'static str {
    match action {
        ButtonAction::Stop { .. } => "Already finished.",
        ButtonAction::Approve { .. } | ButtonAction::Deny { .. } | ButtonAction::Choose { .. } => {
            "Already answered."
        }
        ButtonAction::Model { .. } => "Already chosen.",
        ButtonAction::Job { .. } => "Already done.",
        ButtonAction::Resume { .. } => "Already chosen.",
        ButtonAction::Worktree { .. } => "Already done.",
    }
}

/// The toast and the line added to the prompt once `who` decided: the
/// option chosen (Approved / Denied for the two-option case), by whom and
/// when.
fn decided_lines(decided: &Decided, who: &str) -> (String, String) {
    let at = clock_utc(now_ms());
    let line = chosen_line(decided.option.as_ref(), who, &at);
    let toast = match (&decided.option, decided.approve_deny) {
        (_, true) if decided.allowed() => "Approved.".to_string(),
        (Some(option), false) => format!("{}.", option.label),
        _ => "Denied.".to_string(),
    };
    (toast, line)
}

/// The presser, in the chat (and thread) of the button's session.
fn presser_source(owner: &SessionSource, query: &CallbackQuery) -> SessionSource {
    SessionSource {
        user_id: Some(query.from.id.0),
        user_name: Some(query.from.full_name()),
        ..owner.clone()
    }
}

/// The session a button acts on: its chat and its owner.
fn owner_source(stored: &StoredButton) -> SessionSource {
    let b = &stored.button;
    let chat_type = match b.chat_type.as_str() {
        "dm" => ChatType::Dm,
        "group" => ChatType::Group,
        "supergroup" => ChatType::Supergroup,
        _ => ChatType::Channel,
    };
    SessionSource {
        platform: Platform::Telegram,
        chat_id: b.chat_id,
        chat_type,
        thread_id: b.thread_id,
        user_id: b.owner_id,
        user_name: b.owner_name.clone(),
    }
}
