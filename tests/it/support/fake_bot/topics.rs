//! Forum topics as Telegram keeps them: `createForumTopic`,
//! `editForumTopic`, `closeForumTopic`, `deleteForumTopic` (only in a forum
//! supergroup, only with `can_manage_topics`, names of 1-128 characters),
//! the service messages a topic's creation and closing leave, and the
//! topic a send names checked (closed: `TOPIC_CLOSED`; deleted or never
//! made: "message thread not found").

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

use super::params::{chat_id_param, int_param, str_param};
use super::state::{bump, ApiFailure, Inner};
use super::telegram::{
    NOT_A_FORUM, NO_TOPIC_RIGHTS, THREAD_NOT_FOUND, TOPIC_CLOSED, TOPIC_NAME_MAX,
    TOPIC_NOT_MODIFIED, TOPIC_TITLE_EMPTY,
};
use super::types::ChatType;
use super::updates::{set_text, unix_now, user_json};
use super::FakeBotApi;

/// One forum supergroup's topics and the bot's right to manage them.
#[derive(Clone, Debug, Default)]
pub(super) struct Forum {
    pub(super) can_manage_topics: bool,
    pub(super) topics: BTreeMap<i64, Topic>,
}

/// A forum topic (its id is the id of the message that created it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topic {
    pub name: String,
    pub closed: bool,
    pub deleted: bool,
}

/// The forums of the fake, by chat id.
pub(super) type Forums = HashMap<i64, Forum>;

const ICON_COLOR: i64 = 7_322_096;

fn topic_name(name: &str) -> Result<(), ApiFailure> {
    if name.trim().is_empty() {
        return Err(ApiFailure::bad_request(TOPIC_TITLE_EMPTY));
    }
    if name.chars().count() > TOPIC_NAME_MAX {
        return Err(ApiFailure::bad_request(format!(
            "Bad Request: topic name must be at most {TOPIC_NAME_MAX} characters"
        )));
    }
    Ok(())
}

impl Inner {
    fn forum_mut(&mut self, chat_id: i64) -> Result<&mut Forum, ApiFailure> {
        self.forums
            .get_mut(&chat_id)
            .filter(|_| self.chat_types.get(&chat_id) == Some(&ChatType::Supergroup))
            .ok_or_else(|| ApiFailure::bad_request(NOT_A_FORUM))
    }

    fn topic_mut(&mut self, body: &Value) -> Result<(i64, i64, &mut Topic), ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let thread = int_param(body, "message_thread_id")?
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: message thread not specified"))?;
        let forum = self.forum_mut(chat_id)?;
        if !forum.can_manage_topics {
            return Err(ApiFailure::bad_request(NO_TOPIC_RIGHTS));
        }
        let topic = forum
            .topics
            .get_mut(&thread)
            .filter(|t| !t.deleted)
            .ok_or_else(|| ApiFailure::bad_request(THREAD_NOT_FOUND))?;
        Ok((chat_id, thread, topic))
    }

    /// A service message in topic `thread` of `chat_id`, from `from`.
    fn topic_service_message(
        &mut self,
        chat_id: i64,
        thread: i64,
        from: Value,
        what: (&str, Value),
    ) {
        let message_id = self.allocate_message_id(chat_id);
        let mut message = json!({
            "message_id": message_id,
            "from": from,
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
            "message_thread_id": thread,
            "is_topic_message": true,
        });
        message[what.0] = what.1;
        self.enqueue_update(json!({ "message": message }));
    }

    pub(super) fn create_forum_topic(
        &mut self,
        bot: Value,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let name = str_param(body, "name")?.unwrap_or_default();
        let forum = self.forum_mut(chat_id)?;
        if !forum.can_manage_topics {
            return Err(ApiFailure::bad_request(NO_TOPIC_RIGHTS));
        }
        topic_name(&name)?;
        let thread = self.allocate_message_id(chat_id);
        let topic = Topic {
            name: name.clone(),
            closed: false,
            deleted: false,
        };
        self.forum_mut(chat_id)?.topics.insert(thread, topic);
        // The topic's first message is the service message that made it
        // (its id is the topic's id).
        let message = json!({
            "message_id": thread,
            "from": bot,
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
            "message_thread_id": thread,
            "is_topic_message": true,
            "forum_topic_created": {"name": name, "icon_color": ICON_COLOR},
        });
        self.enqueue_update(json!({ "message": message }));
        Ok(json!({"message_thread_id": thread, "name": name, "icon_color": ICON_COLOR}))
    }

    pub(super) fn edit_forum_topic(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let name = str_param(body, "name")?;
        if let Some(name) = name.as_deref().filter(|n| !n.is_empty()) {
            topic_name(name)?;
        }
        let (_, _, topic) = self.topic_mut(body)?;
        match name.filter(|n| !n.is_empty()) {
            Some(name) if name != topic.name => topic.name = name,
            _ => return Err(ApiFailure::bad_request(TOPIC_NOT_MODIFIED)),
        }
        Ok(json!(true))
    }

    pub(super) fn close_forum_topic(
        &mut self,
        bot: Value,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let (chat_id, thread, topic) = self.topic_mut(body)?;
        if topic.closed {
            return Err(ApiFailure::bad_request(TOPIC_NOT_MODIFIED));
        }
        topic.closed = true;
        self.topic_service_message(chat_id, thread, bot, ("forum_topic_closed", json!({})));
        Ok(json!(true))
    }

    pub(super) fn delete_forum_topic(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let (_, _, topic) = self.topic_mut(body)?;
        topic.deleted = true;
        Ok(json!(true))
    }

    /// A message sent into `message_thread_id` of a forum: the topic must
    /// exist and be open.
    pub(super) fn check_thread(&self, body: &Value) -> Result<(), ApiFailure> {
        let Some(thread) = int_param(body, "message_thread_id")? else {
            return Ok(());
        };
        let chat_id = chat_id_param(body)?;
        let Some(forum) = self.forums.get(&chat_id) else {
            return Ok(());
        };
        match forum.topics.get(&thread) {
            Some(topic) if topic.deleted => Err(ApiFailure::bad_request(THREAD_NOT_FOUND)),
            Some(topic) if topic.closed => Err(ApiFailure::bad_request(TOPIC_CLOSED)),
            Some(_) => Ok(()),
            None => Err(ApiFailure::bad_request(THREAD_NOT_FOUND)),
        }
    }
}

