//! Forum topics as conversations (`[telegram] topics`).
//!
//! Which slot a message runs in is decided by [`crate::vocab::route`]; this
//! module carries out its one answer that needs Telegram: "create a topic
//! first" (topics `auto`, for `/new` and for a message in a forum's General
//! topic). The topic is created with `createForumTopic` (through the
//! delivery engine, as one unrepeatable request), titled from the message
//! ([`provisional_title`]), and the message is moved into it: its source
//! names the new topic, so its turn runs in the topic's slot and its
//! replies carry the topic's `message_thread_id`. When the topic's first
//! answer is out, the topic is renamed with `editForumTopic` to the task's
//! first line ([`summary_title`]). A topic that cannot be created (no
//! `can_manage_topics` right) is told in the General topic, and the message
//! runs there; so does one over the caps on topics made per minute (per
//! user and per group, [`super::topic_quota`]), its user told once a minute.
//!
//! A closed topic (the service message `forum_topic_closed`, or a request
//! refused with `TOPIC_CLOSED` / "message thread not found") ends its
//! sessions once: every busy slot of the topic gets a `/stop` from its own
//! user, the path a typed /stop takes (the turn and its process end).
//!
//! This module must never decide a slot itself (that is the routing
//! function's) and never await a turn.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use teloxide::payloads::EditForumTopicSetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, MessageId, ThreadId};

use super::topic_quota::{refusal_text, Admission, TopicCaps, TopicQuota};
use crate::adapter::{EventOutcome, OutcomeSink};
use crate::delivery::telegram::Idempotence;
use crate::delivery::{ChatTarget, Delivery};
use crate::engine::Engine;
use crate::reply::DeliveryError;
use crate::reply::{Outbound, Reply};
use crate::store::{TopicClaim, TopicCreations};
use crate::vocab::{
    route, slot_in_topic, BotId, Button, ButtonAction, ChatType, JobButton, KeyPolicy,
    KnownCommand, MessageEvent, MessageKind, Platform, Route, RouteInput, SessionSource,
    TopicsMode,
};

/// Telegram's limit on a topic's name (1-128 characters).
pub const TOPIC_NAME_MAX: usize = 128;
/// A topic's name when `/new` says nothing about the task.
pub const NEW_TOPIC_TITLE: &str = "New conversation";
/// The length of a topic's first name, cut from its first message.
const PROVISIONAL_CHARS: usize = 40;

/// The first non-empty line of `text`, trimmed, cut to `max` UTF-16 units
/// (Telegram counts a name's length so) with `…` when cut (pure).
fn first_line(text: &str, max: usize) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    if line.encode_utf16().count() <= max {
        return Some(line.to_string());
    }
    let mut cut = String::new();
    let mut units = 0;
    for c in line.chars() {
        units += c.len_utf16();
        if units > max - 1 {
            break;
        }
        cut.push(c);
    }
    // At a word's end where there is one in the second half.
    if let Some(space) = cut
        .rfind(char::is_whitespace)
        .filter(|&at| at > cut.len() / 2)
    {
        cut.truncate(space);
    }
    Some(format!("{}…", cut.trim_end()))
}

/// A new topic's name, from the message that makes it: its first line,
/// short (pure).
pub fn provisional_title(text: &str) -> String {
    first_line(text, PROVISIONAL_CHARS).unwrap_or_else(|| NEW_TOPIC_TITLE.to_string())
}

/// The name a topic gets once its first answer is out: the task's first
/// line, at most [`TOPIC_NAME_MAX`] (pure).
pub fn summary_title(text: &str) -> Option<String> {
    first_line(text, TOPIC_NAME_MAX)
}

/// Said when a message's topic may have been made before a restart
/// without its id being kept: the message runs where it was written.
pub const UNCLEAR_TOPIC_TEXT: &str = "⚠️ I was restarted while making a topic for this message: \
     a topic may have been made for it without me knowing which. I answer here instead.";

/// `/new the task`: the task (`args`) is the topic's first message.
fn with_task_text(mut event: MessageEvent, args: Option<String>) -> MessageEvent {
    if let Some(args) = args.filter(|a| !a.is_empty()) {
        event.text = args;
        event.kind = MessageKind::Text;
    }
    event
}

/// A topic this process created, until it got its summary name.
struct Naming {
    /// The name it has now.
    current: String,
    /// The name it gets after its first answer (its first message's first
    /// line); `None` until that message came (a bare `/new`).
    summary: Option<String>,
}

