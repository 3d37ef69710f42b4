//! Showing pairing codes: once at start (when nobody may use the bot), and
//! on demand with `telegate pair` for a data directory a running bot holds.
//!
//! `telegate pair` never runs the bot and never takes the data directory's
//! lock: it opens the database with a connection of its own (SQLite's WAL
//! lets it write next to the running bot's connection), inserts the hash of
//! a fresh code and prints the code. The running bot needs no signal: a
//! code is looked up in the store when someone sends it.
//!
//! The code is shown here and nowhere else; only its hash is stored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{codes, Access, AccessConfig, AccessError};
use crate::store::users::{insert_code, select_owner, CodeKind, NewCode, Role};
use crate::vocab::BotId;

/// The lines telling the operator how to pair `bot` (its name or
/// `@username`, when known: several bots may print codes side by side;
/// stderr and the log).
pub fn pairing_text(code: &str, minutes: u64, bot: Option<&str>) -> String {
    let (this, to) = match bot {
        Some(bot) => (format!("the bot {bot}"), format!("to {bot}")),
        None => ("this bot".to_string(), "to the bot".to_string()),
    };
    format!(
        "Nobody may use {this} yet. To become its owner, send this message {to} \
         in Telegram within {minutes} minutes:\n\n    /pair {code}\n\n\
         (`telegate pair` prints a fresh code while the bot runs.)"
    )
}

/// At start: when nobody may use the bot (`bot`: its name, for the
/// banner), make a pairing code and show it once (stderr and the log).
/// Returns whether one was shown.
pub async fn announce_at_start(access: &Access, bot: &str) -> Result<bool, AccessError> {
    if !access.needs_pairing() {
        return Ok(false);
    }
    let code = access.pairing_code().await?;
    let minutes = access.settings().pairing_code_minutes;
    let text = pairing_text(&code, minutes, Some(bot));
    eprintln!("\n{text}\n");
    // The one time a code is logged: the operator may only see the log.
    tracing::warn!(pairing_code = %code, minutes, bot, "nobody may use the bot yet: send /pair <pairing_code> to the bot to become its owner");
    Ok(true)
}

/// Why `telegate pair` could not make a code.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The data directory has no database yet.
    #[error("there is no telegate database at {0}; start `telegate run` first (it prints a pairing code itself)")]
    NoDatabase(PathBuf),
    /// The database belongs to another user: writing it as this one could
    /// leave files the bot cannot open.
    #[error("{0} belongs to another user; run `telegate pair` as the user telegate runs as")]
    OtherUser(PathBuf),
    /// The database is from a telegate without pairing.
    #[error("the database at {0} predates pairing; start this telegate once, then run `telegate pair` again")]
    TooOld(PathBuf),
    /// Pairing is over.
    #[error("this bot already has an owner (user {0}); they can /invite people from the chat")]
    HasOwner(u64),
    /// `--bot NAME` names no bot of this database.
    #[error("no bot named {wanted:?} has run on this data directory (there are: {known})")]
    UnknownBot {
        /// The name asked for.
        wanted: String,
        /// The names known.
        known: String,
    },
    /// Several bots share the database and none was named.
    #[error("several bots run on this data directory ({known}): name one with --bot NAME")]
    WhichBot {
        /// The names known.
        known: String,
    },
    /// No randomness.
    #[error("the system random generator failed")]
    NoRandomness,
    /// SQLite failed.
    #[error("cannot write the pairing code into {path}: {detail}")]
    Store {
        /// The database.
        path: PathBuf,
        /// What SQLite said.
        detail: String,
    },
}

