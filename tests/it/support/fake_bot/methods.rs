//! The Bot API state machine: one method per Bot API method, always
//! called with the lock held.

use serde_json::{json, Value};
use std::time::Instant;

use super::flood::RetryAfterViolation;
use super::params::{
    allowed_updates_param, bool_param, chat_id_param, commands_key, inline_markup, int_param,
    is_allowed, is_valid_command, language_of, parse_version, retry_scope, scope_of, str_param,
    PollParams, TooLong,
};
use super::state::{ApiFailure, Inner, QueuedUpdate, Shared};
use super::telegram::{CHAT_ACTIONS, MAX_TEXT_UTF16, NOT_MODIFIED, REACTION_EMOJI, WEBHOOK_ACTIVE};
use super::types::{ChatType, Failure, MessageVersion, SentMessage, WebhookSettings};
use super::updates::{set_text, unix_now, user_json, utf16_len};

// Inner: the Bot API state machine (always called with the lock held)
// ---------------------------------------------------------------------------

impl Inner {
    pub(super) fn check_retry_window(&mut self, seq: u64, method: &str, body: &Value, at: Instant) {
        let scope = retry_scope(method, body);
        let Some(window) = self.retry_windows.get(&scope) else {
            return;
        };
        if at < window.until {
            let violation = RetryAfterViolation {
                scope,
                announced_by: window.announced_by,
                retry_until: window.until,
                seq,
                method: method.to_owned(),
                at,
            };
            self.violations.push(violation);
        }
    }

    pub(super) fn take_failure(&mut self, method: &str) -> Option<Failure> {
        if let Some(queue) = self.scripted.get_mut(method) {
            if let Some((remaining, failure)) = queue.front_mut() {
                let failure = failure.clone();
                *remaining -= 1;
                if *remaining == 0 {
                    queue.pop_front();
                }
                return Some(failure);
            }
        }
        let rule = self.rates.get_mut(method)?;
        rule.calls += 1;
        let k = rule.calls as f64;
        let due = (k * rule.probability).floor() > ((k - 1.0) * rule.probability).floor();
        due.then(|| rule.failure.clone())
    }

    pub(super) fn chat_type(&self, chat_id: i64) -> ChatType {
        self.chat_types
            .get(&chat_id)
            .copied()
            .unwrap_or_else(|| ChatType::default_for(chat_id))
    }

    pub(super) fn chat_json(&self, chat_id: i64) -> Value {
        let chat_type = self.chat_type(chat_id);
        let mut chat = json!({ "id": chat_id, "type": chat_type.as_str() });
        if chat_type == ChatType::Private {
            chat["first_name"] = json!(format!("User{chat_id}"));
            chat["username"] = json!(format!("user{chat_id}"));
        } else {
            chat["title"] = json!(format!("Chat {chat_id}"));
        }
        if self.forums.contains_key(&chat_id) {
            chat["is_forum"] = json!(true);
        }
        chat
    }

    pub(super) fn allocate_message_id(&mut self, chat_id: i64) -> i64 {
        let chat = self.chats.entry(chat_id).or_default();
        chat.last_message_id = chat.last_message_id.saturating_add(1);
        chat.last_message_id
    }

    // -- updates -----------------------------------------------------------

    pub(super) fn enqueue_update(&mut self, mut update: Value) -> i64 {
        let explicit = update.get("update_id").and_then(Value::as_i64);
        let id = explicit.unwrap_or(self.next_update_id);
        if explicit.is_none() {
            if let Some(object) = update.as_object_mut() {
                object.insert("update_id".to_owned(), json!(id));
            }
        }
        self.next_update_id = self.next_update_id.max(id.saturating_add(1));
        self.note_incoming_message(&update);
        self.updates.push_back(QueuedUpdate { id, value: update });
        id
    }

    /// Remembers user messages from raw updates so that message ids the bot
    /// gets later don't collide and `deleteMessage` finds them.
    pub(super) fn note_incoming_message(&mut self, update: &Value) {
        let Some(message) = update
            .get("message")
            .or_else(|| update.get("edited_message"))
        else {
            return;
        };
        let chat_id = message
            .get("chat")
            .and_then(|c| c.get("id"))
            .and_then(Value::as_i64);
        let message_id = message.get("message_id").and_then(Value::as_i64);
        if let (Some(chat_id), Some(message_id)) = (chat_id, message_id) {
            let chat = self.chats.entry(chat_id).or_default();
            chat.last_message_id = chat.last_message_id.max(message_id);
            chat.user_messages.insert(message_id);
        }
    }

