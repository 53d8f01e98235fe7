//! How a statement runs on either database: [`Sql`] (its text, written once with `?1, ?2 …` and
//! turned into PostgreSQL's `$1, $2 …` once, at first use; written for each database only where
//! they differ), [`Arg`] and [`Row`] (what goes in and comes out, the same for both), and
//! [`Conn`], a connection of either database (inside its transaction, where it has one).

use super::migrations::Kind;
use super::types::{ApplyId, QueueJobId};
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId, UserId};
use anyhow::{anyhow, bail, Result};
use futures::FutureExt;
use std::borrow::Cow;
use std::future::Future;
use std::sync::OnceLock;

/// One statement: SQLite's text and PostgreSQL's, both with `?N` placeholders.
pub(super) struct Sql {
    sqlite: &'static str,
    postgres: &'static str,
    /// `postgres` with `$N`, made at first use.
    dollars: OnceLock<String>,
}

impl Sql {
    /// A statement both databases run as written.
    pub(super) const fn both(text: &'static str) -> Sql {
        Sql::each(text, text)
    }

    /// A statement the databases write differently (upserts, locks, leases).
    pub(super) const fn each(sqlite: &'static str, postgres: &'static str) -> Sql {
        Sql {
            sqlite,
            postgres,
            dollars: OnceLock::new(),
        }
    }

    /// A statement only PostgreSQL runs (replicas: advisory locks, project locks).
    pub(super) const fn postgres(text: &'static str) -> Sql {
        Sql::each("", text)
    }

    /// The text `kind` runs.
    pub(super) fn text(&self, kind: Kind) -> &str {
        match kind {
            Kind::Sqlite => self.sqlite,
            Kind::Postgres => self.dollars.get_or_init(|| dollars(self.postgres)),
        }
    }
}

/// `?N` → `$N`: the one difference between the two databases' texts of a statement.
fn dollars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        let numbered = ch == '?' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if numbered { '$' } else { ch });
    }
    out
}

/// A statement's text made at run time (a page's filters, a dump's tables), for `kind`.
pub(super) fn built(kind: Kind, text: &str) -> Cow<'_, str> {
    match kind {
        Kind::Sqlite => Cow::Borrowed(text),
        Kind::Postgres => Cow::Owned(dollars(text)),
    }
}

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

/// One parameter. Its type is known even when it is NULL, as PostgreSQL wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
}

/// What can be a parameter, and its NULL.
pub(super) trait IntoArg {
    fn into_arg(self) -> Arg;
    fn null() -> Arg;
}

impl<T: IntoArg> IntoArg for Option<T> {
    fn into_arg(self) -> Arg {
        self.map_or_else(T::null, T::into_arg)
    }
    fn null() -> Arg {
        T::null()
    }
}

/// Integers, and the ids that are integers.
macro_rules! int_args {
    ($($t:ty => |$v:ident| $e:expr),+ $(,)?) => {$(
        impl IntoArg for $t {
            fn into_arg(self) -> Arg {
                let $v = self;
                Arg::Int(Some($e))
            }
            fn null() -> Arg {
                Arg::Int(None)
            }
        }
    )+};
}

int_args!(
    i64 => |v| v,
    u32 => |v| i64::from(v),
    ProjectId => |v| v.0 as i64,
    MrIid => |v| v.0 as i64,
    RunId => |v| v.0 as i64,
    NoteId => |v| v.0 as i64,
    JobId => |v| v.0 as i64,
    UserId => |v| v.0 as i64,
    QueueJobId => |v| v.0,
    ApplyId => |v| v.0,
);

impl IntoArg for String {
    fn into_arg(self) -> Arg {
        Arg::Text(Some(self))
    }
    fn null() -> Arg {
        Arg::Text(None)
    }
}

impl IntoArg for &str {
    fn into_arg(self) -> Arg {
        self.to_string().into_arg()
    }
    fn null() -> Arg {
        String::null()
    }
}

impl IntoArg for &String {
    fn into_arg(self) -> Arg {
        self.as_str().into_arg()
    }
    fn null() -> Arg {
        String::null()
    }
}

