//! Conversations a chat can return to: /sessions (the slot's recent
//! sessions, with a button each), /resume ID (make one current again) and
//! /title TEXT (name the current one).
//!
//! A session's history (openai), its CLI agent's resume id and its
//! settings are all keyed by the session id, so resuming is only making
//! the id current again, in the store and in the runner's table
//! ([`crate::store::resume`]). /resume is refused while a task runs (like
//! /retry): the running turn belongs to the conversation being left.

use super::commands;
use crate::adapter::DispatchContext;
use crate::reply::Reply;
use crate::runner::{Runner, STORE_DOWN_TEXT};
use crate::vocab::{Button, ButtonAction, SessionId, SessionKey};

/// How many conversations /sessions lists.
const LISTED: usize = 10;
/// The longest title kept (characters).
const TITLE_CHARS: usize = 100;
/// How much of a first message a listing shows (characters).
const SHOWN_CHARS: usize = 60;

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line
    }
}

/// What a conversation is called: its title, else its first message.
fn name_of(conversation: &crate::store::Conversation) -> String {
    match (&conversation.title, &conversation.first_message) {
        (Some(title), _) => format!("\"{}\"", one_line(title, SHOWN_CHARS)),
        (None, Some(first)) => format!("\"{}\"", one_line(first, SHOWN_CHARS)),
        (None, None) => "(empty)".to_string(),
    }
}

/// The short id shown and accepted by /resume.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

impl Runner {
    /// /sessions: this slot's recent conversations, each with a button.
    pub(super) async fn sessions_command(
        &self,
        key: &SessionKey,
        source: &crate::vocab::SessionSource,
    ) -> Reply {
        let Some(store) = self.store() else {
            return Reply::command("This chat keeps no history to go back to.");
        };
        if self.resolve_session(key).await.is_err() {
            return Reply::error(STORE_DOWN_TEXT);
        }
        let listed = match store.sessions.conversations(key.as_str(), LISTED * 3).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::error!(session_key = %key, %error, "could not list the conversations");
                return Reply::command("⚠️ I could not read the conversations right now.");
            }
        };
        let listed: Vec<_> = listed
            .into_iter()
            .filter(|c| c.current || c.exchanges > 0)
            .take(LISTED)
            .collect();
        if listed.iter().all(|c| c.current) {
            return Reply::command(
                "There is only this conversation so far. /new starts another; /sessions then lists both.",
            );
        }
        let tz = self
            .inner
            .config
            .limits
            .zone(&store.jobs, source.chat_id)
            .await;
        let mut text = String::from("🗂 Conversations in this chat, newest first:");
        let mut buttons = Vec::new();
        for c in &listed {
            let started = jiff::Timestamp::from_millisecond(c.created_at_ms)
                .map(|t| {
                    t.to_zoned(tz.clone())
                        .strftime("%Y-%m-%d %H:%M")
                        .to_string()
                })
                .unwrap_or_default();
            let exchanges = if c.exchanges == 1 {
                "exchange"
            } else {
                "exchanges"
            };
            text.push_str(&format!(
                "\n• {} {} · started {started} · {} {exchanges}{}",
                short(&c.session_id),
                name_of(c),
                c.exchanges,
                if c.current { " (current)" } else { "" }
            ));
            if !c.current {
                buttons.push(Button::new(
                    format!("↩️ {} {}", short(&c.session_id), name_of(c)),
                    ButtonAction::Resume {
                        session: c.session_id.clone(),
                    },
                ));
            }
        }
        text.push_str("\n\nSend /resume ID (its first characters are enough) or press a button.");
        Reply::command(text).with_buttons(buttons)
    }

    /// /resume ID: make an earlier conversation of this slot current.
    pub(super) async fn resume_command(&self, args: &str, ctx: &DispatchContext) -> Reply {
        let key = &ctx.key;
        if ctx.slot_busy {
            return Reply::command(commands::BUSY_HISTORY_TEXT);
        }
        let Some(store) = self.store() else {
            return Reply::command("This chat keeps no history to go back to.");
        };
        let Some(wanted) = args.split_whitespace().next() else {
            return Reply::command("Which one? /sessions lists them; send /resume ID.");
        };
        let history = match store.sessions.session_history(key.as_str()).await {
            Ok(history) => history,
            Err(error) => {
                tracing::error!(session_key = %key, %error, "could not read the session history");
                return Reply::command("⚠️ I could not read the conversations right now.");
            }
        };
        let session_id = match pick_session(history.iter().map(|h| h.session_id.as_str()), wanted) {
            Ok(id) => id,
            Err(text) => return Reply::command(text),
        };
        match store
            .sessions
            .resume_session(key.as_str(), &session_id)
            .await
        {
            Ok(crate::store::Resumed::Resumed) => {}
            Ok(crate::store::Resumed::AlreadyCurrent) => {
                return Reply::command("That is the current conversation already.")
            }
            Ok(crate::store::Resumed::NotFound) => {
                return Reply::command(
                    "That conversation is not this chat's; /sessions lists them.",
                )
            }
            Err(error) => {
                tracing::error!(session_key = %key, %error, "could not resume a session");
                return Reply::error(
                    "⚠️ I could not switch conversations right now; nothing changed.",
                );
            }
        }
        {
            let mut state = self.state();
            state.trimmed.remove(key);
            state.sessions.set(key, SessionId::new(session_id.clone()));
        }
        tracing::info!(session_key = %key, session_id, "session resumed");
        let listed = store
            .sessions
            .conversations(key.as_str(), usize::MAX)
            .await
            .ok()
            .and_then(|all| all.into_iter().find(|c| c.session_id == session_id));
        Reply::command(match listed {
            Some(c) => {
                format!(
                "↩️ Back to {} ({} {}). Your next message continues it; /new starts a fresh one.",
                name_of(&c),
                c.exchanges,
                if c.exchanges == 1 { "exchange" } else { "exchanges" }
            )
            }
            None => "↩️ Back to that conversation. Your next message continues it.".to_string(),
        })
    }

    /// /title TEXT: name the current conversation (shown by /sessions).
    pub(super) async fn title_command(&self, key: &SessionKey, args: &str) -> Reply {
        let Some(store) = self.store() else {
            return Reply::command("This chat keeps no history to name.");
        };
        if self.resolve_session(key).await.is_err() {
            return Reply::error(STORE_DOWN_TEXT);
        }
        let title = one_line(args, TITLE_CHARS);
        if title.is_empty() {
            let current = store
                .sessions
                .overrides(key.as_str())
                .await
                .ok()
                .and_then(|o| o.get("title").and_then(|t| t.as_str().map(str::to_string)));
            return Reply::command(match current {
                Some(title) => format!("This conversation is called \"{title}\"."),
                None => "This conversation has no title yet; send /title TEXT.".to_string(),
            });
        }
        match store
            .sessions
            .set_override(key.as_str(), "title", serde_json::json!(title))
            .await
        {
            Ok(()) => Reply::command(format!("🏷 This conversation is called \"{title}\" now.")),
            Err(error) => {
                tracing::error!(session_key = %key, %error, "could not record a title");
                Reply::command("⚠️ I could not save the title; please try again later.")
            }
        }
    }
}

