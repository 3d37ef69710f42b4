//! Members, pairing codes, invites and wrong tries (migration "teams").
//!
//! A *member* is a user let in from the chat (by pairing or an invite),
//! with a role; the config's allowlist is not stored here (it is read from
//! the config at every start). An *access code* is a pairing code or an
//! invite, kept only as the SHA-256 of the code: the code itself is shown
//! once, at its creation, and never written down. Redeeming a code is one
//! store call: the guessing limits, the code check (in constant time over
//! every live code), the new member and the used code all commit together
//! or not at all, so a crash mid-pairing leaves either no owner or exactly
//! one (the unique index on the owner row makes two impossible anyway).
//!
//! Members, codes and wrong tries are per bot (`bot_id`): each bot has its
//! own team and its own owner; `telegate pair`'s path takes the bot too.
//!
//! This module never logs a code or its hash, and never decides who may
//! create or redeem one: that is [`crate::access`].

use rusqlite::{params, Connection, OptionalExtension};
use subtle::ConstantTimeEq;

use super::{StoreError, Users, WriteKind};
use crate::vocab::BotId;

/// What a member may do (see [`crate::access::roles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Uses the bot.
    User,
    /// Also invites users, lists members, revokes users, answers anyone's
    /// approvals and Stop buttons.
    Admin,
    /// The one who paired the bot: everything an admin does, plus roles.
    Owner,
}

impl Role {
    /// The stored (and typed) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    /// A role by name (case-insensitive).
    pub fn parse(name: &str) -> Option<Role> {
        [Role::Owner, Role::Admin, Role::User]
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(name.trim()))
    }
}

/// A pairing code or an invite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// Makes its redeemer the owner (only while there is none).
    Pairing,
    /// Makes its redeemer a member with the invite's role.
    Invite,
}

impl CodeKind {
    fn as_str(self) -> &'static str {
        match self {
            CodeKind::Pairing => "pairing",
            CodeKind::Invite => "invite",
        }
    }
}

/// A member as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Their Telegram user id.
    pub user_id: u64,
    /// What they may do.
    pub role: Role,
    /// Their name when they joined.
    pub name: Option<String>,
    /// Who invited them (`None`: they paired).
    pub added_by: Option<u64>,
    /// When they joined (unix ms).
    pub added_at_ms: i64,
}

/// A code to remember: its hash, never the code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCode {
    /// Hex SHA-256 of the normalised code.
    pub hash: String,
    /// Pairing or invite.
    pub kind: CodeKind,
    /// The role it gives.
    pub role: Role,
    /// Who created it (`None`: the start or `telegate pair`).
    pub created_by: Option<u64>,
    /// Now (unix ms).
    pub now_ms: i64,
    /// When it stops working (unix ms).
    pub expires_at_ms: i64,
}

/// How many wrong codes are tolerated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuessLimits {
    /// Wrong tries per user within the window.
    pub per_user: u32,
    /// Wrong tries of everybody together within the window.
    pub global: u32,
    /// The window (ms).
    pub window_ms: i64,
}

/// Someone sends a code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Who.
    pub user_id: u64,
    /// Their name (kept with the membership).
    pub name: Option<String>,
    /// Hex SHA-256 of what they sent, normalised.
    pub hash: String,
    /// Now (unix ms).
    pub now_ms: i64,
    /// The guessing limits.
    pub limits: GuessLimits,
}

/// What redeeming a code did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redeemed {
    /// They are a member now, with this role, by this kind of code.
    Joined(Role, CodeKind),
    /// They were a member already (nothing changed, no try counted).
    AlreadyMember(Role),
    /// No live code matched; counted. `tries_left` before silence.
    Wrong {
        /// Wrong tries they have left within the window.
        tries_left: u32,
    },
    /// They used up their wrong tries: not checked, not answered.
    Silenced,
    /// Everybody together used up the wrong tries: not checked.
    Busy,
}

