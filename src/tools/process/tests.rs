//! Unit tests of the process registry.

use super::*;
use crate::vocab::SessionKey;
use crate::vocab::SessionSource;

#[test]
fn the_ring_keeps_the_newest_bytes_within_its_cap() {
    let mut ring = OutputRing::new(8);
    ring.push(b"abc");
    ring.push(b"defghij");
    assert_eq!(ring.text(), "cdefghij");
    ring.push(b"0123456789abcdef");
    assert_eq!(ring.text(), "89abcdef");
    let stats = ring.stats();
    assert_eq!((stats.held, stats.cap, stats.total), (8, 8, 26));
    assert_eq!(stats.allocated, 8);
}

#[test]
fn new_output_is_read_once_and_drops_are_counted() {
    let mut ring = OutputRing::new(4);
    ring.push(b"ab");
    assert_eq!(ring.take_new(), ("ab".to_string(), 0));
    assert_eq!(ring.take_new(), (String::new(), 0));
    ring.push(b"cdefgh");
    // "cd" fell out before it was read.
    assert_eq!(ring.take_new(), ("efgh".to_string(), 2));
}

#[test]
fn a_character_cut_by_the_ring_is_dropped() {
    let mut ring = OutputRing::new(4);
    ring.push("xé€".as_bytes()); // x, é (2 bytes), € (3 bytes)
    assert_eq!(ring.text(), "€");
}

#[test]
fn exit_descriptions_read_well() {
    let exit = ExitInfo {
        code: Some(2),
        signal: None,
        killed_on_request: false,
        runtime: Duration::ZERO,
    };
    assert_eq!(exit.describe(), "exit code 2");
    let killed = ExitInfo {
        code: None,
        signal: Some(libc::SIGTERM),
        killed_on_request: true,
        ..exit
    };
    assert_eq!(
        killed.describe(),
        "killed by signal 15 (SIGTERM), killed on request"
    );
}

#[test]
fn ids_are_short_and_unique() {
    let id = unique_id(&[]);
    assert!(id.as_str().starts_with('p'));
    assert_eq!(id.as_str().len(), 5);
}

#[test]
fn scopes_separate_chats_and_unowned_processes() {
    let key = SessionKey::from_raw("a");
    let other = SessionKey::from_raw("b");
    let owner = ProcessOwner {
        session_key: key.clone(),
        source: SessionSource::dm(crate::vocab::Platform::Console, 1),
        spawn_session_id: None,
    };
    assert!(Scope::Chat(&key).admits(Some(&owner)));
    assert!(!Scope::Chat(&other).admits(Some(&owner)));
    assert!(!Scope::Unowned.admits(Some(&owner)));
    assert!(Scope::Unowned.admits(None));
    assert!(!Scope::Chat(&key).admits(None));
}