    pub(super) fn user_message_base(&self, chat_id: i64, user_id: i64, message_id: i64) -> Value {
        json!({
            "message_id": message_id,
            "from": user_json(user_id),
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
        })
    }

    pub(super) fn incoming_message(&mut self, chat_id: i64, user_id: i64, text: &str) -> Value {
        let message_id = self.allocate_message_id(chat_id);
        let mut message = self.user_message_base(chat_id, user_id, message_id);
        set_text(&mut message, "text", "entities", text);
        message
    }

    pub(super) fn latest_bot_message_json(&mut self, shared: &Shared, chat_id: i64) -> Value {
        let latest = self
            .chats
            .get(&chat_id)
            .and_then(|c| c.bot_messages.values().rev().find(|m| !m.deleted));
        if let Some(message) = latest {
            return self.bot_message_json(shared, message, message.current(), false);
        }
        let message_id = self.allocate_message_id(chat_id);
        json!({
            "message_id": message_id,
            "from": shared.bot_user(),
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
            "text": "(earlier bot message)",
        })
    }

    pub(super) fn bot_message_json_or_inaccessible(
        &self,
        shared: &Shared,
        chat_id: i64,
        message_id: i64,
    ) -> Value {
        let known = self
            .chats
            .get(&chat_id)
            .and_then(|c| c.bot_messages.get(&message_id));
        match known {
            Some(message) if !message.deleted => {
                let edited = message.versions.len() > 1;
                self.bot_message_json(shared, message, message.current(), edited)
            }
            // Telegram's `InaccessibleMessage`: date 0.
            _ => json!({ "chat": self.chat_json(chat_id), "message_id": message_id, "date": 0 }),
        }
    }

    pub(super) fn begin_poll(&mut self, params: &PollParams) -> Result<u64, ApiFailure> {
        if self.webhook_url.is_some() {
            return Err(ApiFailure::new(409, WEBHOOK_ACTIVE));
        }
        if let Some(allowed) = &params.allowed_updates {
            self.allowed_updates = Some(allowed.clone());
        }
        self.confirm(params.offset);
        self.poll_generation += 1;
        Ok(self.poll_generation)
    }

    /// Telegram semantics: a positive offset confirms (forgets) all updates
    /// with a smaller id; a negative offset `-k` keeps only the last `k`.
    pub(super) fn confirm(&mut self, offset: i64) {
        if offset > 0 {
            self.updates.retain(|u| u.id >= offset);
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            let excess = self.updates.len().saturating_sub(keep);
            self.updates.drain(..excess);
        }
    }

    /// Up to `limit` queued updates. Updates of kinds excluded by
    /// `allowed_updates` are discarded, as Telegram never stores them.
    pub(super) fn deliverable(&mut self, limit: usize) -> Vec<Value> {
        let allowed = self.allowed_updates.clone();
        self.updates
            .retain(|u| is_allowed(&u.value, allowed.as_deref()));
        let now = Instant::now();
        let batch: Vec<Value> = self
            .updates
            .iter()
            .take(limit)
            .map(|u| {
                self.handed_out.entry(u.id).or_insert(now);
                u.value.clone()
            })
            .collect();
        batch
    }

    // -- webhook -----------------------------------------------------------

    pub(super) fn webhook_info(&self) -> Value {
        let mut info = json!({
            "url": self.webhook_url.clone().unwrap_or_default(),
            "has_custom_certificate": false,
            "pending_update_count": self.updates.len(),
        });
        // Like Telegram: the settings are shown while a webhook is set; the
        // secret token never is.
        if self.webhook_url.is_some() {
            info["max_connections"] = json!(self.webhook_settings.max_connections.unwrap_or(40));
            if let Some(allowed) = &self.webhook_settings.allowed_updates {
                info["allowed_updates"] = json!(allowed);
            }
        }
        info
    }

    pub(super) fn set_webhook(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let url = str_param(body, "url")?.unwrap_or_default();
        if bool_param(body, "drop_pending_updates")? {
            self.updates.clear();
        }
        let max_connections = int_param(body, "max_connections")?;
        if let Some(n) = max_connections {
            if !(1..=100).contains(&n) {
                return Err(ApiFailure::bad_request(
                    "Bad Request: bad webhook: max_connections must be between 1 and 100",
                ));
            }
        }
        let allowed_updates = allowed_updates_param(body)?;
        // Telegram keeps one allowed_updates setting for both ways.
        if allowed_updates.is_some() {
            self.allowed_updates = allowed_updates.clone();
        }
        self.webhook_settings = WebhookSettings {
            allowed_updates,
            max_connections,
            secret_token: str_param(body, "secret_token")?,
        };
        // An empty URL removes the webhook, as in the real API.
        // A poll already being held runs to its timeout; the next one gets 409.
        self.webhook_url = (!url.is_empty()).then_some(url);
        Ok(json!(true))
    }

