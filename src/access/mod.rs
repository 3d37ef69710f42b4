//! Who may use the bot, and as what: the config's allowlist plus the team
//! built from the chat (pairing, invites, roles).
//!
//! * **Pairing.** While nobody may use the bot (no `allowed_users`, no
//!   open chat, no owner yet), a start prints a one-time pairing code
//!   ([`pairing`]); the first user to send `/pair CODE` becomes the owner.
//! * **Invites.** The owner or an admin makes a single-use, expiring code
//!   (`/invite [role]`, also a `t.me/<bot>?start=<code>` link); a stranger
//!   who sends it (`/start CODE`) joins with that role.
//! * **Roles** ([`roles`]): owner, admin, user; the config's `approvers`
//!   are admins and its `allowed_users` users, both "from config" (the
//!   chat cannot change them). Admins and the owner decide about anyone's
//!   approvals, Stop buttons and jobs ([`Deciders`]).
//!
//! Everything is in the store ([`crate::store::users`]); [`Access`] keeps a
//! copy of the members in memory, changed only together with the store, so
//! classifying a message never waits for a store call. Codes are stored as
//! hashes, compared in constant time, and never logged (the start's one
//! print excepted); wrong codes are limited per user and for everybody,
//! in the store, so a restart does not give a guesser new tries.
//!
//! This module owns those rules and the team commands' answers
//! ([`commands`]). It must never send anything (callers deliver the texts)
//! and never hold its lock across an `.await`.

pub mod codes;
pub mod commands;
pub mod pairing;
pub mod roles;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use serde::Deserialize;

pub use roles::{Origin, Role, Standing};

use crate::clock::Clock;
use crate::store::{Attempt, CodeKind, GuessLimits, Member, NewCode, Redeemed, StoreError, Users};
use crate::tools::authority::Deciders;

/// `[access]`: pairing codes, invites, guessing limits.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessConfig {
    /// Minutes a pairing code works.
    #[serde(default = "default_pairing_minutes")]
    pub pairing_code_minutes: u64,
    /// Hours an invite works.
    #[serde(default = "default_invite_hours")]
    pub invite_hours: u64,
    /// Wrong codes one user may send per hour; after that they get no
    /// answer until the hour has passed.
    #[serde(default = "default_wrong_per_user")]
    pub wrong_codes_per_user: u32,
    /// Wrong codes everybody together may send per hour; after that no
    /// code is checked until the hour has passed.
    #[serde(default = "default_wrong_total")]
    pub wrong_codes_total: u32,
}

fn default_pairing_minutes() -> u64 {
    15
}
fn default_invite_hours() -> u64 {
    72
}
fn default_wrong_per_user() -> u32 {
    5
}
fn default_wrong_total() -> u32 {
    30
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            pairing_code_minutes: default_pairing_minutes(),
            invite_hours: default_invite_hours(),
            wrong_codes_per_user: default_wrong_per_user(),
            wrong_codes_total: default_wrong_total(),
        }
    }
}

/// The window the wrong tries are counted in.
const GUESS_WINDOW_MS: i64 = 3_600_000;

impl AccessConfig {
    /// Check the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=24 * 60).contains(&self.pairing_code_minutes) {
            return Err(format!(
                "access.pairing_code_minutes must be between 1 and 1440 (it is {})",
                self.pairing_code_minutes
            ));
        }
        if !(1..=24 * 90).contains(&self.invite_hours) {
            return Err(format!(
                "access.invite_hours must be between 1 and 2160 (it is {})",
                self.invite_hours
            ));
        }
        if !(1..=100).contains(&self.wrong_codes_per_user) {
            return Err(format!(
                "access.wrong_codes_per_user must be between 1 and 100 (it is {})",
                self.wrong_codes_per_user
            ));
        }
        if self.wrong_codes_total < self.wrong_codes_per_user || self.wrong_codes_total > 10_000 {
            return Err(format!(
                "access.wrong_codes_total must be between wrong_codes_per_user ({}) and 10000 (it is {})",
                self.wrong_codes_per_user, self.wrong_codes_total
            ));
        }
        Ok(())
    }

    fn guess_limits(&self) -> GuessLimits {
        GuessLimits {
            per_user: self.wrong_codes_per_user,
            global: self.wrong_codes_total,
            window_ms: GUESS_WINDOW_MS,
        }
    }
}

