//! Every row of every table, the same on either database: what `planbot store migrate` copies
//! ([`Store::export`] from one store, [`Store::import`] into another).

use super::sql::{built, Arg, Conn, Value};
use super::{read, write, Store};
use anyhow::{anyhow, Context, Result};

/// One column's type, as both backends store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Int,
    Text,
}

/// The tables a dump holds, parents first, each with its columns (the SQLite schema's).
/// PostgreSQL keeps more columns (leases, owners): they are not copied, a copied job is not
/// running anywhere yet.
pub(crate) const TABLES: &[(&str, &[(&str, Ty)])] = &[
    (
        "deliveries",
        &[
            ("id", Ty::Int),
            ("key", Ty::Text),
            ("event", Ty::Text),
            ("outcome", Ty::Text),
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("received_at", Ty::Int),
        ],
    ),
    (
        "jobs",
        &[
            ("id", Ty::Int),
            ("kind", Ty::Text),
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("sha", Ty::Text),
            ("payload", Ty::Text),
            ("state", Ty::Text),
            ("attempts", Ty::Int),
            ("detail", Ty::Text),
            ("delivery_id", Ty::Int),
            ("created_at", Ty::Int),
            ("started_at", Ty::Int),
            ("finished_at", Ty::Int),
        ],
    ),
    (
        "runs",
        &[
            ("id", Ty::Int),
            ("job_id", Ty::Int),
            ("kind", Ty::Text),
            ("project_id", Ty::Int),
            ("project_path", Ty::Text),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("state", Ty::Text),
            ("started_at", Ty::Int),
            ("finished_at", Ty::Int),
            ("summary", Ty::Text),
            ("log", Ty::Text),
            ("note_markdown", Ty::Text),
            ("fingerprint", Ty::Text),
        ],
    ),
    (
        "fingerprints",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("fingerprint", Ty::Text),
            ("run_id", Ty::Int),
            ("shown_at", Ty::Int),
        ],
    ),
    (
        "plan_digests",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("digest", Ty::Text),
        ],
    ),
    (
        "widget_reports",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("report", Ty::Text),
        ],
    ),
    (
        "kept_plans",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("head", Ty::Text),
            ("planned_commit", Ty::Text),
            ("inputs", Ty::Text),
            ("outcome", Ty::Text),
            ("document", Ty::Text),
            ("digests", Ty::Text),
            ("kept_at", Ty::Int),
        ],
    ),
    (
        "unit_results",
        &[
            ("job_id", Ty::Int),
            ("parent_id", Ty::Int),
            ("sealed", Ty::Text),
            ("created_at", Ty::Int),
        ],
    ),
    (
        "mr_notes",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("note_id", Ty::Int),
            ("updated_at", Ty::Int),
        ],
    ),
    (
        "applies",
        &[
            ("id", Ty::Int),
            ("ci_job_id", Ty::Int),
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("sha", Ty::Text),
            ("roots", Ty::Text),
            ("state", Ty::Text),
            ("started_at", Ty::Int),
            ("finished_at", Ty::Int),
            ("detail", Ty::Text),
        ],
    ),
    (
        "policy_verdicts",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("fingerprint", Ty::Text),
            ("verdict", Ty::Text),
            ("recorded_at", Ty::Int),
        ],
    ),
    (
        "policy_approvals",
        &[
            ("id", Ty::Int),
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("root", Ty::Text),
            ("sha", Ty::Text),
            ("fingerprint", Ty::Text),
            ("policy_set", Ty::Text),
            ("approver_id", Ty::Int),
            ("approver", Ty::Text),
            ("approved_at", Ty::Int),
        ],
    ),
    (
        "drift_ticks",
        &[
            ("tick_at", Ty::Int),
            ("job_id", Ty::Int),
            ("claimed_at", Ty::Int),
        ],
    ),
    (
        "drift_roots",
        &[
            ("project_id", Ty::Int),
            ("root", Ty::Text),
            ("project_path", Ty::Text),
            ("outcome", Ty::Text),
            ("drifted", Ty::Int),
            ("checked_at", Ty::Int),
            ("checked_ok_at", Ty::Int),
        ],
    ),
    (
        "plan_targeting",
        &[
            ("project_id", Ty::Int),
            ("mr_iid", Ty::Int),
            ("sha", Ty::Text),
            ("root", Ty::Text),
            ("targeting", Ty::Text),
            ("author_id", Ty::Int),
            ("set_at", Ty::Int),
        ],
    ),
];

