//! Every row of every table, backend-neutral: what `planbot store migrate` copies.

/// One column's type, as both backends store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    Int,
    Text,
}

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
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