    pub(super) fn delete_webhook(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let drop_pending = bool_param(body, "drop_pending_updates")?;
        if drop_pending {
            self.updates.clear();
        }
        self.delete_webhook_drops.push(drop_pending);
        self.webhook_url = None;
        Ok(json!(true))
    }

    // -- messages ----------------------------------------------------------

    pub(super) fn send_message(
        &mut self,
        shared: &Shared,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let version = parse_version(body, TooLong::Send)?;
        let thread_id = int_param(body, "message_thread_id")?;
        let message_id = self.allocate_message_id(chat_id);
        let message = SentMessage {
            chat_id,
            message_id,
            thread_id,
            versions: vec![version],
            deleted: false,
        };
        let json = self.bot_message_json(shared, &message, message.current(), false);
        self.chats
            .entry(chat_id)
            .or_default()
            .bot_messages
            .insert(message_id, message);
        Ok(json)
    }

    pub(super) fn edit_message_text(
        &mut self,
        shared: &Shared,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let version = parse_version(body, TooLong::Edit)?;
        if str_param(body, "inline_message_id")?.is_some() {
            // Inline messages aren't tracked; Telegram answers `true` for them.
            return Ok(json!(true));
        }
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let chat = self.chats.get_mut(&chat_id);
        let message = match chat {
            Some(chat) if chat.user_messages.contains(&message_id) => {
                return Err(ApiFailure::bad_request(
                    "Bad Request: message can't be edited",
                ));
            }
            Some(chat) => chat
                .bot_messages
                .get_mut(&message_id)
                .filter(|m| !m.deleted),
            None => None,
        };
        let message = message
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: message to edit not found"))?;
        let current = message.current();
        let same = current.text == version.text
            && current.entities == version.entities
            && current.reply_markup == version.reply_markup;
        if same {
            return Err(ApiFailure::bad_request(NOT_MODIFIED));
        }
        message.versions.push(version);
        let message = message.clone();
        Ok(self.bot_message_json(shared, &message, message.current(), true))
    }

    /// `editMessageReplyMarkup`: a new version with the same text and the
    /// given keyboard (none: the keyboard is removed).
    pub(super) fn edit_message_reply_markup(
        &mut self,
        shared: &Shared,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let markup = inline_markup(body.get("reply_markup"));
        let message = self
            .chats
            .get_mut(&chat_id)
            .and_then(|chat| chat.bot_messages.get_mut(&message_id))
            .filter(|m| !m.deleted)
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: message to edit not found"))?;
        if message.current().reply_markup == markup {
            return Err(ApiFailure::bad_request(NOT_MODIFIED));
        }
        let mut version = message.current().clone();
        version.reply_markup = markup;
        version.date = unix_now();
        message.versions.push(version);
        let message = message.clone();
        Ok(self.bot_message_json(shared, &message, message.current(), true))
    }

    /// `setMessageReaction` on a user's message: records the emoji list
    /// (an empty list removes the bot's reaction).
    /// `sendMessageDraft` (Bot API 9.3+): private chats only, a non-zero
    /// draft id, at most 4096 characters; an old server does not know it.
    pub(super) fn send_message_draft(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        if self.refuse_drafts {
            return Err(ApiFailure::new(404, "Not Found: method not found"));
        }
        let chat_id = chat_id_param(body)?;
        if self.chat_type(chat_id) != ChatType::Private {
            return Err(ApiFailure::bad_request(
                "Bad Request: TEXTDRAFT_PEER_INVALID",
            ));
        }
        let draft_id = int_param(body, "draft_id")?.unwrap_or(0);
        if draft_id == 0 {
            return Err(ApiFailure::bad_request(
                "Bad Request: draft_id must be non-zero",
            ));
        }
        let text = body
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if utf16_len(&text) > MAX_TEXT_UTF16 {
            return Err(ApiFailure::bad_request("Bad Request: text is too long"));
        }
        let can_stop = body
            .get("can_stop")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.drafts.push((chat_id, draft_id, text, can_stop));
        Ok(json!(true))
    }