/// The one session of `ids` whose id starts with `wanted` (any case), or
/// what the chat is told: none, or several, start with it.
fn pick_session<'a>(ids: impl Iterator<Item = &'a str>, wanted: &str) -> Result<String, String> {
    let wanted = wanted.to_ascii_lowercase();
    let matching: Vec<&str> = ids.filter(|id| id.starts_with(&wanted)).collect();
    match matching.as_slice() {
        [] => Err(format!(
            "This chat has no conversation {wanted}; /sessions lists them."
        )),
        [one] => Ok((*one).to_string()),
        _ => Err(format!(
            "Several conversations start with {wanted}; give more of the id."
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_prefer_the_title_and_fit_one_line() {
        let mut c = crate::store::Conversation {
            session_id: "0123456789abcdef".into(),
            created_at_ms: 0,
            last_active_at_ms: 0,
            current: false,
            title: None,
            first_message: Some("how do I\nfix   the build".into()),
            exchanges: 2,
        };
        assert_eq!(name_of(&c), "\"how do I fix the build\"");
        c.title = Some("Build".into());
        assert_eq!(name_of(&c), "\"Build\"");
        c.title = None;
        c.first_message = None;
        assert_eq!(name_of(&c), "(empty)");
        assert_eq!(short(&c.session_id), "01234567");
        assert_eq!(short("abc"), "abc");
        assert_eq!(one_line(&"x".repeat(70), 60).chars().count(), 61);
    }
}