/// The forum topics of one bot.
pub struct Topics {
    /// The bot the topics are made by (the first coordinate of a slot).
    bot: BotId,
    policy: KeyPolicy,
    delivery: Delivery,
    /// Replies with buttons (a closed topic's jobs).
    outbound: Arc<dyn Outbound>,
    /// Which topic was made for which message (a replay finds its own).
    creations: TopicCreations,
    naming: Mutex<HashMap<(i64, i32), Naming>>,
    ended: Mutex<HashSet<(i64, i32)>>,
    /// The topics made per user and per group in the last minute.
    quota: Mutex<TopicQuota>,
}

impl Topics {
    /// Topics under `policy` (its `topics` mode), created through
    /// `delivery`, at most `caps` a minute.
    pub fn new(
        bot: BotId,
        policy: KeyPolicy,
        caps: TopicCaps,
        delivery: Delivery,
        outbound: Arc<dyn Outbound>,
        creations: TopicCreations,
    ) -> Arc<Topics> {
        Arc::new(Topics {
            bot,
            policy,
            delivery,
            outbound,
            creations,
            naming: Mutex::default(),
            ended: Mutex::default(),
            quota: Mutex::new(TopicQuota::new(caps)),
        })
    }

    /// Place one message: in the topic it names, or (the route says
    /// "create a topic first") in a topic made for it.
    pub async fn place(&self, mut event: MessageEvent) -> MessageEvent {
        if let Some(thread) = event.source.thread_id {
            // A message in a topic: it is open (again).
            self.lock_ended().remove(&(event.source.chat_id, thread));
        }
        if self.policy.topics != TopicsMode::Auto || event.internal {
            return event;
        }
        if route(self.bot, &RouteInput::arrived(&event), self.policy) != Route::CreateTopic {
            self.note_first_message(&event);
            return event;
        }
        let args = event
            .command()
            .filter(|c| c.is(KnownCommand::New))
            .map(|c| c.args.trim().to_string());
        let task = args.clone().unwrap_or_else(|| event.text.clone());
        let name = provisional_title(&task);
        let chat_id = event.source.chat_id;
        let created = match self.claim(&event).await {
            TopicClaim::Made(thread) => {
                // Replayed after a restart: the topic made for it before.
                event.source.thread_id = Some(thread);
                return with_task_text(event, args);
            }
            TopicClaim::Unclear => {
                self.tell(&event, UNCLEAR_TOPIC_TEXT.to_string());
                return event;
            }
            TopicClaim::New => match self.admit(&event) {
                Ok(()) => self.create(&event.source, &name).await,
                Err(refused) => {
                    // Recorded as a refused creation: a replay runs it
                    // where it was written too.
                    self.record_creation(&event, &Err(refused)).await;
                    return event;
                }
            },
        };
        self.record_creation(&event, &created).await;
        match created {
            Ok(thread) => {
                tracing::info!(
                    chat_id,
                    thread,
                    "a forum topic was created for a conversation"
                );
                event.source.thread_id = Some(thread);
                let summary = summary_title(&task);
                self.lock_naming().insert(
                    (chat_id, thread),
                    Naming {
                        current: name,
                        summary,
                    },
                );
                with_task_text(event, args)
            }
            Err(error) => {
                tracing::warn!(chat_id, %error, "could not create a forum topic; the message runs where it was written");
                self.tell(
                    &event,
                    format!(
                        "⚠️ I could not create a topic for this conversation ({error}). \
                         Give me the right to manage topics, or set topics = \"per-topic\"."
                    ),
                );
                event
            }
        }
    }

    /// What the store knew of `event`'s topic; a message without an id,
    /// or a store that fails, makes its topic as if new (logged).
    async fn claim(&self, event: &MessageEvent) -> TopicClaim {
        let Some(message_id) = event.message_id else {
            return TopicClaim::New;
        };
        match self
            .creations
            .begin_topic(event.source.chat_id, message_id)
            .await
        {
            Ok(claim) => claim,
            Err(error) => {
                tracing::error!(%error, "could not record a topic's creation; a replay may make it again");
                TopicClaim::New
            }
        }
    }

    /// The creation's answer, kept for a replay.
    async fn record_creation(&self, event: &MessageEvent, created: &Result<i32, DeliveryError>) {
        let Some(message_id) = event.message_id else {
            return;
        };
        let chat_id = event.source.chat_id;
        let recorded = match created {
            Ok(thread) => {
                self.creations
                    .topic_made(chat_id, message_id, *thread)
                    .await
            }
            Err(_) => self.creations.topic_refused(chat_id, message_id).await,
        };
        if let Err(error) = recorded {
            tracing::error!(chat_id, %error, "could not record a topic's creation");
        }
    }

