//! The statements Nyala knows, as [`crate::parse::parser::NyalaParser`] hands them to a session.
//!
//! This is the one vocabulary of the SQL layer: the parser produces a [`NyalaStatement`], a
//! session plans it, and DDL is carried as parsed ([`Ddl`]) all the way to the catalog, so a
//! statement kind is defined once instead of once per stage. Statements DataFusion plans stay
//! sqlparser ASTs; Nyala's own are resolved against names here (a CREATE TABLE already holds its
//! storage schema and partitioning), so what is wrong with them is found before anything runs.

use datafusion::sql::sqlparser::ast::{
    DoUpdate, Expr, Ident, Insert, Merge, ObjectName, ObjectNamePart, Query, Statement, Update,
};
use nyala_engine::{ColumnChange, PartitionSchema, RangeSpec};
use nyala_storage::{ColumnSchema, ColumnType, Schema};

use crate::parse::partitioning::PartitionSpec;
use crate::{Result, SqlError};

/// A statement, classified.
#[derive(Debug)]
pub enum NyalaStatement {
    /// Changes to the catalog, run as parsed.
    Ddl(Ddl),
    /// `CREATE TABLE t PRIMARY KEY (...) [DISTRIBUTE BY ...] AS <query>`: the columns come from
    /// the query, planned by the session.
    CreateTableAs(CreateTableAsSpec),
    /// `CREATE TABLE [IF NOT EXISTS] t CLONE source [AS OF <time>]`: the time is evaluated by
    /// the session.
    CloneTable {
        name: String,
        source: String,
        if_not_exists: bool,
        as_of: Option<Box<Expr>>,
    },
    /// Answered from the catalog or the session (`SHOW TABLES`, `DESCRIBE`, ...).
    Show(Show),
    /// Planned by DataFusion: queries, INSERT/UPSERT/UPDATE/DELETE, EXPLAIN, SET.
    DataFusion(Box<Statement>),
    /// `INSERT IGNORE INTO ...` (possibly under EXPLAIN), held as the plain INSERT.
    InsertIgnore(Box<Statement>),
    /// `UPDATE t SET ... FROM s [WHERE ...]`, which DataFusion 55 does not plan, possibly
    /// under `EXPLAIN [ANALYZE] [VERBOSE]` (`explain`: Some((verbose, analyze))).
    UpdateFrom {
        update: Box<Update>,
        explain: Option<(bool, bool)>,
    },
    /// `INSERT ... ON CONFLICT [(key)] DO NOTHING | DO UPDATE SET ... [WHERE ...]`.
    InsertOnConflict(OnConflictSpec),
    /// `MERGE INTO t USING source ON ... WHEN [NOT] MATCHED ... THEN ...`.
    Merge(Box<Merge>),
    /// `COPY ... FROM 'path'` or `COPY ... TO 'path'`: a file on the server.
    CopyFile(CopyFileSpec),
    /// `BACKUP DATABASE | TABLE a, b TO 'dir' [INCREMENTAL FROM 'parent']`.
    Backup(BackupSpec),
    /// `RESTORE DATABASE FROM 'dir'` or `RESTORE TABLE t FROM 'dir' [AS new]`.
    Restore(RestoreSpec),
}

/// An `INSERT ... ON CONFLICT` ([`crate::plan::on_conflict`]).
#[derive(Debug)]
pub struct OnConflictSpec {
    /// The INSERT, without its ON CONFLICT clause.
    pub insert: Box<Insert>,
    /// The conflict target's columns, if given (they must be the primary key).
    pub target: Option<Vec<String>>,
    /// `DO UPDATE SET ... [WHERE ...]`; None: `DO NOTHING`.
    pub update: Option<DoUpdate>,
}