    pub(super) fn set_message_reaction(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let known = self
            .chats
            .get(&chat_id)
            .is_some_and(|chat| chat.user_messages.contains(&message_id));
        if !known {
            return Err(ApiFailure::bad_request(
                "Bad Request: message to react not found",
            ));
        }
        let reaction = match body.get("reaction") {
            None | Some(Value::Null) => Value::Array(Vec::new()),
            Some(Value::String(raw)) => serde_json::from_str(raw).unwrap_or(Value::Null),
            Some(value) => value.clone(),
        };
        let Value::Array(kinds) = reaction else {
            return Err(ApiFailure::bad_request(
                "Bad Request: can't parse reaction types JSON object",
            ));
        };
        let mut emoji = Vec::new();
        for kind in kinds {
            match (kind.get("type").and_then(Value::as_str), kind.get("emoji")) {
                (Some("emoji"), Some(Value::String(e))) if REACTION_EMOJI.contains(&e.as_str()) => {
                    emoji.push(e.clone())
                }
                _ => return Err(ApiFailure::bad_request("Bad Request: REACTION_INVALID")),
            }
        }
        self.reactions.push((chat_id, message_id, emoji));
        Ok(json!(true))
    }

    pub(super) fn bot_message_json(
        &self,
        shared: &Shared,
        message: &SentMessage,
        version: &MessageVersion,
        edited: bool,
    ) -> Value {
        let mut json = json!({
            "message_id": message.message_id,
            "from": shared.bot_user(),
            "chat": self.chat_json(message.chat_id),
            "date": message.versions.first().map_or(version.date, |v| v.date),
            "text": version.text,
        });
        if !version.entities.is_empty() {
            json["entities"] = Value::Array(version.entities.clone());
        }
        if let Some(thread_id) = message.thread_id {
            json["message_thread_id"] = json!(thread_id);
        }
        if let Some(markup) = &version.reply_markup {
            json["reply_markup"] = markup.clone();
        }
        if edited {
            json["edit_date"] = json!(version.date);
        }
        json
    }

    pub(super) fn delete_message(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let not_found = || ApiFailure::bad_request("Bad Request: message to delete not found");
        let chat = self.chats.get_mut(&chat_id).ok_or_else(not_found)?;
        if chat.user_messages.remove(&message_id) {
            return Ok(json!(true));
        }
        let message = chat
            .bot_messages
            .get_mut(&message_id)
            .filter(|m| !m.deleted)
            .ok_or_else(not_found)?;
        message.deleted = true;
        Ok(json!(true))
    }

    // -- commands ----------------------------------------------------------

    pub(super) fn set_my_commands(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let commands = match body.get("commands") {
            Some(Value::String(raw)) => serde_json::from_str(raw).unwrap_or(Value::Null),
            Some(value) => value.clone(),
            None => Value::Null,
        };
        let Value::Array(list) = &commands else {
            return Err(ApiFailure::bad_request(
                "Bad Request: parameter \"commands\" is required",
            ));
        };
        if list.len() > 100 || !list.iter().all(is_valid_command) {
            return Err(ApiFailure::bad_request("Bad Request: BOT_COMMAND_INVALID"));
        }
        let key = commands_key(scope_of(body), language_of(body));
        self.commands.insert(key, commands);
        Ok(json!(true))
    }

    pub(super) fn get_my_commands(&self, body: &Value) -> Value {
        let key = commands_key(scope_of(body), language_of(body));
        self.commands
            .get(&key)
            .cloned()
            .unwrap_or_else(|| json!([]))
    }

    pub(super) fn delete_my_commands(&mut self, body: &Value) -> Value {
        let key = commands_key(scope_of(body), language_of(body));
        self.commands.remove(&key);
        json!(true)
    }
}

pub(super) fn send_chat_action(body: &Value) -> Result<Value, ApiFailure> {
    chat_id_param(body)?;
    match str_param(body, "action")? {
        Some(action) if CHAT_ACTIONS.contains(&action.as_str()) => Ok(json!(true)),
        _ => Err(ApiFailure::bad_request(
            "Bad Request: wrong parameter action in request",
        )),
    }
}

pub(super) fn answer_callback_query(body: &Value) -> Result<Value, ApiFailure> {
    match str_param(body, "callback_query_id")? {
        Some(id) if !id.is_empty() => Ok(json!(true)),
        _ => Err(ApiFailure::bad_request(
            "Bad Request: query is too old and response timeout expired or query id is invalid",
        )),
    }
}