/// Which bot `telegate pair` writes its code for: the one named, else the
/// only bot the database knows (none yet: the rows of no bot, which the
/// first bot to start takes).
pub fn choose_bot(known: &[(BotId, String)], wanted: Option<&str>) -> Result<BotId, PairError> {
    let names = || {
        known
            .iter()
            .map(|(_, name)| name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (wanted, known) {
        (Some(wanted), _) => known
            .iter()
            .find(|(_, name)| name == wanted)
            .map(|(id, _)| *id)
            .ok_or_else(|| PairError::UnknownBot {
                wanted: wanted.to_string(),
                known: names(),
            }),
        (None, []) => Ok(BotId::UNCLAIMED),
        (None, [(id, _)]) => Ok(*id),
        (None, _) => Err(PairError::WhichBot { known: names() }),
    }
}

/// A pairing code `telegate pair` made, and the name of the bot it pairs
/// (none: no bot has run on the database yet).
#[derive(Clone, PartialEq, Eq)]
pub struct Paired {
    /// The code (shown once, never logged).
    pub code: String,
    /// The bot's name (`[[bots]] name`).
    pub bot: Option<String>,
}

/// `telegate pair [--bot NAME]`: a fresh pairing code for the bot
/// [`choose_bot`] picks, in the database of `data_dir` (the running
/// bot's, or one that will run), returned to be printed.
pub fn pair_in(
    data_dir: &Path,
    settings: &AccessConfig,
    wanted: Option<&str>,
) -> Result<Paired, PairError> {
    let path = data_dir.join("telegate.db");
    let metadata = std::fs::metadata(&path).map_err(|_| PairError::NoDatabase(path.clone()))?;
    check_owner(&path, &metadata)?;
    let store_error = |e: rusqlite::Error| PairError::Store {
        path: path.clone(),
        detail: e.to_string(),
    };
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(store_error)?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(store_error)?;
    let has_table: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'access_codes'",
            [],
            |r| r.get(0),
        )
        .map_err(store_error)?;
    if has_table == 0 {
        return Err(PairError::TooOld(path));
    }
    let store_failed = |e: crate::store::StoreError| PairError::Store {
        path: path.clone(),
        detail: e.to_string(),
    };
    let known = crate::store::bots::known_bots(&conn).map_err(store_failed)?;
    let bot = choose_bot(&known, wanted)?;
    let name = known
        .into_iter()
        .find(|(id, _)| *id == bot)
        .map(|(_, name)| name);
    if let Some(owner) = select_owner(&conn, bot).map_err(store_failed)? {
        return Err(PairError::HasOwner(owner));
    }
    let code = codes::generate().ok_or(PairError::NoRandomness)?;
    let now_ms = crate::store::now_ms();
    let lifetime = i64::try_from(settings.pairing_code_minutes * 60_000).unwrap_or(i64::MAX);
    insert_code(
        &conn,
        bot,
        &NewCode {
            hash: codes::hash(&code),
            kind: CodeKind::Pairing,
            role: Role::Owner,
            created_by: None,
            now_ms,
            expires_at_ms: now_ms.saturating_add(lifetime),
        },
    )
    .map_err(store_failed)?;
    Ok(Paired { code, bot: name })
}

#[cfg(unix)]
fn check_owner(path: &Path, metadata: &std::fs::Metadata) -> Result<(), PairError> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if metadata.uid() != me {
        return Err(PairError::OtherUser(path.to_path_buf()));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner(_path: &Path, _metadata: &std::fs::Metadata) -> Result<(), PairError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::AccessSetup;
    use crate::store::{Redeemed, Store};

    #[tokio::test]
    async fn a_code_written_by_pair_works_in_the_running_store() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            pair_in(dir.path(), &AccessConfig::default(), None),
            Err(PairError::NoDatabase(_))
        ));
        let opened = Store::open_async(dir.path().join("telegate.db"))
            .await
            .unwrap();
        // The running bot recorded itself: pair finds it without a name.
        let store = opened.for_bot(BotId(7));
        store.record_bot("main", "main_bot").await.unwrap();
        let access = Access::new(AccessSetup::default(), Some(store.users()));
        access.load().await.unwrap();
        let pair = |wanted: Option<&'static str>| {
            let dir = dir.path().to_path_buf();
            tokio::task::spawn_blocking(move || pair_in(&dir, &AccessConfig::default(), wanted))
        };
        let Paired { code, bot } = pair(None).await.unwrap().unwrap();
        assert_eq!(bot.as_deref(), Some("main"), "the code says which bot");
        assert_eq!(codes::normalize(&code).as_deref(), Some(code.as_str()));
        let joined = access.redeem(5, None, &code).await.unwrap();
        assert!(matches!(joined, Redeemed::Joined(Role::Owner, _)));
        let again = pair(Some("main")).await.unwrap();
        assert!(matches!(again, Err(PairError::HasOwner(5))));
        // A second bot: pair must be told which, and pairs that one.
        let other = opened.for_bot(BotId(8));
        other.record_bot("side", "side_bot").await.unwrap();
        assert!(matches!(
            pair(None).await.unwrap(),
            Err(PairError::WhichBot { .. })
        ));
        let code = pair(Some("side")).await.unwrap().unwrap().code;
        let access = Access::new(AccessSetup::default(), Some(other.users()));
        access.load().await.unwrap();
        let joined = access.redeem(6, None, &code).await.unwrap();
        assert!(matches!(joined, Redeemed::Joined(Role::Owner, _)));
        opened.close().await.unwrap();
    }

    #[test]
    fn pair_picks_the_named_or_the_only_bot() {
        let one = [(BotId(7), "main".to_string())];
        let two = [
            (BotId(7), "main".to_string()),
            (BotId(8), "side".to_string()),
        ];
        assert_eq!(choose_bot(&[], None).unwrap(), BotId::UNCLAIMED);
        assert_eq!(choose_bot(&one, None).unwrap(), BotId(7));
        assert_eq!(choose_bot(&two, Some("side")).unwrap(), BotId(8));
        assert!(matches!(
            choose_bot(&two, None),
            Err(PairError::WhichBot { known }) if known == "main, side"
        ));
        assert!(matches!(
            choose_bot(&one, Some("nope")),
            Err(PairError::UnknownBot { .. })
        ));
    }

    #[test]
    fn the_text_shows_the_command_to_send() {
        let text = pairing_text("ABCDEFGHJK", 15, None);
        assert!(text.contains("/pair ABCDEFGHJK"));
        assert!(text.contains("15 minutes"));
        let named = pairing_text("ABCDEFGHJK", 15, Some("@side_bot"));
        assert!(
            named.starts_with("Nobody may use the bot @side_bot yet"),
            "{named}"
        );
        assert!(named.contains("send this message to @side_bot"), "{named}");
    }
}
