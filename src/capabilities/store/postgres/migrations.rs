//! The PostgreSQL store's schema as an ordered list of migrations, recorded in
//! `schema_migrations`, applied at start-up in one transaction under an advisory lock (replicas
//! starting together migrate once), refused when the database is newer than this binary.
//!
//! Add a migration by appending a file to `migrations/` and a line to [`MIGRATIONS`]; never
//! edit or reorder one that has shipped.

use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::SchemaError;
use tokio_postgres::Client;

/// The advisory lock key every planbot takes while it migrates ("planbot" in ASCII).
const MIGRATION_LOCK: i64 = 0x0070_6c61_6e62_6f74;

/// One step of the schema.
#[derive(Debug, Clone, Copy)]
pub(super) struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial schema with leases",
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

/// The PostgreSQL schema version this binary writes.
pub const PG_SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The newest migration recorded in `schema_migrations` (which must exist).
pub(super) async fn schema_version(
    c: &impl tokio_postgres::GenericClient,
) -> Result<u32, tokio_postgres::Error> {
    let found: i32 = c
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .get(0);
    Ok(u32::try_from(found).unwrap_or(0))
}

/// Bring the database to [`PG_SCHEMA_VERSION`]; returns the version found.
pub(super) async fn migrate(client: &mut Client) -> Result<u32, SchemaError> {
    apply(client, MIGRATIONS).await
}

pub(super) async fn apply(
    client: &mut Client,
    migrations: &[Migration],
) -> Result<u32, SchemaError> {
    let known = migrations.len() as u32;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_at BIGINT NOT NULL
         )",
    )
    .await?;
    let found = schema_version(&tx).await?;
    if found > known {
        return Err(SchemaError::TooNew { found, known });
    }
    for m in &migrations[found as usize..] {
        tx.batch_execute(m.sql)
            .await
            .map_err(|source| SchemaError::Migration {
                version: m.version,
                name: m.name,
                source: Box::new(source),
            })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            &[&(m.version as i32), &m.name, &now_ms()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(found)
}