/// What [`Access`] is built from.
#[derive(Clone, Debug, Default)]
pub struct AccessSetup {
    /// `[access]`.
    pub settings: AccessConfig,
    /// `[telegram] allowed_users` (users from config).
    pub allowed_users: Vec<u64>,
    /// `[telegram] approvers` (admins from config).
    pub approvers: Vec<u64>,
    /// `[telegram] allowed_chats`: everybody may use the bot there (so no
    /// pairing is needed for the bot to be usable).
    pub allowed_chats: Vec<i64>,
    /// `[telegram] allow_all_users`: everybody may use the bot.
    pub allow_all_users: bool,
    /// Where "now" comes from (expiry of codes).
    pub clock: Clock,
}

/// An invite just made: the code, shown once.
#[derive(Clone, PartialEq, Eq)]
pub struct Invite {
    /// The code (never logged).
    pub code: String,
    /// The role it gives.
    pub role: Role,
    /// How long it works, in hours.
    pub hours: u64,
}

impl fmt::Debug for Invite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invite")
            .field("code", &"***")
            .field("role", &self.role)
            .finish()
    }
}

/// Why a code could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// No store: nothing could be remembered.
    #[error("there is no store to keep codes in")]
    NoStore,
    /// The system had no randomness to give.
    #[error("the system random generator failed")]
    NoRandomness,
    /// The store failed.
    #[error(transparent)]
    Users(#[from] StoreError),
}

/// Who may use the bot, and as what (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Access {
    inner: Arc<Inner>,
}

struct Inner {
    store: Option<Users>,
    setup: AccessSetup,
    members: RwLock<HashMap<u64, Member>>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("config_users", &self.inner.setup.allowed_users.len())
            .field("members", &self.members().len())
            .finish_non_exhaustive()
    }
}

impl Access {
    /// Access from `setup`, with the team kept in `store` (none: the
    /// config's allowlist only). Call [`Access::load`] before use.
    pub fn new(setup: AccessSetup, store: Option<Users>) -> Access {
        Access {
            inner: Arc::new(Inner {
                store,
                setup,
                members: RwLock::default(),
            }),
        }
    }