impl IntoArg for &CommitSha {
    fn into_arg(self) -> Arg {
        self.0.as_str().into_arg()
    }
    fn null() -> Arg {
        String::null()
    }
}

/// The parameters of a statement, in order.
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        Vec::<$crate::capabilities::store::sql::Arg>::from([
            $($crate::capabilities::store::sql::IntoArg::into_arg($a)),*
        ])
    };
}
pub(super) use args;

/// One row of a result, its values in the statement's column order.
#[derive(Debug, Clone)]
pub(super) struct Row(pub(super) Vec<Value>);

impl Row {
    /// Column `i`, as `T`.
    pub(super) fn get<T: FromValue>(&self, i: usize) -> Result<T> {
        let v = self.0.get(i).ok_or_else(|| anyhow!("no column {i}"))?;
        T::from_value(v).ok_or_else(|| anyhow!("column {i} holds {v:?}"))
    }
}

/// What a value can be read as.
pub(super) trait FromValue: Sized {
    fn from_value(v: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Option<i64> {
        match v {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Option<String> {
        match v {
            Value::Text(t) => Some(t.clone()),
            _ => None,
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Option<Option<T>> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A connection of either database. Each store query is one function over it.
#[allow(async_fn_in_trait)]
pub(super) trait Conn {
    fn kind(&self) -> Kind;

    /// This replica's name and its lease (ms), on PostgreSQL: what owns jobs, runs, applies.
    fn owner(&self) -> Option<(&str, i64)>;

    /// Run `text` (this database's own) and read its rows; `cache`: keep it prepared.
    async fn query_text(&self, text: &str, args: &[Arg], cache: bool) -> Result<Vec<Row>>;

    /// Run `text` (this database's own); how many rows it changed.
    async fn execute_text(&self, text: &str, args: &[Arg], cache: bool) -> Result<u64>;

    fn is_postgres(&self) -> bool {
        self.kind() == Kind::Postgres
    }

    /// This replica's name, as a parameter, on PostgreSQL.
    fn replica(&self) -> Option<Arg> {
        self.owner().map(|(replica, _)| replica.into_arg())
    }

    async fn rows(&self, sql: &Sql, args: &[Arg]) -> Result<Vec<Row>> {
        self.query_text(sql.text(self.kind()), args, true).await
    }

    /// At most one row.
    async fn opt(&self, sql: &Sql, args: &[Arg]) -> Result<Option<Row>> {
        let mut rows = self.rows(sql, args).await?;
        if rows.len() > 1 {
            bail!("{} rows where one at most was expected", rows.len());
        }
        Ok(rows.pop())
    }

    /// Exactly one row.
    async fn one(&self, sql: &Sql, args: &[Arg]) -> Result<Row> {
        self.opt(sql, args)
            .await?
            .ok_or_else(|| anyhow!("no row where one was expected"))
    }

    async fn execute(&self, sql: &Sql, args: &[Arg]) -> Result<u64> {
        self.execute_text(sql.text(self.kind()), args, true).await
    }
}

/// `f` as it is, its output named a `Result`: so a `?` inside an async block knows its error.
pub(super) fn typed<R, F: Future<Output = Result<R>>>(f: F) -> F {
    f
}

/// The answer of a future that completes at once: a SQLite connection's statements never wait.
pub(super) fn now<R>(f: impl Future<Output = Result<R>>) -> Result<R> {
    f.now_or_never()
        .unwrap_or_else(|| Err(anyhow!("a SQLite store operation waited")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_placeholders_become_postgres_ones_and_nothing_else_changes() {
        assert_eq!(
            dollars(
                "SELECT json_extract(p, '$.a') FROM t WHERE a = ?1 AND b IN (?2, ?10) AND c = '?'"
            ),
            "SELECT json_extract(p, '$.a') FROM t WHERE a = $1 AND b IN ($2, $10) AND c = '?'"
        );
        let s = Sql::both("SELECT ?1");
        assert_eq!(s.text(Kind::Sqlite), "SELECT ?1");
        assert_eq!(s.text(Kind::Postgres), "SELECT $1");
    }
}