fn to_i64(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

fn to_u64(id: i64) -> u64 {
    u64::try_from(id).unwrap_or(0)
}

fn role_of(name: &str) -> Role {
    Role::parse(name).unwrap_or(Role::User)
}

/// Remember `code` as `bot`'s on `conn` (also used by `telegate pair`,
/// which writes into a running bot's database through a connection of its
/// own).
pub fn insert_code(conn: &Connection, bot: BotId, code: &NewCode) -> Result<(), StoreError> {
    conn.prepare_cached(
        "DELETE FROM access_codes WHERE bot_id = ?2 AND expires_at < ?1 AND used_by IS NULL",
    )?
    .execute(params![code.now_ms, bot.get()])?;
    conn.prepare_cached(
        "INSERT INTO access_codes
         (bot_id, code_hash, kind, role, created_by, created_at, expires_at)
         VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        code.hash,
        code.kind.as_str(),
        code.role.as_str(),
        code.created_by.map(to_i64),
        code.now_ms,
        code.expires_at_ms,
        bot.get()
    ])?;
    Ok(())
}

/// `bot`'s owner's user id, on `conn`.
pub fn select_owner(conn: &Connection, bot: BotId) -> Result<Option<u64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT user_id FROM members WHERE bot_id = ?1 AND role = 'owner'")?
        .query_row([bot.get()], |r| r.get::<_, i64>(0))
        .optional()?
        .map(to_u64))
}

fn select_member(conn: &Connection, bot: i64, user_id: u64) -> Result<Option<Member>, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "{SELECT_MEMBERS} WHERE bot_id = ?2 AND user_id = ?1"
        ))?
        .query_row(params![to_i64(user_id), bot], member_row)
        .optional()?)
}

const SELECT_MEMBERS: &str = "SELECT user_id, role, name, added_by, added_at FROM members";

fn member_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Member> {
    Ok(Member {
        user_id: to_u64(r.get(0)?),
        role: role_of(&r.get::<_, String>(1)?),
        name: r.get(2)?,
        added_by: r.get::<_, Option<i64>>(3)?.map(to_u64),
        added_at_ms: r.get(4)?,
    })
}

/// A live code found: its hash, kind, role and creator.
type FoundCode = (String, CodeKind, Role, Option<u64>);

/// `bot`'s live (unused, unexpired) code whose hash is `hash`, compared in
/// constant time against every live code of `bot`.
fn find_code(
    conn: &Connection,
    bot: i64,
    hash: &str,
    now_ms: i64,
) -> Result<Option<FoundCode>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT code_hash, kind, role, created_by FROM access_codes
         WHERE bot_id = ?2 AND used_by IS NULL AND expires_at > ?1",
    )?;
    let rows = stmt
        .query_map(params![now_ms, bot], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<i64>>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut found = None;
    for (stored, kind, role, by) in rows {
        // Every live code is compared, whatever matched before.
        if bool::from(stored.as_bytes().ct_eq(hash.as_bytes())) {
            let kind = if kind == "pairing" {
                CodeKind::Pairing
            } else {
                CodeKind::Invite
            };
            found = Some((stored, kind, role_of(&role), by.map(to_u64)));
        }
    }
    Ok(found)
}

