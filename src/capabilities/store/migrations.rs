//! The store's schema: one ordered list of migrations for both databases, each a `.sql` file
//! per database (`migrations/sqlite/V{n}__{name}.sql`, `migrations/postgres/…`, embedded), run
//! by refinery at start-up, all pending ones in one transaction, and recorded in its table
//! `refinery_schema_history`. A database written by a **newer** planbot is refused untouched.
//!
//! PostgreSQL: the replicas starting together migrate once, one after the other under a
//! session advisory lock (the others then find nothing to do). SQLite: one process owns the
//! file; the pending migrations and their history rows commit in one transaction.
//!
//! Databases made before refinery kept their version elsewhere: SQLite in `PRAGMA
//! user_version`, PostgreSQL in `schema_migrations`. Such a database is adopted: its versions
//! are recorded in refinery's table as applied (`Target::FakeVersion`, nothing runs again), and
//! those old records are kept up to date from then on, so that a planbot from before still
//! refuses a database a newer one migrated.
//!
//! Add a migration by adding both files and a line to [`MIGRATIONS`]; never edit, rename or
//! reorder one that has shipped (refinery checks each applied one's checksum).

use super::now_ms;
use super::types::SchemaError;
use refinery::{Migration, Runner, Target};
use rusqlite::{Connection, OptionalExtension};
use tokio_postgres::{Client, GenericClient};

/// One migration: its refinery name (`V{n}__{name}`), then its SQL for SQLite and PostgreSQL.
macro_rules! migration {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("migrations/sqlite/", $name, ".sql")),
            include_str!(concat!("migrations/postgres/", $name, ".sql")),
        )
    };
}

/// Every migration, oldest first.
const MIGRATIONS: [(&str, &str, &str); 7] = [
    migration!("V1__initial"),
    migration!("V2__policies"),
    migration!("V3__drift"),
    migration!("V4__targeting"),
    migration!("V5__widgets"),
    migration!("V6__kept_plans"),
    migration!("V7__root_units"),
];

/// The schema version this binary writes (either database).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// [`SCHEMA_VERSION`]: PostgreSQL's schema is the same list of migrations.
pub const PG_SCHEMA_VERSION: u32 = SCHEMA_VERSION;

/// The advisory lock key every planbot holds while it migrates ("planbot" in ASCII).
const MIGRATION_LOCK: i64 = 0x0070_6c61_6e62_6f74;

/// Which database's SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
}

/// The embedded migrations for `kind`.
pub(crate) fn embedded(kind: Kind) -> Vec<Migration> {
    MIGRATIONS
        .iter()
        .map(|(name, sqlite, postgres)| {
            let sql = if kind == Kind::Sqlite {
                sqlite
            } else {
                postgres
            };
            Migration::unapplied(name, sql).expect("migration names are V{n}__{name}")
        })
        .collect()
}

/// Refinery's runner of `migrations`, to `target`, every pending one in one transaction.
fn runner(migrations: &[Migration], target: Target) -> Runner {
    Runner::new(migrations).set_grouped(true).set_target(target)
}

/// What the database records: the newest migration in refinery's table (0: none, or no table),
/// and the version an older planbot recorded its own way (0: none).
#[derive(Debug, Clone, Copy)]
struct Found {
    history: u32,
    legacy: u32,
}

impl Found {
    /// The schema version: whichever record is newer.
    fn version(self) -> u32 {
        self.history.max(self.legacy)
    }

    /// Refused when a newer planbot wrote it; else the version to adopt, when only an older
    /// planbot's record has one.
    fn check(self, known: u32) -> Result<Option<u32>, SchemaError> {
        let found = self.version();
        if found > known {
            return Err(SchemaError::TooNew { found, known });
        }
        Ok((self.history == 0 && self.legacy > 0).then_some(self.legacy))
    }
}

fn fake(version: u32) -> Target {
    Target::FakeVersion(version as i32)
}

/// Bring a SQLite database to [`SCHEMA_VERSION`]; returns the version found.
pub(super) fn migrate_sqlite(conn: &mut Connection) -> Result<u32, SchemaError> {
    migrate_sqlite_with(conn, &embedded(Kind::Sqlite))
}

fn migrate_sqlite_with(conn: &mut Connection, steps: &[Migration]) -> Result<u32, SchemaError> {
    let found = sqlite_found(conn)?;
    let known = steps.len() as u32;
    if let Some(version) = found.check(known)? {
        runner(steps, fake(version)).run(conn)?;
    }
    runner(steps, Target::Latest).run(conn)?;
    // What a planbot from before refinery reads: it refuses a database newer than it knows.
    conn.pragma_update(None, "user_version", known)?;
    Ok(found.version())
}

fn sqlite_found(conn: &Connection) -> rusqlite::Result<Found> {
    let legacy: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let history: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'refinery_schema_history'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let history = match history {
        Some(_) => conn.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM refinery_schema_history",
            [],
            |r| r.get(0),
        )?,
        None => 0,
    };
    Ok(Found {
        history: u32::try_from(history).unwrap_or(u32::MAX),
        legacy: u32::try_from(legacy).unwrap_or(u32::MAX),
    })
}