/// A COPY between a table and files on the server ([`crate::copy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFileSpec {
    pub direction: CopyDirection,
    /// The file (for COPY FROM, a glob pattern may name several).
    pub path: String,
    pub format: FileFormat,
    /// CSV: whether the first line names the columns.
    pub header: bool,
    /// CSV: the field delimiter.
    pub delimiter: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyDirection {
    /// Into `table`, its `columns` (all when empty).
    From { table: String, columns: Vec<String> },
    /// The rows of `query` out.
    To { query: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Parquet,
    Csv,
    /// Newline-delimited JSON: one object per line.
    Json,
}

/// The query `COPY table [(columns)] TO ...` copies.
pub fn copy_table_query(table: &ObjectName, columns: &[Ident]) -> String {
    let columns = match columns.is_empty() {
        true => "*".to_string(),
        false => (columns.iter().map(ToString::to_string))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("SELECT {columns} FROM {table}")
}

impl FileFormat {
    /// The format a file's extension says.
    pub fn of_path(path: &str) -> Option<Self> {
        let extension = path.rsplit_once('.')?.1.to_ascii_lowercase();
        match extension.as_str() {
            "parquet" => Some(FileFormat::Parquet),
            "csv" => Some(FileFormat::Csv),
            "json" | "jsonl" | "ndjson" => Some(FileFormat::Json),
            _ => None,
        }
    }
}

/// What a BACKUP statement asks for ([`crate::backup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSpec {
    /// The tables; None: every table and view (`BACKUP DATABASE`).
    pub tables: Option<Vec<String>>,
    /// The directory the backup goes to, on the server that runs the statement.
    pub path: String,
    /// `INCREMENTAL FROM 'parent'`: the backup whose snapshot this one's changes start at.
    pub parent: Option<String>,
}

/// What a RESTORE statement asks for ([`crate::backup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSpec {
    /// The table and the name to restore it as; None: every table and view of the backup
    /// (`RESTORE DATABASE`).
    pub table: Option<(String, String)>,
    /// The backup's directory, on the server that runs the statement.
    pub path: String,
}

/// The statements that change the catalog.
#[derive(Debug)]
pub enum Ddl {
    CreateTable(CreateTableSpec),
    /// A table clone, its time evaluated (None: as of when it runs).
    CloneTable {
        name: String,
        source: String,
        if_not_exists: bool,
        as_of: Option<nyala_storage::Timestamp>,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    RenameTable {
        name: String,
        new_name: String,
    },
    /// `ALTER TABLE t ADD|DROP|RENAME COLUMN ...`.
    AlterColumns {
        name: String,
        changes: Vec<ColumnAlteration>,
    },
    /// `ALTER TABLE t SET (history_max_age_secs = n)`.
    SetTableOptions {
        name: String,
        history_max_age_secs: u64,
    },
    /// `ALTER TABLE t ADD|DROP RANGE PARTITION ...`.
    AlterRangePartition {
        name: String,
        add: bool,
        range: RangeSpec,
    },
    /// `CREATE [OR REPLACE] VIEW name AS query` (the query's text; the session checks it
    /// plans before the view is created).
    CreateView {
        name: String,
        sql: String,
        or_replace: bool,
    },
    DropView {
        name: String,
        if_exists: bool,
    },
    /// `CREATE USER [IF NOT EXISTS] name WITH PASSWORD '...'`.
    CreateUser {
        name: String,
        password: Secret,
        if_not_exists: bool,
    },
    /// `ALTER USER name WITH PASSWORD '...'`.
    AlterUser {
        name: String,
        password: Secret,
    },
    /// `DROP USER [IF EXISTS] name`.
    DropUser {
        name: String,
        if_exists: bool,
    },
    /// `GRANT privileges ON [TABLE] object TO user` (`grant`) or `REVOKE ... FROM user`.
    Privileges {
        object: String,
        user: String,
        privileges: Vec<nyala_engine::Privilege>,
        grant: bool,
    },
}

/// A password as a statement carries it: never printed.
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The statements answered with rows computed when they are planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Show {
    /// `SHOW TABLES` (without a filter; with one DataFusion answers from information_schema).
    Tables,
    /// `DESCRIBE t`.
    Describe(String),
    /// `SHOW CREATE TABLE t`.
    CreateTable(String),
    /// `SHOW PARTITIONS t`.
    Partitions(String),
    /// `SHOW nyala.<setting>` (DataFusion's SHOW knows only its own settings).
    Setting(String),
    /// `SHOW GRANTS`: the privileges the session's user may know of (the administrator: all).
    Grants,
}

/// One column change of an ALTER TABLE.
#[derive(Debug)]
pub struct ColumnAlteration {
    pub change: ColumnChange,
    /// `ADD ... IF NOT EXISTS` / `DROP ... IF EXISTS`: nothing to do when the column already
    /// exists / does not exist.
    pub if_exists: bool,
}

#[derive(Debug)]
pub struct CreateTableAsSpec {
    pub name: String,
    pub if_not_exists: bool,
    /// `WITH (replicas = n)`; 0: the default.
    pub replicas: usize,
    /// `WITH (history_max_age_secs = n)`; None: the server's retention.
    pub history_max_age_secs: Option<u64>,
    pub key: Vec<String>,
    pub partition: PartitionSpec,
    pub query: Box<Query>,
}

#[derive(Debug)]
pub struct CreateTableSpec {
    pub name: String,
    pub if_not_exists: bool,
    /// `WITH (replicas = n)`; 0: the default.
    pub replicas: usize,
    pub schema: Schema,
    pub partition: PartitionSchema,
}

/// The options of `CREATE TABLE ... WITH (...)` and `ALTER TABLE ... SET (...)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableOptions {
    /// `replicas = n`; 0: the default (CREATE TABLE only).
    pub replicas: usize,
    /// `history_max_age_secs = n`: how long the table keeps its history; None: as the server
    /// does (`--history-max-age-secs`).
    pub history_max_age_secs: Option<u64>,
}

