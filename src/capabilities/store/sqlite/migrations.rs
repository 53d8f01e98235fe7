//! The SQLite store's schema as an ordered list of migrations, applied at open in one transaction.
//!
//! The database records the number of migrations applied in `PRAGMA user_version` (0 for a
//! database made before migrations existed: migration 1 is that schema, written so it passes
//! over such a database unchanged). A database with a higher version than this binary knows was
//! written by a newer planbot and is refused: its schema may mean things this one does not know.
//!
//! Add a migration by appending a file to `migrations/` and a line to [`MIGRATIONS`]; never edit
//! or reorder one that has shipped.
//!
//! Hand-written rather than `rusqlite_migration` (the crate that fits rusqlite 0.32 is 1.3):
//! that crate reads the version before it opens its (deferred) transaction, so two processes
//! opening one file at once could both migrate, and its "too far ahead" error carries no
//! versions; here the version is read and written inside one `BEGIN IMMEDIATE`. The runner is
//! small, and the PostgreSQL backend planned next needs the same shape (versions in a table)
//! that no SQLite-only crate gives.

use crate::capabilities::store::types::SchemaError;
use rusqlite::{Connection, TransactionBehavior};

/// One step of the schema.
#[derive(Debug, Clone, Copy)]
pub(super) struct Migration {
    /// 1, 2, …: its position in [`MIGRATIONS`], what `user_version` holds once it is applied.
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration, oldest first.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial schema",
        sql: include_str!("migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "policy verdicts and approvals",
        sql: include_str!("migrations/0002_policies.sql"),
    },
    Migration {
        version: 3,
        name: "drift schedule ticks and each root's last check",
        sql: include_str!("migrations/0003_drift.sql"),
    },
    Migration {
        version: 4,
        name: "targeted plans per MR head and root",
        sql: include_str!("migrations/0004_targeting.sql"),
    },
    Migration {
        version: 5,
        name: "the reviewed plans' reports for GitLab's merge request widgets",
        sql: include_str!("migrations/0005_widgets.sql"),
    },
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Bring the database to [`SCHEMA_VERSION`], all in one transaction; returns the version found.
pub(super) fn migrate(conn: &mut Connection) -> Result<u32, SchemaError> {
    apply(conn, MIGRATIONS)
}

fn apply(conn: &mut Connection, migrations: &[Migration]) -> Result<u32, SchemaError> {
    let known = migrations.len() as u32;
    // IMMEDIATE: the write lock is taken before the version is read, so a second process
    // opening the same file waits and then finds the work done.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let found = u32::try_from(found).unwrap_or(u32::MAX);
    if found > known {
        return Err(SchemaError::TooNew { found, known });
    }
    for m in &migrations[found as usize..] {
        tx.execute_batch(m.sql)
            .map_err(|source| SchemaError::Migration {
                version: m.version,
                name: m.name,
                source: Box::new(source),
            })?;
    }
    if found < known {
        tx.pragma_update(None, "user_version", known)?;
    }
    tx.commit()?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(conn: &Connection) -> u32 {
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn versions_count_up_from_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "{}", m.name);
        }
    }

    #[test]
    fn a_new_database_gets_every_migration_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), 0);
        assert_eq!(version(&conn), SCHEMA_VERSION);
        // Opening again finds nothing to do.
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(version(&conn), SCHEMA_VERSION);
    }

    #[test]
    fn a_newer_database_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, SchemaError::TooNew { found, known } if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION),
            "{err:?}"
        );
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0);
    }

    #[test]
    fn a_failing_migration_leaves_the_database_as_it_was() {
        let steps = [
            MIGRATIONS[0],
            Migration {
                version: 2,
                name: "broken",
                sql: "CREATE TABLE extra (x INTEGER); INSERT INTO nowhere VALUES (1);",
            },
        ];
        let mut conn = Connection::open_in_memory().unwrap();
        let err = apply(&mut conn, &steps).unwrap_err();
        assert!(
            matches!(err, SchemaError::Migration { version: 2, .. }),
            "{err:?}"
        );
        assert_eq!(version(&conn), 0);
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0, "migration 1 was rolled back with 2");
    }
}