/// The schema version of a SQLite database (0: none yet).
pub(super) fn sqlite_version(conn: &Connection) -> rusqlite::Result<u32> {
    Ok(sqlite_found(conn)?.version())
}

/// Bring a PostgreSQL database to [`SCHEMA_VERSION`], under the migration lock; returns the
/// version found.
pub(super) async fn migrate_postgres(client: &mut Client) -> Result<u32, SchemaError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let migrated = migrate_postgres_locked(client, &embedded(Kind::Postgres)).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    migrated
}

async fn migrate_postgres_locked(
    client: &mut Client,
    steps: &[Migration],
) -> Result<u32, SchemaError> {
    let found = postgres_found(client).await?;
    let known = steps.len() as u32;
    if let Some(version) = found.check(known)? {
        runner(steps, fake(version)).run_async(client).await?;
    }
    runner(steps, Target::Latest).run_async(client).await?;
    if found.legacy > 0 {
        // What a planbot from before refinery reads (its heartbeat too): newer versions here.
        client
            .execute(
                "INSERT INTO schema_migrations (version, name, applied_at)
                 SELECT version, name, $1 FROM refinery_schema_history
                 WHERE version > (SELECT MAX(version) FROM schema_migrations)",
                &[&now_ms()],
            )
            .await?;
    }
    Ok(found.version())
}

async fn postgres_found(c: &impl GenericClient) -> Result<Found, tokio_postgres::Error> {
    let newest = |table: &'static str| async move {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await?
            .get(0);
        if !exists {
            return Ok::<u32, tokio_postgres::Error>(0);
        }
        let sql = format!("SELECT COALESCE(MAX(version), 0) FROM {table}");
        let v: i32 = c.query_one(&sql, &[]).await?.get(0);
        Ok(u32::try_from(v).unwrap_or(0))
    };
    Ok(Found {
        history: newest("refinery_schema_history").await?,
        legacy: newest("schema_migrations").await?,
    })
}

/// The schema version of a PostgreSQL database (0: none yet).
pub(super) async fn postgres_version(c: &impl GenericClient) -> Result<u32, tokio_postgres::Error> {
    Ok(postgres_found(c).await?.version())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(conn: &Connection) -> Vec<String> {
        let mut st = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    fn history(conn: &Connection) -> Vec<(i64, String)> {
        let mut st = conn
            .prepare("SELECT version, name FROM refinery_schema_history ORDER BY version")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn each_database_has_one_file_per_migration_and_no_other() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/capabilities/store/migrations"
        );
        let listed: Vec<String> = MIGRATIONS.iter().map(|m| format!("{}.sql", m.0)).collect();
        for db in ["sqlite", "postgres"] {
            let mut files: Vec<String> = std::fs::read_dir(format!("{dir}/{db}"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            files.sort_by_key(|f| embedded_version(f));
            assert_eq!(files, listed, "{db}: a file not in MIGRATIONS, or missing");
        }
        for kind in [Kind::Sqlite, Kind::Postgres] {
            let versions: Vec<i32> = embedded(kind).iter().map(|m| m.version()).collect();
            assert_eq!(versions, (1..=SCHEMA_VERSION as i32).collect::<Vec<_>>());
        }
    }

    fn embedded_version(file: &str) -> u32 {
        file[1..file.find("__").unwrap()].parse().unwrap()
    }

    #[test]
    fn a_new_database_gets_every_migration_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_sqlite(&mut conn).unwrap(), 0);
        assert_eq!(sqlite_version(&conn).unwrap(), SCHEMA_VERSION);
        let names: Vec<_> = history(&conn).into_iter().map(|(_, n)| n).collect();
        assert_eq!(
            names,
            [
                "initial",
                "policies",
                "drift",
                "targeting",
                "widgets",
                "kept_plans",
                "root_units"
            ]
        );
        // Opening again finds nothing to do.
        assert_eq!(migrate_sqlite(&mut conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(history(&conn).len(), SCHEMA_VERSION as usize);
        let user_version: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(user_version, SCHEMA_VERSION, "what older planbots read");
    }

    #[test]
    fn a_newer_database_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate_sqlite(&mut conn).unwrap_err();
        assert!(
            matches!(err, SchemaError::TooNew { found, known } if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION),
            "{err:?}"
        );
        assert!(tables(&conn).is_empty());
    }

    #[test]
    fn a_failing_migration_leaves_the_database_as_it_was() {
        let mut steps = embedded(Kind::Sqlite);
        steps.truncate(1);
        steps.push(
            Migration::unapplied(
                "V2__broken",
                "CREATE TABLE extra (x INTEGER); INSERT INTO nowhere VALUES (1);",
            )
            .unwrap(),
        );
        let mut conn = Connection::open_in_memory().unwrap();
        let err = anyhow::Error::from(migrate_sqlite_with(&mut conn, &steps).unwrap_err());
        assert!(format!("{err:#}").contains("nowhere"), "{err:#}");
        assert_eq!(sqlite_version(&conn).unwrap(), 0);
        assert_eq!(
            tables(&conn),
            ["refinery_schema_history"],
            "migration 1 was rolled back with 2"
        );
    }
}
