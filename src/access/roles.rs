//! Who may do what to whom: the rules behind /invite, /role, /revoke,
//! /users and /usage all (pure functions, unit-tested here).
//!
//! * **owner** (the one who paired the bot): invites admins and users,
//!   changes roles, revokes anyone but themselves.
//! * **admin** (invited as one, or a config `approver`): invites users,
//!   revokes users, lists members and everyone's usage; like the owner,
//!   answers anyone's approvals, Stop buttons and job changes.
//! * **user**: uses the bot, their own turns and jobs only.
//!
//! Members from the config (`allowed_users`, `approvers`) are shown "from
//! config" and cannot be changed from the chat: the file decides.
//!
//! The refusals are the user's words (no config keys except where the fix
//! is the file).

pub use crate::store::users::Role;

/// Where a user's access comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `[telegram] allowed_users` / `approvers`.
    Config,
    /// Paired or invited in the chat (the store).
    Chat,
}

/// A user's effective role and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// What they may do.
    pub role: Role,
    /// Config or chat.
    pub origin: Origin,
}

/// May this role manage the team (/invite, /users, /revoke, /usage all),
/// and decide about anyone's turns and jobs?
pub fn manages_team(role: Role) -> bool {
    matches!(role, Role::Owner | Role::Admin)
}

/// May `actor` invite someone as `role`?
pub fn may_invite(actor: Role, role: Role) -> Result<(), String> {
    match (actor, role) {
        (_, Role::Owner) => {
            Err("There is only one owner; invite people as admin or user.".to_string())
        }
        (Role::Owner, _) | (Role::Admin, Role::User) => Ok(()),
        (Role::Admin, Role::Admin) => {
            Err("Only the owner can invite admins; you can invite users.".to_string())
        }
        (Role::User, _) => Err("Only the owner or an admin can invite people.".to_string()),
    }
}

/// May `actor` give `target` the role `new`?
pub fn may_set_role(actor: Standing, target: Standing, new: Role) -> Result<(), String> {
    if actor.role != Role::Owner {
        return Err("Only the owner can change roles.".to_string());
    }
    if target.role == Role::Owner {
        return Err("The owner's role cannot be changed.".to_string());
    }
    if new == Role::Owner {
        return Err("There is only one owner; choose admin or user.".to_string());
    }
    if target.origin == Origin::Config {
        return Err(from_config_text());
    }
    Ok(())
}

/// May `actor` take `target`'s access away?
pub fn may_revoke(actor: Standing, target: Standing) -> Result<(), String> {
    if target.role == Role::Owner {
        return Err("The owner cannot be revoked.".to_string());
    }
    match (actor.role, target.role) {
        (Role::Owner, _) | (Role::Admin, Role::User) => {}
        (Role::Admin, _) => return Err("Only the owner can revoke an admin.".to_string()),
        (Role::User, _) => return Err("Only the owner or an admin can revoke access.".to_string()),
    }
    if target.origin == Origin::Config {
        return Err(from_config_text());
    }
    Ok(())
}

/// Why a member from the config cannot be changed from the chat.
fn from_config_text() -> String {
    "This user has access from the config file (telegram.allowed_users or approvers); \
     change it there and restart."
        .to_string()
}

/// The effective standing of a user who is in the config as `config` (if
/// at all) and in the store as `stored` (if at all): the config decides
/// where it names them (it cannot be changed from the chat), with the
/// higher of the two roles.
pub fn standing(config: Option<Role>, stored: Option<Role>) -> Option<Standing> {
    match (config, stored) {
        (Some(config), stored) => Some(Standing {
            role: stored.map_or(config, |s| s.max(config)),
            origin: Origin::Config,
        }),
        (None, Some(role)) => Some(Standing {
            role,
            origin: Origin::Chat,
        }),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(role: Role) -> Standing {
        Standing {
            role,
            origin: Origin::Chat,
        }
    }

    fn config(role: Role) -> Standing {
        Standing {
            role,
            origin: Origin::Config,
        }
    }

    #[test]
    fn owners_invite_anyone_but_owners_admins_invite_users() {
        assert!(may_invite(Role::Owner, Role::Admin).is_ok());
        assert!(may_invite(Role::Owner, Role::User).is_ok());
        assert!(may_invite(Role::Admin, Role::User).is_ok());
        assert!(may_invite(Role::Admin, Role::Admin).is_err());
        assert!(may_invite(Role::User, Role::User).is_err());
        assert!(may_invite(Role::Owner, Role::Owner).is_err());
    }

    #[test]
    fn only_the_owner_changes_roles_and_never_to_or_from_owner() {
        assert!(may_set_role(chat(Role::Owner), chat(Role::User), Role::Admin).is_ok());
        assert!(may_set_role(chat(Role::Admin), chat(Role::User), Role::Admin).is_err());
        assert!(may_set_role(chat(Role::Owner), chat(Role::Owner), Role::User).is_err());
        assert!(may_set_role(chat(Role::Owner), chat(Role::User), Role::Owner).is_err());
        let refused = may_set_role(chat(Role::Owner), config(Role::User), Role::Admin);
        assert!(refused.unwrap_err().contains("config file"));
    }

    #[test]
    fn revoking_goes_down_the_ranks_and_not_into_the_config() {
        assert!(may_revoke(chat(Role::Owner), chat(Role::Admin)).is_ok());
        assert!(may_revoke(chat(Role::Admin), chat(Role::User)).is_ok());
        assert!(may_revoke(chat(Role::Admin), chat(Role::Admin)).is_err());
        assert!(may_revoke(chat(Role::User), chat(Role::User)).is_err());
        assert!(may_revoke(chat(Role::Owner), chat(Role::Owner)).is_err());
        assert!(may_revoke(config(Role::Admin), config(Role::User)).is_err());
    }

    #[test]
    fn the_config_decides_where_it_names_someone() {
        assert_eq!(standing(None, None), None);
        assert_eq!(standing(None, Some(Role::User)), Some(chat(Role::User)));
        assert_eq!(
            standing(Some(Role::User), Some(Role::Admin)),
            Some(config(Role::Admin))
        );
        assert_eq!(standing(Some(Role::Admin), None), Some(config(Role::Admin)));
        assert!(manages_team(Role::Admin) && manages_team(Role::Owner));
        assert!(!manages_team(Role::User));
    }
}
