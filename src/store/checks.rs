//! CHECK constraints SQLite can evaluate without building a table.
//!
//! SQLite evaluates `x IN ('a', 'b', 'c')` (a list of three or more
//! constants) by building a temporary b-tree of the list, on every run of
//! the statement: a page cache allocated, filled and freed. In a CHECK
//! constraint that is every insert into the table, and every update of
//! the column. `inbox.state` (five states) and `transcripts.role` (four
//! roles) had such checks, paid four or five times per turn (the profile
//! showed it as `malloc` and page-cache work on the store thread; 2.8 µs
//! against 1.2 µs per insert in isolation). The same check written as
//! `x = 'a' OR x = 'b' OR ...` is a few comparisons.
//!
//! Changing a CHECK constraint that existing rows already satisfy does not
//! change what is stored, so it follows SQLite's documented procedure for
//! such a change instead of copying the tables ("Making Other Kinds Of
//! Table Schema Changes", <https://sqlite.org/lang_altertable.html>):
//! inside the migration's transaction, with `writable_schema` on, the
//! table's definition is rewritten in `sqlite_schema`, then
//! `schema_version` is moved on so every connection reads the schema
//! again (this one by `writable_schema = RESET`). The transcripts, which
//! are never pruned, are not copied.
//!
//! # What it must never do
//!
//! * Never change what a constraint accepts: each rewrite is the same
//!   set of values (`tests` check both forms accept and refuse alike).
//! * Never fail a start because it could not do the rewrite (a build of
//!   SQLite in defensive mode refuses `writable_schema`): the checks then
//!   stay as they were, correct and slower, and the log says so.

use rusqlite::{params, Connection};

use super::StoreError;

/// `(table, the check as created, the same check without a list)`.
pub(super) const REWRITES: &[(&str, &str, &str)] = &[
    (
        "inbox",
        "CHECK (state IN ('received', 'running', 'answered', 'failed', 'dropped'))",
        "CHECK (state = 'received' OR state = 'running' OR state = 'answered' \
         OR state = 'failed' OR state = 'dropped')",
    ),
    (
        "transcripts",
        "CHECK (role IN ('system', 'user', 'assistant', 'tool'))",
        "CHECK (role = 'system' OR role = 'user' OR role = 'assistant' OR role = 'tool')",
    ),
];

/// The migration step: rewrites the checks of [`REWRITES`] in `conn`'s
/// schema (inside the migration's transaction).
pub(super) fn rewrite_list_checks(conn: &Connection) -> Result<(), StoreError> {
    match try_rewrite(conn) {
        Ok(changed) => {
            tracing::info!(tables = changed, "store checks rewritten without lists");
            Ok(())
        }
        Err(error) => {
            tracing::warn!(%error, "store checks left as they were (correct, slower)");
            Ok(())
        }
    }
}

/// The documented steps; the number of tables changed.
fn try_rewrite(conn: &Connection) -> Result<usize, StoreError> {
    let version: i64 = conn.pragma_query_value(None, "schema_version", |r| r.get(0))?;
    conn.pragma_update(None, "writable_schema", true)?;
    let rewritten = REWRITES.iter().try_fold(0, |changed, (table, old, new)| {
        conn.execute(
            "UPDATE sqlite_schema SET sql = replace(sql, ?2, ?3)
             WHERE type = 'table' AND name = ?1 AND instr(sql, ?2) > 0",
            params![table, old, new],
        )
        .map(|n| changed + n)
    });
    let bumped = match rewritten {
        Ok(changed) if changed > 0 => conn
            .pragma_update(None, "schema_version", version + 1)
            .map(|()| changed),
        other => other,
    };
    // RESET, not OFF: this connection reads the schema again too (the
    // version moved on by itself is not news to it).
    conn.execute_batch("PRAGMA writable_schema = RESET")?;
    Ok(bumped?)
}

