//! Who may decide about a running turn: approve or deny its command (and,
//! for the buttons, stop it).
//!
//! In a group whose members share one session (`group_sessions_per_user =
//! false`), or in an `allowed_chats` group open to strangers, anyone could
//! otherwise answer `/approve` to a dangerous command another user's turn
//! asked for. Only the user whose message started the turn, or a user in
//! `[telegram] approvers`, may decide.
//!
//! With teams ([`crate::access`]), the owner and the admins decide for
//! anyone as well: [`Deciders`] is who may act on someone else's work (a
//! plain list of approvers, or the roles, which count the config's
//! approvers as admins).
//!
//! Authority is checked anew at every decision, with the actor's
//! *current* standing: having started a turn, been shown a button or had
//! a message accepted earlier gives nobody a say once their access is gone
//! ([`Deciders::may_use`] is asked at the moment of the decision).
//!
//! This module owns that one rule, as a pure function, so every control that
//! acts on somebody's turn (commands, buttons, scheduled jobs) asks the same
//! question. It must never look anything up itself: callers pass who
//! started the turn, who acts, where, and who decides (the [`Deciders`]).

/// Who may decide about anybody's turn or job (besides its own user), and
/// who may use the bot at all, as things stand now.
pub trait Deciders {
    /// True when `user` may act on work somebody else started.
    fn decides_for_anyone(&self, user: u64) -> bool;

    /// True when `user` may use the bot in chat `chat_id` now (with a
    /// team: a member, someone the config lets in, or anyone in an open
    /// chat). Asked at every decision, so access taken away counts at once.
    fn may_use(&self, user: u64, chat_id: i64) -> bool;
}

// A plain list of approvers (no team): who reaches the bot is the
// config's allowlist, which does not change while the bot runs, so
// whoever got a message or a button through still may use it.

impl Deciders for [u64] {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.contains(&user)
    }

    fn may_use(&self, _user: u64, _chat_id: i64) -> bool {
        true
    }
}

impl<const N: usize> Deciders for [u64; N] {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.as_slice().decides_for_anyone(user)
    }

    fn may_use(&self, _user: u64, _chat_id: i64) -> bool {
        true
    }
}

impl Deciders for Vec<u64> {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.as_slice().decides_for_anyone(user)
    }

    fn may_use(&self, _user: u64, _chat_id: i64) -> bool {
        true
    }
}

/// May `actor`, acting in chat `chat_id`, decide about a turn (or job)
/// started by `started_by`?
///
/// True when the actor may use the bot there now ([`Deciders::may_use`])
/// and is the user who started the turn, or one of the `deciders` (the
/// configured approvers, or with roles the owner and the admins). An
/// unknown actor (no user id: a channel post, an anonymous admin) may
/// never decide; a turn with no known starter (started outside any chat)
/// is decided by the deciders only; a starter whose access was taken away
/// decides nothing, not even about their own turn.
pub fn may_decide<D: Deciders + ?Sized>(
    started_by: Option<u64>,
    actor: Option<u64>,
    chat_id: i64,
    deciders: &D,
) -> bool {
    match actor {
        None => false,
        Some(actor) => {
            deciders.may_use(actor, chat_id)
                && (started_by == Some(actor) || deciders.decides_for_anyone(actor))
        }
    }
}

/// The sentence telling someone else who may decide, e.g. "Only Ann (who
/// started this task) or an approver can answer it."
pub fn who_may_decide(started_by_name: Option<&str>, started_by: Option<u64>) -> String {
    let starter = match (started_by_name, started_by) {
        (Some(name), _) if !name.trim().is_empty() => name.to_string(),
        (_, Some(id)) => format!("user {id}"),
        _ => "the user who started this task".to_string(),
    };
    format!(
        "Only {starter} (who started this task), an admin or one of this bot's approvers can answer it."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: i64 = 100;

    #[test]
    fn the_starter_and_the_approvers_decide_nobody_else() {
        assert!(may_decide(Some(1), Some(1), CHAT, &[]));
        assert!(!may_decide(Some(1), Some(2), CHAT, &[]));
        assert!(may_decide(Some(1), Some(2), CHAT, &[2]));
        assert!(!may_decide(Some(1), None, CHAT, &[1]));
        assert!(!may_decide(None, None, CHAT, &[]));
        assert!(!may_decide(None, Some(3), CHAT, &[]));
        assert!(may_decide(None, Some(3), CHAT, &[3]));
    }

    /// Decides for user 9 only, like an admin known from the store; user 5
    /// was revoked (no access anywhere), user 6 may use only chat 100.
    struct NineIsAdmin;

    impl Deciders for NineIsAdmin {
        fn decides_for_anyone(&self, user: u64) -> bool {
            user == 9
        }

        fn may_use(&self, user: u64, chat_id: i64) -> bool {
            match user {
                5 => false,
                6 => chat_id == CHAT,
                _ => true,
            }
        }
    }

    #[test]
    fn roles_decide_like_approvers() {
        assert!(may_decide(Some(1), Some(9), CHAT, &NineIsAdmin));
        assert!(!may_decide(Some(1), Some(2), CHAT, &NineIsAdmin));
        assert!(may_decide(Some(2), Some(2), CHAT, &NineIsAdmin));
        assert!(!may_decide(Some(1), None, CHAT, &NineIsAdmin));
        assert!(may_decide(Some(1), Some(4), CHAT, &vec![4]));
    }

    #[test]
    fn a_starter_without_access_now_decides_nothing() {
        assert!(!may_decide(Some(5), Some(5), CHAT, &NineIsAdmin));
        assert!(may_decide(Some(6), Some(6), CHAT, &NineIsAdmin));
        assert!(!may_decide(Some(6), Some(6), CHAT + 1, &NineIsAdmin));
    }

    #[test]
    fn the_refusal_names_who_can() {
        assert!(who_may_decide(Some("Ann"), Some(1)).contains("Only Ann"));
        assert!(who_may_decide(None, Some(7)).contains("user 7"));
    }
}
