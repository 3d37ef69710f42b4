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
//! This module owns that one rule, as a pure function, so every control that
//! acts on somebody's turn (commands, buttons, scheduled jobs) asks the same
//! question. It must never look anything up itself: callers pass who
//! started the turn, who acts, and who decides for anyone.

/// Who may decide about anybody's turn or job (besides its own user).
pub trait Deciders {
    /// True when `user` may act on work somebody else started.
    fn decides_for_anyone(&self, user: u64) -> bool;
}

impl Deciders for [u64] {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.contains(&user)
    }
}

impl<const N: usize> Deciders for [u64; N] {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.contains(&user)
    }
}

impl Deciders for Vec<u64> {
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.contains(&user)
    }
}

/// May `actor` decide about a turn started by `started_by`?
///
/// True when the actor is the user who started the turn, or one of the
/// `deciders` (the configured approvers, or with roles the owner and the
/// admins). An unknown actor (no user id: a channel post, an anonymous
/// admin) may never decide; a turn with no known starter (started outside
/// any chat) is decided by the deciders only.
pub fn may_decide<D: Deciders + ?Sized>(
    started_by: Option<u64>,
    actor: Option<u64>,
    deciders: &D,
) -> bool {
    match actor {
        None => false,
        Some(actor) => started_by == Some(actor) || deciders.decides_for_anyone(actor),
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

    #[test]
    fn the_starter_and_the_approvers_decide_nobody_else() {
        assert!(may_decide(Some(1), Some(1), &[]));
        assert!(!may_decide(Some(1), Some(2), &[]));
        assert!(may_decide(Some(1), Some(2), &[2]));
        assert!(!may_decide(Some(1), None, &[1]));
        assert!(!may_decide(None, None, &[]));
        assert!(!may_decide(None, Some(3), &[]));
        assert!(may_decide(None, Some(3), &[3]));
    }

    /// Decides for user 9 only, like an admin known from the store.
    struct NineIsAdmin;

    impl Deciders for NineIsAdmin {
        fn decides_for_anyone(&self, user: u64) -> bool {
            user == 9
        }
    }

    #[test]
    fn roles_decide_like_approvers() {
        assert!(may_decide(Some(1), Some(9), &NineIsAdmin));
        assert!(!may_decide(Some(1), Some(2), &NineIsAdmin));
        assert!(may_decide(Some(2), Some(2), &NineIsAdmin));
        assert!(!may_decide(Some(1), None, &NineIsAdmin));
        assert!(may_decide(Some(1), Some(4), &vec![4]));
    }

    #[test]
    fn the_refusal_names_who_can() {
        assert!(who_may_decide(Some("Ann"), Some(1)).contains("Only Ann"));
        assert!(who_may_decide(None, Some(7)).contains("user 7"));
    }
}
