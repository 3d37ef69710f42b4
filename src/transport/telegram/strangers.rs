//! Strangers: private messages from users who may not use the bot are
//! answered with their user id (once per user per interval), and the
//! codes they send (`/start CODE`, `/pair CODE`) are redeemed.
//!
//! Every answer goes out from a task of its own: a stranger never holds up
//! the chat's next update. This module owns those answers. It must never
//! let a stranger reach the engine.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::delivery::{ChatTarget, Delivery};
use crate::reply::Reply;

/// Answers strangers (once per user per interval) with their user id.
struct StrangerReplies {
    last: Mutex<HashMap<u64, Instant>>,
    interval: Duration,
}

/// Past this many strangers remembered, those whose interval has passed
/// are forgotten: a flood of strangers cannot grow the map without bound.
const STRANGERS_KEPT: usize = 10_000;

impl StrangerReplies {
    fn new(interval: Duration) -> Self {
        StrangerReplies {
            last: Mutex::new(HashMap::new()),
            interval,
        }
    }

    /// Whether `user`, a stranger, is to be told their id now (and if so,
    /// not again within the interval).
    fn due(&self, user: u64) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.len() > STRANGERS_KEPT {
            last.retain(|_, t| now.duration_since(*t) < self.interval);
        }
        match last.get(&user) {
            Some(t) if now.duration_since(*t) < self.interval => false,
            _ => {
                last.insert(user, now);
                true
            }
        }
    }
}

/// Answers strangers: their id, and the outcome of a code they sent.
pub struct Strangers {
    delivery: Delivery,
    replies: StrangerReplies,
}

impl Strangers {
    /// Strangers told through `delivery`, each at most once per
    /// `interval`.
    pub fn new(delivery: Delivery, interval: Duration) -> Self {
        Strangers {
            delivery,
            replies: StrangerReplies::new(interval),
        }
    }

    /// A private message from `user_id`, who may not use the bot: the log
    /// says how to let them in, and they are told their id (at most once
    /// per interval).
    pub fn refuse(&self, chat_id: i64, user_id: u64) {
        tracing::info!(
            user_id,
            "message from a user who is not allowed (invite them with /invite, \
             or add the id to telegram.allowed_users)"
        );
        if self.replies.due(user_id) {
            // The setting is the owner's business: the log names it.
            let reply = Reply::notice(format!(
                "Sorry, this bot is private. Your user id is {user_id}; \
                 send it to the bot's owner if you should have access, \
                 or send /start CODE with an invite code."
            ));
            self.tell_stranger(chat_id, reply);
        }
    }

    /// Send `reply` to a stranger's private chat: best effort, and never
    /// in the way of the next update.
    fn tell_stranger(&self, chat_id: i64, reply: Reply) {
        let target = ChatTarget {
            chat_id,
            thread_id: None,
            is_group: false,
            user: None,
        };
        let delivery = self.delivery.clone();
        tokio::spawn(async move {
            if let Err(error) = delivery.deliver_reply(target, &reply, None).await {
                tracing::debug!(%error, "could not answer a stranger");
            }
        });
    }

    /// A stranger sent a code (see [`crate::access`]): redeem it and
    /// answer (nothing once they used up their wrong tries).
    pub async fn redeem(
        &self,
        access: &crate::access::Access,
        chat_id: i64,
        user_id: u64,
        name: String,
        code: &str,
    ) {
        use crate::store::Redeemed;
        let name = Some(name).filter(|n| !n.trim().is_empty());
        let redeemed = match access.redeem(user_id, name, code).await {
            Ok(redeemed) => redeemed,
            Err(error) => {
                tracing::error!(user_id, %error, "could not check an access code");
                self.tell_stranger(
                    chat_id,
                    Reply::notice(
                        "⚠️ I could not check that code right now; please try again later.",
                    ),
                );
                return;
            }
        };
        let text = match redeemed {
            Redeemed::Joined(role, crate::store::CodeKind::Pairing) => {
                tracing::info!(
                    user_id,
                    role = role.as_str(),
                    "paired: the bot has its owner"
                );
                "✅ You are the owner of this bot now. Send me a message to start; \
                 /invite adds people, /help lists the commands."
                    .to_string()
            }
            Redeemed::Joined(role, _) => {
                tracing::info!(user_id, role = role.as_str(), "joined by invite");
                format!(
                    "✅ Welcome! You have access to this bot now (as {}). Send me a message \
                     to start; /help lists the commands.",
                    role.as_str()
                )
            }
            Redeemed::AlreadyMember(role) => {
                format!(
                    "You already have access to this bot (as {}).",
                    role.as_str()
                )
            }
            Redeemed::Wrong { tries_left } => {
                tracing::info!(user_id, tries_left, "a wrong access code was sent");
                match tries_left {
                    0 => "That code is not valid. You cannot try another one this hour.".to_string(),
                    1 => "That code is not valid (it may have expired or been used). You can try once more this hour.".to_string(),
                    n => format!("That code is not valid (it may have expired or been used). You can try {n} more times this hour."),
                }
            }
            Redeemed::Silenced => {
                tracing::info!(
                    user_id,
                    "an access code from a user out of tries was ignored"
                );
                return;
            }
            Redeemed::Busy => {
                tracing::warn!(
                    user_id,
                    "access code not checked: too many wrong codes were sent in the last hour"
                );
                if !self.replies.due(user_id) {
                    return;
                }
                "Too many wrong codes were sent to this bot recently; please try again in an hour."
                    .to_string()
            }
        };
        self.tell_stranger(chat_id, Reply::notice(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stranger_is_told_once_per_interval() {
        let replies = StrangerReplies::new(Duration::from_secs(60));
        assert!(replies.due(1));
        assert!(!replies.due(1), "told twice within the interval");
        assert!(replies.due(2), "one stranger silenced another");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!replies.due(1), "told again within the interval");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(replies.due(1), "not told again once the interval passed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_strangers_is_forgotten_once_their_interval_passed() {
        let replies = StrangerReplies::new(Duration::from_secs(60));
        let kept = || replies.last.lock().unwrap().len();
        let limit = STRANGERS_KEPT as u64;
        for user in 0..limit {
            assert!(replies.due(user));
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        // Up to the limit, nobody is forgotten (no pruning on every call).
        assert!(replies.due(limit));
        assert_eq!(kept(), STRANGERS_KEPT + 1);
        // Past it, the expired are forgotten, and only they: the stranger
        // just told is still within their interval.
        assert!(replies.due(limit + 1));
        assert_eq!(kept(), 2, "expired strangers were kept");
        assert!(
            !replies.due(limit),
            "a stranger within their interval was forgotten"
        );
    }
}
