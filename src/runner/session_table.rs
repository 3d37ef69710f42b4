//! Which conversation (session id) lives in each chat slot right now.
//!
//! The table is the runner's in-memory view; when a store is configured the
//! runner writes rotations through to it and fills misses from it, so a
//! restart continues every chat's current session.

use std::collections::HashMap;

use crate::vocab::{SessionId, SessionKey};

/// Current session id per slot.
#[derive(Debug, Default)]
pub struct SessionTable {
    current: HashMap<SessionKey, SessionId>,
}

impl SessionTable {
    /// The current session of `key`, if one is known.
    pub fn get(&self, key: &SessionKey) -> Option<&SessionId> {
        self.current.get(key)
    }

    /// The current session of `key`, creating a fresh one if none is known.
    /// Returns the id and whether it was just created.
    pub fn get_or_create(&mut self, key: &SessionKey) -> (SessionId, bool) {
        if let Some(id) = self.current.get(key) {
            return (id.clone(), false);
        }
        let id = SessionId::generate();
        self.current.insert(key.clone(), id.clone());
        (id, true)
    }

    /// Record `id` as the current session of `key` (loaded from the store).
    pub fn set(&mut self, key: &SessionKey, id: SessionId) {
        self.current.insert(key.clone(), id);
    }

    /// Start a fresh session in `key`. Returns (old, new).
    pub fn rotate(&mut self, key: &SessionKey) -> (Option<SessionId>, SessionId) {
        let new = SessionId::generate();
        let old = self.current.insert(key.clone(), new.clone());
        (old, new)
    }
}
