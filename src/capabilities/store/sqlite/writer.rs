//! The group-commit writer: one thread, one connection, whatever is waiting in one transaction.
//!
//! Each operation of a batch runs under its own savepoint. An operation that fails is rolled
//! back to its savepoint and answered with its own error; the others of the batch still commit.
//! Every caller is answered only after the COMMIT. When the batch itself cannot go on (BEGIN,
//! a SAVEPOINT or a ROLLBACK TO fails, or SQLite ended the transaction on its own, as it does
//! on a full disk), the whole batch is rolled back and every caller in it gets the error: no
//! operation is ever told "done" for writes that did not commit, and no write of a failed
//! operation commits.

use anyhow::anyhow;
use rusqlite::Connection;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

/// Most operations batched into one transaction.
const MAX_BATCH: usize = 1024;

/// One write waiting for the writer thread.
pub(super) trait Operation: Send {
    /// Run against the connection, inside this operation's savepoint; `false` if it failed
    /// (its writes are then rolled back).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answer the caller: `Ok` once the batch committed, else why it did not.
    fn answer(self: Box<Self>, batch: Result<(), String>);
}

pub(super) type Op = Box<dyn Operation>;

/// An operation made of a closure; the caller waits on the receiver.
pub(super) fn operation<R, F>(f: F) -> (Op, tokio::sync::oneshot::Receiver<anyhow::Result<R>>)
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> anyhow::Result<R> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let op = Pending {
        f: Some(f),
        result: None,
        tx,
    };
    (Box::new(op), rx)
}

struct Pending<R, F> {
    f: Option<F>,
    result: Option<anyhow::Result<R>>,
    tx: tokio::sync::oneshot::Sender<anyhow::Result<R>>,
}

impl<R, F> Operation for Pending<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> anyhow::Result<R> + Send + 'static,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        // A panicking operation is a failed operation, not a dead writer.
        let r = catch_unwind(AssertUnwindSafe(|| f(conn)))
            .unwrap_or_else(|_| Err(anyhow!("the store operation panicked")));
        let ok = r.is_ok();
        self.result = Some(r);
        ok
    }

    fn answer(self: Box<Self>, batch: Result<(), String>) {
        let out = match (self.result, batch) {
            // Its own error first: its writes were rolled back whatever the batch did.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(r)), Ok(())) => Ok(r),
            (Some(Ok(_)), Err(e)) => Err(anyhow!("store commit failed: {e}")),
            (None, Err(e)) => Err(anyhow!("store operation not run: {e}")),
            (None, Ok(())) => Err(anyhow!("the store writer did not run the operation")),
        };
        let _ = self.tx.send(out);
    }
}

/// The writer thread's loop: until every sender is gone, take what is waiting and commit it.
pub(super) fn writer_loop(conn: Connection, rx: mpsc::Receiver<Op>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        run_batch(&conn, batch);
    }
}

/// Run one batch in one transaction and answer every operation in it.
pub(super) fn run_batch(conn: &Connection, batch: Vec<Op>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let why = format!("BEGIN: {e}");
        tracing::error!(error = %why, ops = batch.len(), "store batch not started");
        for op in batch {
            op.answer(Err(why.clone()));
        }
        return;
    }
    let mut done: Vec<Op> = Vec::with_capacity(batch.len());
    let mut ops = batch.into_iter();
    let mut broken: Option<String> = None;
    for mut op in ops.by_ref() {
        if let Err(e) = conn.execute_batch("SAVEPOINT planbot_op") {
            broken = Some(format!("SAVEPOINT: {e}"));
            done.push(op);
            break;
        }
        let ok = op.run(conn);
        done.push(op);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (full disk, I/O error), or the operation
            // ended it: nothing of this batch is in the database.
            broken = Some("the transaction was rolled back by SQLite".into());
            break;
        }
        let settle = if ok {
            conn.execute_batch("RELEASE planbot_op")
        } else {
            conn.execute_batch("ROLLBACK TO planbot_op; RELEASE planbot_op")
        };
        if let Err(e) = settle {
            let what = if ok { "RELEASE" } else { "ROLLBACK TO" };
            broken = Some(format!("{what}: {e}"));
            break;
        }
    }
    let outcome = match broken {
        Some(why) => {
            rollback(conn);
            Err(why)
        }
        None => conn.execute_batch("COMMIT").map_err(|e| {
            rollback(conn);
            format!("COMMIT: {e}")
        }),
    };
    if let Err(why) = &outcome {
        tracing::error!(error = %why, ops = done.len() + ops.len(), "store batch rolled back");
    }
    for op in done {
        op.answer(outcome.clone());
    }
    for op in ops {
        op.answer(outcome.clone());
    }
}