/// Every row of every table in [`TABLES`], in insertion order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    /// (table, rows), in [`TABLES`] order; each row's values in the table's column order.
    pub tables: Vec<(String, Vec<Vec<Value>>)>,
}

impl Dump {
    /// How many rows each table has, for the migrate command's report.
    pub fn counts(&self) -> Vec<(String, usize)> {
        self.tables
            .iter()
            .map(|(t, rows)| (t.clone(), rows.len()))
            .collect()
    }
}

/// The column list of a table, comma-separated.
pub(crate) fn column_list(cols: &[(&str, Ty)]) -> String {
    cols.iter().map(|(c, _)| *c).collect::<Vec<_>>().join(", ")
}

/// The parameter for `v`, a value of a column of type `ty`.
fn arg(v: &Value, ty: Ty) -> Arg {
    match (v, ty) {
        (Value::Int(n), _) => Arg::Int(Some(*n)),
        (Value::Text(t), _) => Arg::Text(Some(t.clone())),
        (Value::Null, Ty::Int) => Arg::Int(None),
        (Value::Null, Ty::Text) => Arg::Text(None),
    }
}

/// Every row of `table`, in insertion order (PostgreSQL keeps it in `seq` or the id).
async fn rows_of(c: &impl Conn, table: &str, cols: &[(&str, Ty)]) -> Result<Vec<Vec<Value>>> {
    let order = match (c.is_postgres(), table) {
        (false, _) => "rowid",
        (true, "fingerprints") => "seq",
        (true, _) => "1",
    };
    let text = format!("SELECT {} FROM {table} ORDER BY {order}", column_list(cols));
    let rows = c.query_text(&text, &[], true).await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

/// Copy `rows` into the empty `table`.
async fn load(c: &impl Conn, table: &str, rows: &[Vec<Value>]) -> Result<()> {
    let (_, cols) = TABLES
        .iter()
        .find(|(t, _)| *t == table)
        .ok_or_else(|| anyhow!("unknown table {table} in the dump"))?;
    let count = format!("SELECT COUNT(*) FROM {table}");
    let n: i64 = c.query_text(&count, &[], false).await?[0].get(0)?;
    anyhow::ensure!(n == 0, "the target store's table {table} is not empty");
    let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
    let insert = format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        column_list(cols),
        marks.join(", ")
    );
    let insert = built(c.kind(), &insert);
    for row in rows {
        let args: Vec<Arg> = row
            .iter()
            .zip(cols.iter())
            .map(|(v, (_, ty))| arg(v, *ty))
            .collect();
        c.execute_text(&insert, &args, true)
            .await
            .with_context(|| format!("copying a row of {table}"))?;
    }
    if c.is_postgres() && cols.first().map(|(c, _)| *c) == Some("id") {
        // New rows get ids after the copied ones.
        let next = format!(
            "SELECT setval(pg_get_serial_sequence('{table}', 'id'),
                           COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
        );
        c.query_text(&next, &[], false).await?;
    }
    Ok(())
}

impl Store {
    /// Every row of every table.
    pub async fn export(&self) -> Result<Dump> {
        read!(self, |c| {
            let mut out = Dump::default();
            for (table, cols) in TABLES {
                out.tables
                    .push((table.to_string(), rows_of(c, table, cols).await?));
            }
            Ok(out)
        })
    }

    /// Load `dump` into this (empty) store, keeping ids; all or nothing.
    pub async fn import(&self, dump: Dump) -> Result<()> {
        write!(self, |c| {
            for (table, rows) in &dump.tables {
                load(c, table, rows).await?;
            }
            Ok(())
        })
    }
}
