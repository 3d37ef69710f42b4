//! Which conversation (session id) lives in each chat slot right now.
//!
//! The table is the runner's in-memory view; when a store is configured the
//! runner writes rotations through to it and fills misses from it, so a
//! restart continues every chat's current session.
//!
//! It holds an entry for every slot ever seen, busy or idle, so it is most
//! of what an idle chat costs to remember (the W3 figure of
//! `benches/engine.rs`, target ≤ 100 bytes): the key's text in a plain box
//! (no shared-pointer header), and the id, a random UUID for every session
//! telegate makes, in its 16 bytes rather than as 36 characters on the heap.
//! An id of any other shape (older stores, tests) is kept as text beside.

use std::collections::HashMap;

use crate::vocab::{SessionId, SessionKey};

/// Current session id per slot.
#[derive(Debug, Default)]
pub struct SessionTable {
    /// Ids in the canonical form of a UUID (lowercase, hyphenated), as
    /// their 16 bytes; a key is in at most one of the two maps.
    uuids: HashMap<Box<str>, [u8; 16]>,
    /// Every other id, as text.
    others: HashMap<Box<str>, SessionId>,
}

/// The 16 bytes of `id` if it is a UUID written the canonical way (so it
/// reads back as the same text).
fn uuid_bytes(id: &SessionId) -> Option<[u8; 16]> {
    let text = id.as_str();
    if text.len() != uuid::fmt::Hyphenated::LENGTH {
        return None;
    }
    let uuid = uuid::Uuid::try_parse(text).ok()?;
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    (uuid.hyphenated().encode_lower(&mut buf) == text).then(|| *uuid.as_bytes())
}

fn from_bytes(bytes: &[u8; 16]) -> SessionId {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    SessionId::new(
        uuid::Uuid::from_bytes(*bytes)
            .hyphenated()
            .encode_lower(&mut buf),
    )
}

impl SessionTable {
    /// The current session of `key`, if one is known.
    pub fn get(&self, key: &SessionKey) -> Option<SessionId> {
        match self.uuids.get(key.as_str()) {
            Some(bytes) => Some(from_bytes(bytes)),
            None => self.others.get(key.as_str()).cloned(),
        }
    }

    /// The current session of `key`, creating a fresh one if none is known.
    /// Returns the id and whether it was just created.
    pub fn get_or_create(&mut self, key: &SessionKey) -> (SessionId, bool) {
        if let Some(id) = self.get(key) {
            return (id, false);
        }
        let id = SessionId::generate();
        self.set(key, id.clone());
        (id, true)
    }

    /// Record `id` as the current session of `key` (loaded from the store).
    pub fn set(&mut self, key: &SessionKey, id: SessionId) {
        self.insert(key, id);
    }

    /// Start a fresh session in `key`. Returns (old, new).
    pub fn rotate(&mut self, key: &SessionKey) -> (Option<SessionId>, SessionId) {
        let new = SessionId::generate();
        let old = self.insert(key, new.clone());
        (old, new)
    }

    /// Sets `key`'s id; the one it replaces, if any.
    fn insert(&mut self, key: &SessionKey, id: SessionId) -> Option<SessionId> {
        let old = self.get(key);
        match uuid_bytes(&id) {
            Some(bytes) => {
                self.others.remove(key.as_str());
                match self.uuids.get_mut(key.as_str()) {
                    Some(slot) => *slot = bytes,
                    None => {
                        self.uuids.insert(key.as_str().into(), bytes);
                    }
                }
            }
            None => {
                self.uuids.remove(key.as_str());
                match self.others.get_mut(key.as_str()) {
                    Some(slot) => *slot = id,
                    None => {
                        self.others.insert(key.as_str().into(), id);
                    }
                }
            }
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use super::SessionTable;
    use crate::vocab::{SessionId, SessionKey};

    #[test]
    fn ids_of_any_shape_read_back_as_they_were_set() {
        let mut table = SessionTable::default();
        let key = SessionKey::from_raw("agent:main:telegram:dm:1");
        let generated = SessionId::generate();
        let upper = SessionId::new(generated.as_str().to_uppercase());
        for id in [
            SessionId::new("s-1"),
            generated.clone(),
            upper.clone(),
            SessionId::new(""),
            generated.clone(),
        ] {
            table.set(&key, id.clone());
            assert_eq!(table.get(&key), Some(id));
        }
        let (old, new) = table.rotate(&key);
        assert_eq!(old, Some(generated));
        assert_eq!(table.get(&key), Some(new));
        table.set(&key, upper.clone());
        assert_eq!(table.get(&key), Some(upper));
        assert_eq!(table.get(&SessionKey::from_raw("other")), None);
    }

    #[test]
    fn get_or_create_keeps_the_first_id() {
        let mut table = SessionTable::default();
        let key = SessionKey::from_raw("k");
        let (first, created) = table.get_or_create(&key);
        assert!(created);
        assert_eq!(table.get_or_create(&key), (first, false));
    }
}
