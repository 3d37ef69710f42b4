//! Turn identity: *which* session a piece of code is working for.
//!
//! A turn's identity (session key, session id, generation, and where its chat
//! is) is bound to the turn's future with a `tokio::task_local!`, never to
//! process-global state. The Python system this design learns from kept the
//! session key in an environment variable; two concurrent turns raced on that
//! one slot, and a background process started by one chat woke up another.
//! A task-local cannot race: each turn's future carries its own value, nested
//! bindings restore the outer value when they end (also on panic and
//! cancellation, because the binding lives exactly as long as the future), and
//! code running outside any turn sees `None` and must decide explicitly what
//! to do instead.
//!
//! This module owns the identity types ([`SessionId`], [`TurnGeneration`],
//! [`TurnIdentity`]) and the binder. It must never hold a global "current
//! session".

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::session::{SessionKey, SessionSource};

/// The id of one conversation living in a chat slot. It changes on /new and
/// /reset; transcripts belong to a session id. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// Wrap an existing id (from the store, or a test).
    pub fn new(id: impl AsRef<str>) -> SessionId {
        SessionId(Arc::from(id.as_ref()))
    }

    /// A fresh, unique id: a random (version 4) UUID, 122 random bits, e.g.
    /// `0b5f7c1e-9d2a-4e4b-8f0e-3c6a1d2b4e5f`. Collisions are not a
    /// practical concern at any number of chats (an earlier scheme of
    /// seconds plus 24 random bits collided within 10,000 new chats).
    pub fn generate() -> SessionId {
        SessionId::new(uuid::Uuid::new_v4().to_string())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({})", &self.0)
    }
}

/// The generation of a turn in its slot. Generations come from one
/// process-wide counter, so they only grow: a newer turn, or an invalidation
/// by /stop, /new or /reset, always has a larger value than anything before
/// it in the same slot.
///
/// They are also unique across restarts: with a store, the runner moves
/// the counter into a block the store reserved, above every block an
/// earlier process reserved (`runner::generations`). That is what lets a
/// Stop button (24 h) or a draft's stop name its turn by generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnGeneration(pub u64);

/// The process-wide counter: the next generation to hand out.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl TurnGeneration {
    /// The next generation from the process-wide counter.
    pub fn next() -> TurnGeneration {
        TurnGeneration(NEXT_GENERATION.fetch_add(1, Ordering::Relaxed))
    }

    /// What [`TurnGeneration::next`] would hand out now.
    pub fn peek_next() -> u64 {
        NEXT_GENERATION.load(Ordering::Relaxed)
    }

    /// Hand out nothing below `first` from now on. The counter never goes
    /// back: a `first` it already passed changes nothing.
    pub fn advance_to(first: u64) {
        NEXT_GENERATION.fetch_max(first, Ordering::Relaxed);
    }
}

impl fmt::Display for TurnGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// Everything that says whom a turn works for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnIdentity {
    /// The chat slot.
    pub session_key: SessionKey,
    /// The conversation the turn belongs to.
    pub session_id: SessionId,
    /// The turn's generation in its slot.
    pub generation: TurnGeneration,
    /// Where the chat is (to route notifications back).
    pub source: SessionSource,
}

tokio::task_local! {
    static CURRENT_TURN: TurnIdentity;
}

/// Run `future` with `identity` bound as the current turn identity.
///
/// Bindings nest: inside, [`current_identity`] returns `identity`; when the
/// future completes, panics or is dropped (cancelled), the previous binding
/// (or none) is visible again. Nothing else is touched.
pub async fn bind_turn_identity<F: Future>(identity: TurnIdentity, future: F) -> F::Output {
    CURRENT_TURN.scope(identity, future).await
}

/// The identity of the turn the calling code runs in, or `None` outside any
/// turn. Callers outside a turn must choose their own explicit fallback.
pub fn current_identity() -> Option<TurnIdentity> {
    CURRENT_TURN.try_with(Clone::clone).ok()
}

/// The current turn's session id, or `None` outside any turn.
pub fn current_session_id() -> Option<SessionId> {
    CURRENT_TURN.try_with(|t| t.session_id.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Platform;

    #[test]
    fn generations_only_grow() {
        let a = TurnGeneration::next();
        let b = TurnGeneration::next();
        assert!(b > a);
        // Advancing moves the counter forward, never back.
        TurnGeneration::advance_to(b.0 + 100);
        let c = TurnGeneration::next();
        assert!(c.0 >= b.0 + 100);
        TurnGeneration::advance_to(1);
        assert!(TurnGeneration::next() > c);
    }

    #[test]
    fn session_ids_are_128_bit_uuids_that_do_not_collide_in_a_burst() {
        // The old scheme (seconds + 24 random bits) collided about once per
        // 10,000 ids created in the same second.
        let ids: std::collections::HashSet<String> = (0..50_000)
            .map(|_| SessionId::generate().to_string())
            .collect();
        assert_eq!(ids.len(), 50_000);
        for id in ids.iter().take(10) {
            let parsed = uuid::Uuid::parse_str(id).expect("a UUID");
            assert_eq!(parsed.get_version_num(), 4, "{id}");
        }
    }

    #[test]
    fn generated_session_ids_are_distinct() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| SessionId::generate()).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[tokio::test]
    async fn no_identity_outside_a_turn() {
        assert!(current_identity().is_none());
        let id = TurnIdentity {
            session_key: SessionKey::from_raw("k"),
            session_id: SessionId::new("s"),
            generation: TurnGeneration(1),
            source: SessionSource::dm(Platform::Console, 1),
        };
        let seen = bind_turn_identity(id.clone(), async {
            (current_identity(), current_session_id())
        })
        .await;
        assert_eq!(seen, (Some(id), Some(SessionId::new("s"))));
        assert!(current_identity().is_none() && current_session_id().is_none());
    }

    #[test]
    fn logs_show_the_session_id_and_the_generation() {
        // Log lines name turns by these (`session_id=…`, `generation=g…`).
        assert_eq!(format!("{:?}", SessionId::new("s-1")), "SessionId(s-1)");
        assert_eq!(SessionId::new("s-1").to_string(), "s-1");
        assert_eq!(TurnGeneration(7).to_string(), "g7");
    }
}