    /// Whether `event`'s user may have a topic made now (the caps); a
    /// refusal is told to them once a minute at most.
    fn admit(&self, event: &MessageEvent) -> Result<(), DeliveryError> {
        let source = &event.source;
        let admitted = self
            .quota
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(source.chat_id, source.user_id, std::time::Instant::now());
        let Admission::Refused { cap, tell } = admitted else {
            return Ok(());
        };
        tracing::info!(
            chat_id = source.chat_id,
            ?cap,
            "topics are made too fast; the message runs where it was written"
        );
        if tell {
            self.tell(event, refusal_text(cap));
        }
        Err(DeliveryError::Rejected(format!("topic cap {cap:?}")))
    }

    /// A notice where `event` was written, without holding the message.
    fn tell(&self, event: &MessageEvent, text: String) {
        let reply = Reply::notice(text);
        let delivery = self.delivery.clone();
        let target = ChatTarget::of(&event.source);
        tokio::spawn(async move {
            let _ = delivery.deliver_reply(target, &reply, None).await;
        });
    }

    /// `createForumTopic` for the message of `source`: the new topic's id.
    async fn create(&self, source: &SessionSource, name: &str) -> Result<i32, DeliveryError> {
        let chat_id = source.chat_id;
        // Paced as the user's request: a burst of creations takes its
        // user's turns in the chat, not everyone's.
        let target = ChatTarget {
            chat_id,
            thread_id: None,
            is_group: true,
            user: source.user_id,
        };
        let bot = self.delivery.bot().clone();
        let name = name.to_string();
        let topic = self
            .delivery
            .call(target, Idempotence::Unsafe, |_| {
                bot.create_forum_topic(ChatId(chat_id), name.clone()).send()
            })
            .await?
            .ok_or_else(|| DeliveryError::Rejected("no topic in the answer".into()))?;
        Ok(topic.thread_id.0 .0)
    }

    /// The first message in a topic made by a bare `/new` names its task.
    fn note_first_message(&self, event: &MessageEvent) {
        let Some(thread) = event.source.thread_id else {
            return;
        };
        if event.kind == MessageKind::Command {
            return;
        }
        let mut naming = self.lock_naming();
        if let Some(n) = naming.get_mut(&(event.source.chat_id, thread)) {
            if n.summary.is_none() {
                n.summary = summary_title(&event.text);
            }
        }
    }

    /// A message of `source` was answered: a topic made for it whose first
    /// answer this is gets its summary name.
    pub fn answered(&self, source: &SessionSource) {
        let Some(thread) = source.thread_id else {
            return;
        };
        let at = (source.chat_id, thread);
        let name = {
            let mut naming = self.lock_naming();
            let Some(summary) = naming.get(&at).and_then(|n| n.summary.clone()) else {
                return;
            };
            let current = naming.remove(&at).map(|n| n.current);
            if current.as_deref() == Some(summary.as_str()) {
                return;
            }
            summary
        };
        let delivery = self.delivery.clone();
        tokio::spawn(async move {
            let bot = delivery.bot().clone();
            let target = ChatTarget {
                chat_id: at.0,
                thread_id: Some(at.1),
                is_group: true,
                user: None,
            };
            let renamed = delivery
                .call(target, Idempotence::Safe, |_| {
                    bot.edit_forum_topic(ChatId(at.0), ThreadId(MessageId(at.1)))
                        .name(name.clone())
                        .send()
                })
                .await;
            if let Err(error) = renamed {
                tracing::info!(chat_id = at.0, thread = at.1, %error, "could not rename a forum topic");
            }
        });
    }

    /// The topic `thread` of `chat_id` was closed or deleted: each of its
    /// busy slots is stopped, once per closing.
    pub async fn end(&self, engine: &Engine, chat_id: i64, thread: i32) {
        if !self.lock_ended().insert((chat_id, thread)) {
            return;
        }
        self.lock_naming().remove(&(chat_id, thread));
        let forum = SessionSource {
            chat_type: ChatType::Supergroup,
            ..SessionSource::dm(Platform::Telegram, chat_id)
        };
        let mut stopped = 0;
        for key in engine.adapter.busy_keys() {
            let Some(user_id) = slot_in_topic(&key, &forum, thread) else {
                continue;
            };
            let owner = SessionSource {
                thread_id: Some(thread),
                user_id,
                ..forum.clone()
            };
            engine
                .adapter
                .handle_message(MessageEvent::text(owner, "/stop"))
                .await;
            stopped += 1;
        }
        // An agent kept for the topic's slots (idle between turns) goes too.
        let topic = forum.clone();
        let in_topic =
            move |key: &crate::vocab::SessionKey| slot_in_topic(key, &topic, thread).is_some();
        let agents = engine.runner.end_agent_slots(&in_topic).await;
        tracing::info!(
            chat_id,
            thread,
            stopped,
            agents,
            "a forum topic was closed; its sessions ended"
        );
        self.offer_to_delete_jobs(engine, &forum, thread).await;
    }