/// Whether SQLite's program for `sql` builds a temporary table
/// (`OpenEphemeral`), parameters left unbound (shared by the store's tests).
#[cfg(test)]
pub(super) fn builds_a_table(conn: &Connection, sql: &str) -> bool {
    let mut statement = conn
        .prepare(&format!("EXPLAIN {sql}"))
        .expect("the statement compiles");
    let mut rows = statement.raw_query();
    while let Some(row) = rows.next().expect("EXPLAIN runs") {
        if row.get::<_, String>(1).expect("an opcode") == "OpenEphemeral" {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use rusqlite::config::DbConfig;
    use rusqlite::Connection;

    use super::{builds_a_table, REWRITES};
    use crate::store::schema::{self, schema_version, SCHEMA_VERSION};

    fn table_sql(conn: &Connection, table: &str) -> String {
        conn.query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )
        .unwrap()
    }

    const TRANSCRIPT_INSERT: &str =
        "INSERT INTO transcripts (bot_id, session_id, role, content, created_at)
         VALUES (1, 's', ?1, 'x', 0)";
    const INBOX_INSERT: &str =
        "INSERT INTO inbox (bot_id, update_id, chat_id, payload, state, received_at, updated_at)
         VALUES (1, ?2, 1, '{}', ?1, 0, 0)";

    #[test]
    fn a_migrated_store_checks_states_and_roles_without_a_table() {
        let mut conn = Connection::open_in_memory().unwrap();
        schema::migrate(&mut conn).unwrap();
        for (table, old, new) in REWRITES {
            let sql = table_sql(&conn, table);
            assert!(sql.contains(new) && !sql.contains(old), "{sql}");
        }
        assert!(!builds_a_table(&conn, TRANSCRIPT_INSERT));
        assert!(!builds_a_table(&conn, INBOX_INSERT));
        let quick: String = conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(quick, "ok");
    }

    /// The rewritten checks accept and refuse what the lists did.
    #[test]
    fn the_rewritten_checks_accept_and_refuse_what_the_lists_did() {
        let mut conn = Connection::open_in_memory().unwrap();
        schema::migrate(&mut conn).unwrap();
        for role in ["system", "user", "assistant", "tool"] {
            conn.execute(TRANSCRIPT_INSERT, [role]).unwrap();
        }
        for role in ["bogus", "", "User", "user "] {
            let refused = conn.execute(TRANSCRIPT_INSERT, [role]).unwrap_err();
            assert!(refused.to_string().contains("CHECK"), "{role:?}: {refused}");
        }
        let states = ["received", "running", "answered", "failed", "dropped"];
        for (n, state) in (0i64..).zip(states) {
            conn.execute(INBOX_INSERT, rusqlite::params![state, n])
                .unwrap();
        }
        for (n, state) in (100i64..).zip(["done", "", "Running"]) {
            let refused = conn
                .execute(INBOX_INSERT, rusqlite::params![state, n])
                .unwrap_err();
            assert!(
                refused.to_string().contains("CHECK"),
                "{state:?}: {refused}"
            );
        }
    }

    /// A store from before the rewrite keeps every row, and the rewrite
    /// takes effect on the connection that did it.
    #[test]
    fn a_store_with_rows_is_rewritten_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut before = Connection::open(&path).unwrap();
        schema::apply(&mut before, &schema::MIGRATIONS[..15]).unwrap();
        for role in ["user", "assistant"] {
            before.execute(TRANSCRIPT_INSERT, [role]).unwrap();
        }
        assert!(builds_a_table(&before, TRANSCRIPT_INSERT));
        drop(before);
        let mut conn = Connection::open(&path).unwrap();
        assert_eq!(schema::migrate(&mut conn).unwrap(), 1);
        assert_eq!(schema_version(&conn).unwrap(), SCHEMA_VERSION);
        assert!(!builds_a_table(&conn, TRANSCRIPT_INSERT));
        let kept: i64 = conn
            .query_row("SELECT count(*) FROM transcripts", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 2);
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        // Another connection reads the new schema too.
        let other = Connection::open(&path).unwrap();
        assert!(!builds_a_table(&other, TRANSCRIPT_INSERT));
    }

    /// SQLite in defensive mode refuses to edit the schema: the store
    /// still opens, with the checks as they were.
    #[test]
    fn a_defensive_sqlite_keeps_the_checks_and_still_opens() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)
            .unwrap();
        schema::migrate(&mut conn).unwrap();
        assert_eq!(schema_version(&conn).unwrap(), SCHEMA_VERSION);
        for (table, old, _) in REWRITES {
            assert!(table_sql(&conn, table).contains(old));
        }
        conn.execute(TRANSCRIPT_INSERT, ["user"]).unwrap();
    }
}