    /// Read the members from the store.
    pub async fn load(&self) -> Result<(), StoreError> {
        let Some(store) = &self.inner.store else {
            return Ok(());
        };
        let members = store.members().await?;
        let mut cached = self.write();
        cached.clear();
        cached.extend(members.into_iter().map(|m| (m.user_id, m)));
        Ok(())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u64, Member>> {
        // A plain map of values: a poisoned lock is consistent.
        self.inner
            .members
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn members(&self) -> HashMap<u64, Member> {
        self.inner
            .members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn member(&self, user: u64) -> Option<Member> {
        self.inner
            .members
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&user)
            .cloned()
    }

    /// The settings.
    pub fn settings(&self) -> &AccessConfig {
        &self.inner.setup.settings
    }

    /// Where "now" comes from.
    pub fn clock(&self) -> &Clock {
        &self.inner.setup.clock
    }

    /// The store the team is kept in.
    pub fn store(&self) -> Option<&Users> {
        self.inner.store.as_ref()
    }

    fn config_role(&self, user: u64) -> Option<Role> {
        let setup = &self.inner.setup;
        if setup.approvers.contains(&user) {
            Some(Role::Admin)
        } else if setup.allowed_users.contains(&user) {
            Some(Role::User)
        } else {
            None
        }
    }

    /// `user`'s role and where it comes from; `None` for a stranger.
    pub fn standing(&self, user: u64) -> Option<Standing> {
        roles::standing(self.config_role(user), self.member(user).map(|m| m.role))
    }

    /// Whether `user` may use the bot (config or team).
    pub fn is_member(&self, user: u64) -> bool {
        self.standing(user).is_some()
    }

    /// Whether `user` may use the bot in chat `chat_id` now: a member (config
    /// or team), or anyone where the config lets everybody in. The one
    /// answer every decision asks ([`Deciders::may_use`]), read from the
    /// members as they are at this moment.
    pub fn may_use(&self, user: u64, chat_id: i64) -> bool {
        let setup = &self.inner.setup;
        setup.allow_all_users || setup.allowed_chats.contains(&chat_id) || self.is_member(user)
    }

    /// The owner, if the bot was paired.
    pub fn owner(&self) -> Option<u64> {
        self.members()
            .values()
            .find(|m| m.role == Role::Owner)
            .map(|m| m.user_id)
    }

    /// Nobody may use the bot yet: no config users, no open chat, no owner.
    /// Then a start prints a pairing code.
    pub fn needs_pairing(&self) -> bool {
        let setup = &self.inner.setup;
        setup.allowed_users.is_empty()
            && setup.approvers.is_empty()
            && setup.allowed_chats.is_empty()
            && !setup.allow_all_users
            && self.owner().is_none()
    }

    /// Make a fresh pairing code (stored as a hash; the caller shows it
    /// once).
    pub async fn pairing_code(&self) -> Result<String, AccessError> {
        let minutes = self.settings().pairing_code_minutes;
        self.new_code(CodeKind::Pairing, Role::Owner, None, minutes * 60_000)
            .await
    }

    /// Make an invite for `role`, created by `actor` (the caller checked
    /// that `actor` may: [`roles::may_invite`]).
    pub async fn invite(&self, actor: u64, role: Role) -> Result<Invite, AccessError> {
        let hours = self.settings().invite_hours;
        let code = self
            .new_code(CodeKind::Invite, role, Some(actor), hours * 3_600_000)
            .await?;
        Ok(Invite { code, role, hours })
    }

    async fn new_code(
        &self,
        kind: CodeKind,
        role: Role,
        created_by: Option<u64>,
        lifetime_ms: u64,
    ) -> Result<String, AccessError> {
        let store = self.inner.store.as_ref().ok_or(AccessError::NoStore)?;
        let code = codes::generate().ok_or(AccessError::NoRandomness)?;
        let now_ms = self.clock().now_ms();
        let lifetime = i64::try_from(lifetime_ms).unwrap_or(i64::MAX);
        store
            .create_code(NewCode {
                hash: codes::hash(&code),
                kind,
                role,
                created_by,
                now_ms,
                expires_at_ms: now_ms.saturating_add(lifetime),
            })
            .await?;
        Ok(code)
    }

    /// `user` (named `name`) sent `typed` as a code: redeem it (see
    /// [`crate::store::users`]); a new member is known at once.
    pub async fn redeem(
        &self,
        user: u64,
        name: Option<String>,
        typed: &str,
    ) -> Result<Redeemed, AccessError> {
        let store = self.inner.store.as_ref().ok_or(AccessError::NoStore)?;
        let now_ms = self.clock().now_ms();
        let redeemed = store
            .redeem_code(Attempt {
                user_id: user,
                name: name.clone(),
                hash: codes::hash_typed(typed),
                now_ms,
                limits: self.settings().guess_limits(),
            })
            .await?;
        if let Redeemed::Joined(role, _) = &redeemed {
            self.write().insert(
                user,
                Member {
                    user_id: user,
                    role: *role,
                    name,
                    added_by: None,
                    added_at_ms: now_ms,
                },
            );
        }
        Ok(redeemed)
    }

    /// `typed` was seen where others could read it (a group): if it is a
    /// live pairing code or invite, it is void from now on. Whether one
    /// was. No wrong try is counted (nobody tried to redeem it).
    pub async fn void_code(&self, typed: &str) -> Result<bool, AccessError> {
        let store = self.inner.store.as_ref().ok_or(AccessError::NoStore)?;
        Ok(store.void_code(codes::hash_typed(typed)).await?)
    }

    /// Give chat member `user` the role `role` (the caller checked it may
    /// be done: [`roles::may_set_role`]). `false`: not a chat member. The
    /// unused invites they made that `role` may not make ([`roles::may_invite`])
    /// are void: standing counts when an invite is redeemed, not only when
    /// it was made.
    pub async fn set_role(&self, user: u64, role: Role) -> Result<bool, AccessError> {
        let store = self.inner.store.as_ref().ok_or(AccessError::NoStore)?;
        let may_invite = [Role::Admin, Role::User]
            .into_iter()
            .filter(|invited| roles::may_invite(role, *invited).is_ok())
            .collect();
        let before = store.set_member_role(user, role, may_invite).await?;
        if before.is_some() {
            if let Some(member) = self.write().get_mut(&user) {
                member.role = role;
            }
        }
        Ok(before.is_some())
    }

    /// Take chat member `user`'s access away (the caller checked it may be
    /// done: [`roles::may_revoke`]). `false`: not a chat member.
    pub async fn revoke(&self, user: u64) -> Result<bool, AccessError> {
        let store = self.inner.store.as_ref().ok_or(AccessError::NoStore)?;
        let removed = store.remove_member(user).await?;
        self.write().remove(&user);
        Ok(removed.is_some())
    }

    /// Everyone with access, by user id: chat members with their names,
    /// and config users.
    pub fn everyone(&self) -> Vec<(u64, Standing, Option<String>)> {
        let members = self.members();
        let setup = &self.inner.setup;
        let mut ids: Vec<u64> = members
            .keys()
            .copied()
            .chain(setup.allowed_users.iter().copied())
            .chain(setup.approvers.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| {
                let standing = self.standing(id)?;
                Some((id, standing, members.get(&id).and_then(|m| m.name.clone())))
            })
            .collect()
    }
}

impl Deciders for Access {
    /// The owner and the admins (the config's approvers among them).
    fn decides_for_anyone(&self, user: u64) -> bool {
        self.standing(user)
            .is_some_and(|standing| roles::manages_team(standing.role))
    }

    fn may_use(&self, user: u64, chat_id: i64) -> bool {
        Access::may_use(self, user, chat_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn access(setup: AccessSetup) -> Access {
        Access::new(setup, Some(Store::open_in_memory().unwrap().users()))
    }

    #[tokio::test]
    async fn pairing_makes_the_owner_who_then_decides_for_anyone() {
        let access = access(AccessSetup::default());
        access.load().await.unwrap();
        assert!(access.needs_pairing());
        let code = access.pairing_code().await.unwrap();
        assert!(!access.is_member(7));
        let wrong = access.redeem(8, None, "AAAAAAAAAA").await.unwrap();
        assert!(matches!(wrong, Redeemed::Wrong { .. }));
        let typed = code.to_lowercase();
        let joined = access.redeem(7, Some("Ann".into()), &typed);
        assert_eq!(
            joined.await.unwrap(),
            Redeemed::Joined(Role::Owner, CodeKind::Pairing)
        );
        assert!(access.is_member(7) && !access.needs_pairing());
        assert!(access.decides_for_anyone(7));
        assert!(!access.decides_for_anyone(8));
        // A fresh handle on the same store knows the owner.
        let again = Access::new(AccessSetup::default(), access.store().cloned());
        again.load().await.unwrap();
        assert_eq!(again.owner(), Some(7));
    }

    #[tokio::test]
    async fn invites_expire_on_the_clock_and_roles_follow_the_store() {
        let clock = Clock::manual(1_000_000);
        let access = access(AccessSetup {
            allowed_users: vec![1],
            approvers: vec![1],
            clock: clock.clone(),
            ..AccessSetup::default()
        });
        access.load().await.unwrap();
        assert!(!access.needs_pairing(), "the config lets someone in");
        assert!(
            access.decides_for_anyone(1),
            "a config approver is an admin"
        );
        let invite = access.invite(1, Role::User).await.unwrap();
        let late = access.invite(1, Role::Admin).await.unwrap();
        assert_eq!(
            access.redeem(2, None, &invite.code).await.unwrap(),
            Redeemed::Joined(Role::User, CodeKind::Invite)
        );
        clock.advance_ms(72 * 3_600_000);
        assert!(matches!(
            access.redeem(3, None, &late.code).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
        assert!(access.set_role(2, Role::Admin).await.unwrap());
        assert!(access.decides_for_anyone(2));
        // A demoted admin's unused invites go with the role.
        let unused = access.invite(2, Role::User).await.unwrap();
        assert!(access.set_role(2, Role::User).await.unwrap());
        assert!(matches!(
            access.redeem(4, None, &unused.code).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
        assert!(access.set_role(2, Role::Admin).await.unwrap());
        assert!(access.may_use(2, 42));
        assert!(access.revoke(2).await.unwrap());
        assert!(!access.is_member(2));
        assert!(!access.may_use(2, 42) && !Deciders::may_use(&access, 2, 42));
        let everyone: Vec<_> = access
            .everyone()
            .iter()
            .map(|(id, s, _)| (*id, s.origin))
            .collect();
        assert_eq!(everyone, [(1, Origin::Config)]);
        assert!(!format!("{invite:?}").contains(&invite.code));
    }
}