    /// A closed topic's scheduled jobs stay unless the user says so: a
    /// Delete button each, in the General topic.
    async fn offer_to_delete_jobs(&self, engine: &Engine, forum: &SessionSource, thread: i32) {
        let Some(jobs) = engine.runner.jobs() else {
            return;
        };
        let Ok(listed) = jobs.list(forum.chat_id).await else {
            return;
        };
        let ids: Vec<i64> = listed
            .iter()
            .filter(|job| job.thread_id == Some(thread))
            .map(|job| job.id)
            .collect();
        if ids.is_empty() {
            return;
        }
        let buttons = ids
            .iter()
            .map(|&id| {
                let action = ButtonAction::Job {
                    id,
                    change: JobButton::Delete,
                };
                Button::new(format!("🗑 Also delete job {id}"), action)
            })
            .collect();
        let text = format!(
            "A topic was closed; its {} scheduled job(s) are kept ({}). Delete them?",
            ids.len(),
            ids.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let reply = Reply::notice(text).with_buttons(buttons);
        if let Err(error) = self.outbound.deliver(forum, reply).await {
            tracing::info!(%error, "could not offer to delete a closed topic's jobs");
        }
    }

    fn lock_naming(&self) -> std::sync::MutexGuard<'_, HashMap<(i64, i32), Naming>> {
        self.naming.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_ended(&self) -> std::sync::MutexGuard<'_, HashSet<(i64, i32)>> {
        self.ended.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// End the sessions of every topic a request of `delivery` found closed or
/// deleted, until `stop`.
pub fn end_gone_topics(
    topics: Arc<Topics>,
    engine: Engine,
    delivery: &Delivery,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut gone = delivery.watch_gone_topics();
    tokio::spawn(async move {
        loop {
            let (chat_id, thread) = tokio::select! {
                () = stop.cancelled() => return,
                next = gone.recv() => match next {
                    Some(topic) => topic,
                    None => return,
                },
            };
            topics.end(&engine, chat_id, thread).await;
        }
    });
}

/// The adapter's outcomes, also seen by the topics (a topic's first answer
/// renames it).
pub struct TopicOutcomes {
    /// Where the outcomes are recorded (the inbox).
    pub inner: Arc<dyn OutcomeSink>,
    /// The topics told of answers.
    pub topics: Arc<Topics>,
}

impl OutcomeSink for TopicOutcomes {
    fn record(&self, source: &SessionSource, message_id: i64, outcome: EventOutcome) {
        self.inner.record(source, message_id, outcome);
        if outcome == EventOutcome::Answered {
            self.topics.answered(source);
        }
    }

    fn journal<'a>(&'a self, event: &'a MessageEvent) -> BoxFuture<'a, Option<i64>> {
        self.inner.journal(event)
    }
}

#[cfg(test)]
mod tests {
    use super::{provisional_title, summary_title, NEW_TOPIC_TITLE, TOPIC_NAME_MAX};

    #[test]
    fn a_topic_is_named_from_its_first_line() {
        assert_eq!(
            provisional_title("  \n Fix the login bug \nmore"),
            "Fix the login bug"
        );
        assert_eq!(provisional_title(""), NEW_TOPIC_TITLE);
        assert_eq!(
            provisional_title("Please fix the login bug in auth.rs: users are logged out"),
            "Please fix the login bug in auth.rs:…"
        );
        assert_eq!(summary_title("   "), None);
        let long = "word ".repeat(60);
        let summary = summary_title(&long).unwrap();
        assert!(
            summary.encode_utf16().count() <= TOPIC_NAME_MAX,
            "{summary}"
        );
        assert!(summary.ends_with('…'));
        // UTF-16 units, as Telegram counts them: 127 emoji do not fit.
        let emoji = "😀".repeat(127);
        assert!(summary_title(&emoji).unwrap().encode_utf16().count() <= TOPIC_NAME_MAX);
    }
}