impl FakeBotApi {
    /// Makes `chat_id` a forum supergroup (topics on); the bot may manage
    /// its topics only with `can_manage_topics`.
    pub fn make_forum(&self, chat_id: i64, can_manage_topics: bool) {
        let mut inner = self.shared.lock();
        inner.chat_types.insert(chat_id, ChatType::Supergroup);
        let forum = inner.forums.entry(chat_id).or_default();
        forum.can_manage_topics = can_manage_topics;
    }

    /// A topic a user made (as in Telegram's app).
    pub fn add_topic(&self, chat_id: i64, name: &str) -> i64 {
        let mut inner = self.shared.lock();
        let thread = inner.allocate_message_id(chat_id);
        let topic = Topic {
            name: name.to_owned(),
            closed: false,
            deleted: false,
        };
        inner
            .forums
            .entry(chat_id)
            .or_default()
            .topics
            .insert(thread, topic);
        thread
    }

    /// Queues a text from `user_id` in topic `thread` of a forum (`None`:
    /// its General topic).
    pub fn push_topic_text(
        &self,
        chat_id: i64,
        user_id: i64,
        thread: Option<i64>,
        text: &str,
    ) -> i64 {
        let message = {
            let mut inner = self.shared.lock();
            let message_id = inner.allocate_message_id(chat_id);
            let mut message = inner.user_message_base(chat_id, user_id, message_id);
            set_text(&mut message, "text", "entities", text);
            if let Some(thread) = thread {
                message["message_thread_id"] = json!(thread);
                message["is_topic_message"] = json!(true);
            }
            message
        };
        self.push_update(json!({ "message": message }))
    }

    /// `user_id` closes topic `thread` (Telegram sends the service message).
    pub fn close_topic_as_user(&self, chat_id: i64, user_id: i64, thread: i64) {
        {
            let mut inner = self.shared.lock();
            if let Some(topic) = inner
                .forums
                .get_mut(&chat_id)
                .and_then(|f| f.topics.get_mut(&thread))
            {
                topic.closed = true;
            }
            inner.topic_service_message(
                chat_id,
                thread,
                user_json(user_id),
                ("forum_topic_closed", json!({})),
            );
        }
        self.shared.updates_tx.send_modify(bump);
    }

    /// Topic `thread` is closed with no update reaching the bot (as when
    /// the bot missed the service message): sends into it are refused.
    pub fn close_topic_quietly(&self, chat_id: i64, thread: i64) {
        let mut inner = self.shared.lock();
        if let Some(topic) = inner
            .forums
            .get_mut(&chat_id)
            .and_then(|f| f.topics.get_mut(&thread))
        {
            topic.closed = true;
        }
    }

    /// A user deletes topic `thread` (Telegram sends no update for it).
    pub fn delete_topic_as_user(&self, chat_id: i64, thread: i64) {
        let mut inner = self.shared.lock();
        if let Some(topic) = inner
            .forums
            .get_mut(&chat_id)
            .and_then(|f| f.topics.get_mut(&thread))
        {
            topic.deleted = true;
        }
    }

    /// The topics of a forum, by id.
    pub fn topics(&self, chat_id: i64) -> BTreeMap<i64, Topic> {
        self.shared
            .lock()
            .forums
            .get(&chat_id)
            .map(|f| f.topics.clone())
            .unwrap_or_default()
    }
}
