//! Nyala's SQL layer: DataFusion with Nyala tables inside.
//!
//! A [`Database`] owns the engine (master catalog + tablet server) and hands out [`Session`]s.
//! A session takes one SQL statement at a time, parsed by [`parser::NyalaParser`] (sqlparser
//! with Nyala's grammar added): our own DDL (`CREATE TABLE ... DISTRIBUTE BY`, `ALTER TABLE`,
//! `DROP TABLE`) and catalog statements (`SHOW TABLES`, `DESCRIBE`, ...) are executed against
//! the catalog; everything else (queries, INSERT/UPSERT/UPDATE/DELETE, EXPLAIN) is planned and
//! run by DataFusion through the [`NyalaTable`](table::NyalaTable) provider, which turns scans
//! into tablet scans and DML into primary-key mutations.
//!
//! Every statement yields an Arrow stream: queries their rows, DML one row with a `count`
//! column (rows affected), DDL and SET no columns and no rows; a statement's
//! [`PlannedStatement::schema`] is always the schema of its stream.

mod backup;
mod catalog;
mod copy;
mod database;
mod ddl;
pub mod distributed;
mod error;
mod exec;
mod functions;
mod ingest;
mod limits;
mod parse;
mod plan;
mod results;
mod session;

pub use database::{Database, DatabaseOptions};
pub use error::SqlError;
pub use exec::runtime_filter;
pub use ingest::{count_of, IngestMode, IngestTarget};
pub use limits::interrupt::{Interrupt, Stop};
pub use limits::QueryLimits;
/// How a JSON column is marked in Arrow schemas (field metadata).
pub use nyala_storage::{EXTENSION_NAME, JSON_EXTENSION};
pub use parse::{parser, partitioning, statement};
pub use plan::planned::{PlannedStatement, StatementInfo, StatementKind};
pub use plan::prepared::PreparedStatement;
pub use session::access::{redact_passwords, Login};
pub use session::settings;
pub use session::Session;

pub type Result<T, E = SqlError> = std::result::Result<T, E>;

/// The catalog and schema names under which Nyala's tables appear to SQL and Flight SQL clients.
pub const CATALOG_NAME: &str = "nyala";
pub const SCHEMA_NAME: &str = "public";