/// End a failed batch's transaction, if SQLite has not already.
fn rollback(conn: &Connection) {
    if conn.is_autocommit() {
        return;
    }
    if let Err(e) = conn.execute_batch("ROLLBACK") {
        // The connection is left inside a transaction; the next BEGIN will fail and say so.
        tracing::error!(error = %e, "store ROLLBACK failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (k TEXT NOT NULL UNIQUE)")
            .unwrap();
        c
    }

    fn keys(c: &Connection) -> Vec<String> {
        let mut st = c.prepare("SELECT k FROM t ORDER BY k").unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    fn insert(k: &'static str) -> impl FnOnce(&Connection) -> anyhow::Result<()> + Send {
        move |c| {
            c.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
            Ok(())
        }
    }

    #[test]
    fn a_failing_operation_leaves_no_partial_write_and_its_neighbours_commit() {
        let c = conn();
        let (a, ra) = operation(insert("a"));
        // Writes once, then fails on the second write (the key is taken).
        let (b, rb) = operation(|c: &Connection| {
            c.execute("INSERT INTO t (k) VALUES ('b')", [])?;
            c.execute("INSERT INTO t (k) VALUES ('a')", [])?;
            Ok(())
        });
        let (p, rp) = operation(|_: &Connection| -> anyhow::Result<()> { panic!("boom") });
        let (d, rd) = operation(insert("d"));
        run_batch(&c, vec![a, b, p, d]);
        assert!(ra.blocking_recv().unwrap().is_ok());
        let err = rb.blocking_recv().unwrap().unwrap_err();
        assert!(format!("{err:#}").contains("UNIQUE"), "{err:#}");
        let err = rp.blocking_recv().unwrap().unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err:#}");
        assert!(rd.blocking_recv().unwrap().is_ok());
        assert_eq!(keys(&c), ["a", "d"], "b's first insert was rolled back");
        assert!(c.is_autocommit());
    }

    #[test]
    fn a_batch_whose_transaction_ends_fails_every_caller_and_keeps_nothing() {
        let c = conn();
        let (a, ra) = operation(insert("a"));
        // Ends the transaction under the writer (as SQLite does on a full disk).
        let (b, rb) = operation(|c: &Connection| {
            c.execute_batch("ROLLBACK")?;
            Ok(())
        });
        let (d, rd) = operation(insert("d"));
        run_batch(&c, vec![a, b, d]);
        for r in [ra, rb, rd] {
            let err = r.blocking_recv().unwrap().unwrap_err();
            assert!(err.to_string().contains("rolled back"), "{err:#}");
        }
        assert!(keys(&c).is_empty(), "d did not run in autocommit mode");
        assert!(c.is_autocommit());
    }

    #[test]
    fn a_batch_that_cannot_begin_runs_nothing() {
        let c = conn();
        c.execute_batch("BEGIN").unwrap();
        let (a, ra) = operation(insert("a"));
        run_batch(&c, vec![a]);
        let err = ra.blocking_recv().unwrap().unwrap_err();
        assert!(err.to_string().contains("BEGIN"), "{err:#}");
        c.execute_batch("ROLLBACK").unwrap();
        assert!(keys(&c).is_empty());
    }
}