/// `bot`'s wrong tries since `since` (of `user`, or of everyone).
fn count_attempts(
    conn: &Connection,
    bot: i64,
    user: Option<u64>,
    since: i64,
) -> Result<u32, StoreError> {
    let n: i64 = match user {
        Some(user) => conn
            .prepare_cached(
                "SELECT count(*) FROM access_attempts WHERE bot_id = ?3 AND user_id = ?1 AND at > ?2",
            )?
            .query_row(params![to_i64(user), since, bot], |r| r.get(0))?,
        None => conn
            .prepare_cached("SELECT count(*) FROM access_attempts WHERE bot_id = ?2 AND at > ?1")?
            .query_row(params![since, bot], |r| r.get(0))?,
    };
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Redeem a code of `bot` on `conn` (inside the caller's savepoint).
fn redeem(conn: &Connection, bot: BotId, attempt: &Attempt) -> Result<Redeemed, StoreError> {
    let limits = attempt.limits;
    let since = attempt.now_ms - limits.window_ms;
    let id = bot.get();
    conn.prepare_cached("DELETE FROM access_attempts WHERE bot_id = ?2 AND at <= ?1")?
        .execute(params![since, id])?;
    if let Some(member) = select_member(conn, id, attempt.user_id)? {
        return Ok(Redeemed::AlreadyMember(member.role));
    }
    let tried = count_attempts(conn, id, Some(attempt.user_id), since)?;
    if tried >= limits.per_user {
        return Ok(Redeemed::Silenced);
    }
    if count_attempts(conn, id, None, since)? >= limits.global {
        return Ok(Redeemed::Busy);
    }
    let owner = select_owner(conn, bot)?;
    let found = find_code(conn, id, &attempt.hash, attempt.now_ms)?
        // A pairing code is void once the bot has an owner.
        .filter(|(_, kind, _, _)| !(*kind == CodeKind::Pairing && owner.is_some()));
    let Some((hash, kind, role, created_by)) = found else {
        conn.prepare_cached(
            "INSERT INTO access_attempts (bot_id, user_id, at) VALUES (?3, ?1, ?2)",
        )?
        .execute(params![to_i64(attempt.user_id), attempt.now_ms, id])?;
        return Ok(Redeemed::Wrong {
            tries_left: limits.per_user.saturating_sub(tried + 1),
        });
    };
    let role = if kind == CodeKind::Pairing {
        Role::Owner
    } else {
        role
    };
    conn.prepare_cached(
        "INSERT INTO members (bot_id, user_id, role, name, added_by, added_at, via)
         VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        to_i64(attempt.user_id),
        role.as_str(),
        attempt.name,
        created_by.map(to_i64),
        attempt.now_ms,
        kind.as_str(),
        id
    ])?;
    conn.prepare_cached(
        "UPDATE access_codes SET used_by = ?2, used_at = ?3 WHERE bot_id = ?4 AND code_hash = ?1",
    )?
    .execute(params![hash, to_i64(attempt.user_id), attempt.now_ms, id])?;
    if kind == CodeKind::Pairing {
        // Pairing is over: no other pairing code may make a second owner.
        conn.prepare_cached(
            "DELETE FROM access_codes WHERE bot_id = ?1 AND kind = 'pairing' AND used_by IS NULL",
        )?
        .execute([id])?;
    }
    Ok(Redeemed::Joined(role, kind))
}

impl Users {
    /// Every member, by user id.
    pub async fn members(&self) -> Result<Vec<Member>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "{SELECT_MEMBERS} WHERE bot_id = ?1 ORDER BY user_id"
            ))?;
            let rows = stmt.query_map([bot], member_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// The owner, if the bot was paired.
    pub async fn owner(&self) -> Result<Option<u64>, StoreError> {
        let bot = self.link.bot;
        self.call(move |conn| select_owner(conn, bot)).await
    }

    /// Remember a pairing code or an invite (by its hash).
    pub async fn create_code(&self, code: NewCode) -> Result<(), StoreError> {
        let bot = self.link.bot;
        self.write(WriteKind::Access, move |conn| {
            let tx = conn.savepoint()?;
            insert_code(&tx, bot, &code)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Redeem a code (see the module docs): one call, all or nothing.
    pub async fn redeem_code(&self, attempt: Attempt) -> Result<Redeemed, StoreError> {
        let bot = self.link.bot;
        self.write(WriteKind::Access, move |conn| {
            let tx = conn.savepoint()?;
            let redeemed = redeem(&tx, bot, &attempt)?;
            tx.commit()?;
            Ok(redeemed)
        })
        .await
    }

    /// Void the unused code whose hash is `hash` (it was seen in a group).
    /// Whether there was one.
    pub async fn void_code(&self, hash: String) -> Result<bool, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Access, move |conn| {
            let voided = conn
                .prepare_cached(
                    "DELETE FROM access_codes WHERE bot_id = ?2 AND code_hash = ?1 AND used_by IS NULL",
                )?
                .execute(params![hash, bot])?;
            Ok(voided > 0)
        })
        .await
    }

    /// Give member `user_id` the role `role`; the member before, if any.
    /// The owner's role is never changed here (nor anyone made owner). The
    /// unused invites they made for a role not in `may_invite` (what the
    /// new role may invite) are void, in the same transaction: a demotion
    /// takes back the invites the member could no longer make.
    pub async fn set_member_role(
        &self,
        user_id: u64,
        role: Role,
        may_invite: Vec<Role>,
    ) -> Result<Option<Member>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Access, move |conn| {
            let tx = conn.savepoint()?;
            let Some(before) = select_member(&tx, bot, user_id)? else {
                return Ok(None);
            };
            if before.role != Role::Owner && role != Role::Owner {
                tx.prepare_cached(
                    "UPDATE members SET role = ?2 WHERE bot_id = ?3 AND user_id = ?1",
                )?
                .execute(params![to_i64(user_id), role.as_str(), bot])?;
                let mut stmt = tx.prepare_cached(
                    "DELETE FROM access_codes WHERE bot_id = ?2 AND created_by = ?1
                     AND kind = 'invite' AND used_by IS NULL AND role = ?3",
                )?;
                for gone in [Role::Admin, Role::User] {
                    if !may_invite.contains(&gone) {
                        stmt.execute(params![to_i64(user_id), bot, gone.as_str()])?;
                    }
                }
            }
            tx.commit()?;
            Ok(Some(before))
        })
        .await
    }

    /// Remove member `user_id` (and the invites they made that nobody used
    /// yet); the member removed, if there was one.
    pub async fn remove_member(&self, user_id: u64) -> Result<Option<Member>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Access, move |conn| {
            let tx = conn.savepoint()?;
            let Some(before) = select_member(&tx, bot, user_id)? else {
                return Ok(None);
            };
            tx.execute(
                "DELETE FROM members WHERE bot_id = ?2 AND user_id = ?1",
                params![to_i64(user_id), bot],
            )?;
            tx.execute(
                "DELETE FROM access_codes WHERE bot_id = ?2 AND created_by = ?1 AND used_by IS NULL",
                params![to_i64(user_id), bot],
            )?;
            tx.commit()?;
            Ok(Some(before))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    const LIMITS: GuessLimits = GuessLimits {
        per_user: 3,
        global: 5,
        window_ms: 3_600_000,
    };

    fn code(hash: &str, kind: CodeKind, role: Role, now_ms: i64) -> NewCode {
        NewCode {
            hash: hash.into(),
            kind,
            role,
            created_by: (kind == CodeKind::Invite).then_some(1),
            now_ms,
            expires_at_ms: now_ms + 1000,
        }
    }

    fn attempt(user_id: u64, hash: &str, now_ms: i64) -> Attempt {
        Attempt {
            user_id,
            name: Some(format!("user {user_id}")),
            hash: hash.into(),
            now_ms,
            limits: LIMITS,
        }
    }

    #[tokio::test]
    async fn a_pairing_code_makes_one_owner_and_then_stops_working() {
        let s = Store::open_in_memory().unwrap();
        s.users()
            .create_code(code("p1", CodeKind::Pairing, Role::Owner, 0))
            .await
            .unwrap();
        s.users()
            .create_code(code("p2", CodeKind::Pairing, Role::Owner, 0))
            .await
            .unwrap();
        assert_eq!(
            s.users().redeem_code(attempt(10, "p1", 5)).await.unwrap(),
            Redeemed::Joined(Role::Owner, CodeKind::Pairing)
        );
        assert_eq!(s.users().owner().await.unwrap(), Some(10));
        // The same code again, and the other pairing code: both void.
        assert!(matches!(
            s.users().redeem_code(attempt(11, "p1", 6)).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
        assert!(matches!(
            s.users().redeem_code(attempt(11, "p2", 7)).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
        assert_eq!(s.users().members().await.unwrap().len(), 1);
        // The database itself refuses a second owner.
        let second = s
            .call(|c| {
                Ok(c.execute(
                    "INSERT INTO members (user_id, role, added_at, via) VALUES (12, 'owner', 0, 'pairing')",
                    [],
                )?)
            })
            .await;
        assert!(second.is_err());
    }

    #[tokio::test]
    async fn invites_are_single_use_and_expire() {
        let s = Store::open_in_memory().unwrap();
        s.users()
            .create_code(code("i1", CodeKind::Invite, Role::Admin, 0))
            .await
            .unwrap();
        s.users()
            .create_code(code("i2", CodeKind::Invite, Role::User, 0))
            .await
            .unwrap();
        assert_eq!(
            s.users().redeem_code(attempt(20, "i1", 10)).await.unwrap(),
            Redeemed::Joined(Role::Admin, CodeKind::Invite)
        );
        assert!(matches!(
            s.users().redeem_code(attempt(21, "i1", 11)).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
        // Expired at 1000.
        assert!(matches!(
            s.users()
                .redeem_code(attempt(22, "i2", 1000))
                .await
                .unwrap(),
            Redeemed::Wrong { .. }
        ));
        let members = s.users().members().await.unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].added_by, Some(1));
        assert_eq!(
            s.users()
                .redeem_code(attempt(20, "nothing", 12))
                .await
                .unwrap(),
            Redeemed::AlreadyMember(Role::Admin)
        );
    }

    #[tokio::test]
    async fn wrong_tries_are_limited_per_user_and_for_everybody() {
        let s = Store::open_in_memory().unwrap();
        s.users()
            .create_code(code("good", CodeKind::Invite, Role::User, 0))
            .await
            .unwrap();
        let tries: Vec<_> = [
            s.users().redeem_code(attempt(30, "bad", 1)).await.unwrap(),
            s.users().redeem_code(attempt(30, "bad", 2)).await.unwrap(),
            s.users().redeem_code(attempt(30, "bad", 3)).await.unwrap(),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            tries,
            [
                Redeemed::Wrong { tries_left: 2 },
                Redeemed::Wrong { tries_left: 1 },
                Redeemed::Wrong { tries_left: 0 }
            ]
        );
        // Silenced, even with the right code, until the window passes.
        assert_eq!(
            s.users().redeem_code(attempt(30, "good", 4)).await.unwrap(),
            Redeemed::Silenced
        );
        // Two more from others reach the global limit of 5.
        s.users().redeem_code(attempt(31, "bad", 5)).await.unwrap();
        s.users().redeem_code(attempt(32, "bad", 6)).await.unwrap();
        assert_eq!(
            s.users().redeem_code(attempt(33, "good", 7)).await.unwrap(),
            Redeemed::Busy
        );
        // After the window, tries count afresh.
        let later = 7 + LIMITS.window_ms;
        assert_eq!(
            s.users()
                .redeem_code(attempt(33, "bad", later))
                .await
                .unwrap(),
            Redeemed::Wrong { tries_left: 2 }
        );
    }

    #[tokio::test]
    async fn roles_change_but_never_to_or_from_owner_and_revoking_drops_invites() {
        let s = Store::open_in_memory().unwrap();
        s.users()
            .create_code(code("p", CodeKind::Pairing, Role::Owner, 0))
            .await
            .unwrap();
        s.users().redeem_code(attempt(1, "p", 1)).await.unwrap();
        s.users()
            .create_code(code("i", CodeKind::Invite, Role::User, 1))
            .await
            .unwrap();
        s.users().redeem_code(attempt(2, "i", 2)).await.unwrap();
        let users = vec![Role::User];
        s.users()
            .set_member_role(2, Role::Admin, users.clone())
            .await
            .unwrap();
        s.users()
            .set_member_role(1, Role::User, vec![])
            .await
            .unwrap();
        s.users()
            .set_member_role(2, Role::Owner, users)
            .await
            .unwrap();
        let roles: Vec<_> = s
            .users()
            .members()
            .await
            .unwrap()
            .iter()
            .map(|m| (m.user_id, m.role))
            .collect();
        assert_eq!(roles, [(1, Role::Owner), (2, Role::Admin)]);
        // An invite made by 2, unused, dies with 2's membership.
        let mut by_two = code("i2", CodeKind::Invite, Role::User, 3);
        by_two.created_by = Some(2);
        s.users().create_code(by_two).await.unwrap();
        assert_eq!(
            s.users().remove_member(2).await.unwrap().unwrap().role,
            Role::Admin
        );
        assert_eq!(s.users().remove_member(2).await.unwrap(), None);
        assert!(matches!(
            s.users().redeem_code(attempt(3, "i2", 4)).await.unwrap(),
            Redeemed::Wrong { .. }
        ));
    }

    #[tokio::test]
    async fn each_bot_has_its_own_members_codes_and_owner() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.users()
            .create_code(code("h", CodeKind::Pairing, Role::Owner, 0))
            .await
            .unwrap();
        // A's code is no code at all for B, and B's wrong try is B's.
        assert_eq!(
            b.users().redeem_code(attempt(42, "h", 1)).await.unwrap(),
            Redeemed::Wrong { tries_left: 2 }
        );
        assert_eq!(
            a.users().redeem_code(attempt(42, "h", 1)).await.unwrap(),
            Redeemed::Joined(Role::Owner, CodeKind::Pairing)
        );
        assert_eq!(b.users().owner().await.unwrap(), None);
        // The same code hash, and another owner, for B.
        b.users()
            .create_code(code("h", CodeKind::Pairing, Role::Owner, 2))
            .await
            .unwrap();
        assert_eq!(
            b.users().redeem_code(attempt(43, "h", 3)).await.unwrap(),
            Redeemed::Joined(Role::Owner, CodeKind::Pairing)
        );
        assert_eq!(a.users().owner().await.unwrap(), Some(42));
        assert_eq!(b.users().owner().await.unwrap(), Some(43));
        let ids = |members: Vec<Member>| members.iter().map(|m| m.user_id).collect::<Vec<_>>();
        assert_eq!(ids(a.users().members().await.unwrap()), vec![42]);
        assert_eq!(
            b.users()
                .set_member_role(42, Role::Admin, vec![Role::User])
                .await
                .unwrap(),
            None
        );
        assert_eq!(b.users().remove_member(42).await.unwrap(), None);
        assert_eq!(ids(a.users().members().await.unwrap()), vec![42]);
        // The `telegate pair` path reads and writes one bot's rows too.
        let owners = s
            .call(|conn| Ok((select_owner(conn, BotId(1))?, select_owner(conn, BotId(3))?)))
            .await
            .unwrap();
        assert_eq!(owners, (Some(42), None));
        s.call(|conn| {
            insert_code(
                conn,
                BotId(3),
                &code("p", CodeKind::Pairing, Role::Owner, 4),
            )
        })
        .await
        .unwrap();
        let c = s.for_bot(BotId(3));
        assert_eq!(
            c.users().redeem_code(attempt(44, "p", 5)).await.unwrap(),
            Redeemed::Joined(Role::Owner, CodeKind::Pairing)
        );
    }
}
