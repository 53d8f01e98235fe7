//! Opening SQLite connections the store's way, and the thread that checkpoints the WAL.
//!
//! One file in `data_dir`, WAL mode. `synchronous=NORMAL` in WAL mode: a committed transaction
//! survives a crash of the planbot process (it is in the WAL file, written before the answer),
//! but the last transactions before a power loss or kernel crash may be lost (they are not
//! fsynced on every commit). GitLab does not re-deliver lost webhooks either way, and the
//! start-up reconciliation re-plans any open MR whose head has no plan, so this trade buys an
//! order of magnitude in webhook throughput.

use anyhow::{Context, Result};
use rusqlite::Connection;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Open `path` with the store's settings (WAL, `synchronous=NORMAL`, foreign keys, a busy wait).
pub(super) fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    configure(&conn).context("configuring SQLite")?;
    Ok(conn)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    // Every statement of the store stays prepared, a run page's filters too.
    conn.set_prepared_statement_cache_capacity(128);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // See the module comment: durable against a process crash, not against power loss.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

/// Start the checkpoint thread on its own connection; it stops (after a final TRUNCATE
/// checkpoint) when the returned sender is dropped. Checkpoints fsync, so they run here and
/// not inside the writer's COMMIT: a webhook's answer never waits for one.
pub(super) fn spawn_checkpointer(path: &Path) -> Result<mpsc::Sender<()>> {
    let conn = open(path)?;
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("planbot-store-checkpoint".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(CHECKPOINT_EVERY)
            {
                // PASSIVE never blocks the writer or the readers; a failed one is retried next tick.
                let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            }
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
                tracing::debug!(error = %e, "final store checkpoint failed; the WAL is folded in at next open");
            }
        })
        .context("starting the store checkpoint thread")?;
    Ok(stop_tx)
}
