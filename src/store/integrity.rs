//! Refusing to run on a damaged or vanished database.
//!
//! * **Damaged pages.** `PRAGMA quick_check` runs at every open of a file
//!   database. A damaged file is refused with its path and what to do; a
//!   store that opened on garbage would log an error per turn and persist
//!   nothing.
//! * **A database that vanished or was truncated to 0 bytes.** SQLite
//!   treats a missing or empty file as a new, empty database, so a restore
//!   gone wrong (or a full disk during a copy) would silently start every
//!   chat afresh. The first successful open writes a marker file beside the
//!   database (`telegate.db.created`); a missing or empty database *with*
//!   that marker is reported instead of being recreated. A fresh data
//!   directory has no marker and is set up as before.
//!
//! This module owns those two checks and the marker. It must never repair,
//! delete or move a database file: what to do with a damaged one is the
//! operator's decision (the error says how).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, ErrorCode};

use super::StoreError;

/// The marker of `db`: `<db>.created`, beside it.
pub fn marker_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".created");
    PathBuf::from(name)
}

fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Before opening `db`: refuse a missing or empty file that the marker says
/// held a database. (An empty main file next to a non-empty write-ahead log
/// is left to SQLite, which recovers from the log.)
pub(super) fn check_before_open(db: &Path) -> Result<(), StoreError> {
    let marker = marker_path(db);
    if !marker.exists() {
        return Ok(());
    }
    let len = file_len(db);
    let wal = file_len(&wal_path(db)).unwrap_or(0);
    match len {
        Some(n) if n > 0 => Ok(()),
        Some(_) if wal > 0 => Ok(()),
        found => Err(StoreError::Vanished {
            path: db.to_path_buf(),
            marker,
            empty: found.is_some(),
        }),
    }
}

/// After opening: `PRAGMA quick_check`. Any answer but "ok" refuses the file.
pub(super) fn quick_check(conn: &Connection, db: &Path) -> Result<(), StoreError> {
    let problems: Vec<String> = {
        let mut statement = conn
            .prepare("PRAGMA quick_check(5)")
            .map_err(|e| as_corrupt(e, db))?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(|e| as_corrupt(e, db))?;
        rows.collect::<Result<_, _>>()
            .map_err(|e| as_corrupt(e, db))?
    };
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: db.to_path_buf(),
        detail: problems.join("; "),
    })
}

/// Record that `db` holds a database from now on (idempotent).
pub(super) fn write_marker(db: &Path) -> Result<(), StoreError> {
    use std::io::Write as _;
    let marker = marker_path(db);
    if marker.exists() {
        crate::private_fs::tighten_if_present(&marker, crate::private_fs::FILE_MODE)?;
        return Ok(());
    }
    crate::private_fs::private_file(&marker)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&marker)?
        .write_all(
            format!(
                "telegate created its database {} here on {} (ms since the epoch).\n\
             While this file exists, a missing or empty database is reported instead of\n\
             being replaced by a new, empty one. Delete this file only to start afresh.\n",
                db.display(),
                super::now_ms()
            )
            .as_bytes(),
        )?;
    Ok(())
}

/// SQLite's "this is not a database / it is damaged" errors become
/// [`StoreError::Corrupt`] naming the file; others pass through.
pub(super) fn as_corrupt(error: rusqlite::Error, db: &Path) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt {
            path: db.to_path_buf(),
            detail: error.to_string(),
        },
        _ => StoreError::Sqlite(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_directory_passes_and_a_vanished_database_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        check_before_open(&db).unwrap();
        write_marker(&db).unwrap();
        let err = check_before_open(&db).unwrap_err();
        assert!(
            matches!(err, StoreError::Vanished { empty: false, .. }),
            "{err}"
        );
        std::fs::write(&db, b"").unwrap();
        let err = check_before_open(&db).unwrap_err();
        assert!(
            matches!(err, StoreError::Vanished { empty: true, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&db.display().to_string()), "{err}");
    }
}