/// How [`CreateTableSpec::from_arrow`] sets the NULL-ability of non-key columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nullability {
    /// As the Arrow fields say (a query's result).
    FromFields,
    /// Always nullable (loaded data, whose fields often claim NOT NULL by accident).
    Nullable,
}

impl CreateTableSpec {
    /// A table holding the columns of `fields` (from `source`, named in errors) keyed by the
    /// `key` columns (NOT NULL) and partitioned by `partition`.
    pub fn from_arrow(
        name: &str,
        fields: &arrow::datatypes::Fields,
        source: &str,
        nullability: Nullability,
        key: &[String],
        partition: &PartitionSpec,
    ) -> Result<Self> {
        let index = |name: &String, what: &str| {
            fields.iter().position(|f| f.name() == name).ok_or_else(|| {
                SqlError::Invalid(format!(
                    "{what} column '{name}' is not a column of {source}"
                ))
            })
        };
        let key_columns = key
            .iter()
            .map(|k| index(k, "primary key"))
            .collect::<Result<Vec<_>>>()?;
        let columns = fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let column_type = ColumnType::from_arrow(f.data_type()).ok_or_else(|| {
                    SqlError::Invalid(format!(
                        "column '{}' of {source} has type {}, which a table cannot store; cast it",
                        f.name(),
                        f.data_type()
                    ))
                })?;
                let nullable = !key_columns.contains(&i)
                    && (nullability == Nullability::Nullable || f.is_nullable());
                Ok(ColumnSchema::new(f.name().clone(), column_type, nullable))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = match key_columns.is_empty() {
            true => Schema::without_declared_key(columns),
            false => Schema::new(columns, key_columns),
        };
        let schema = schema.map_err(|e| SqlError::Invalid(e.to_string()))?;
        Ok(CreateTableSpec {
            name: name.to_string(),
            if_not_exists: false,
            replicas: 0,
            partition: partition.resolve(&schema)?,
            schema,
        })
    }
}

/// SQL identifier normalisation as DataFusion does it: unquoted → lowercase, quoted → verbatim.
pub fn normalize_ident(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_ascii_lowercase(),
    }
}

/// A table name: `t` or `nyala.public.t` / `public.t`.
pub fn object_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<&Ident> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(ident) => Ok(ident),
            other => Err(SqlError::Parse(format!("unexpected name part {other}"))),
        })
        .collect::<Result<_>>()?;
    let Some((table, qualifiers)) = parts.split_last() else {
        return Err(SqlError::Parse("missing table name".into()));
    };
    let expected = [crate::CATALOG_NAME, crate::SCHEMA_NAME];
    let qualifiers: Vec<String> = qualifiers.iter().map(|i| normalize_ident(i)).collect();
    let qualifiers_ref: Vec<&str> = qualifiers.iter().map(String::as_str).collect();
    if qualifiers.len() > 2 || !expected.ends_with(&qualifiers_ref) {
        return Err(SqlError::Invalid(format!(
            "unknown schema '{}': tables live in {}.{}",
            qualifiers.join("."),
            crate::CATALOG_NAME,
            crate::SCHEMA_NAME
        )));
    }
    Ok(normalize_ident(table))
}
