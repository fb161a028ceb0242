//! Storage errors. Messages are written for the user who sent the rejected write or scan.

use arrow::error::ArrowError;
use parquet::errors::ParquetError;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("duplicate primary key {key}")]
    DuplicateKey { key: String },
    #[error("row with primary key {key} not found")]
    KeyNotFound { key: String },
    #[error("NULL in primary key column '{column}'")]
    NullKey { column: String },
    #[error("NULL in NOT NULL column '{column}'")]
    NullValue { column: String },
    #[error("{0}")]
    SchemaMismatch(String),
    #[error("value of {length} characters is too long for column '{column}' VARCHAR({limit})")]
    TooLong {
        column: String,
        length: usize,
        limit: u32,
    },
    #[error("column '{column}' of the row {key} is not valid JSON: {message}")]
    InvalidJson {
        column: String,
        key: String,
        message: String,
    },
    #[error("invalid schema: {0}")]
    InvalidSchema(String),
    #[error("invalid predicate: {0}")]
    InvalidPredicate(String),
    #[error("snapshot {snapshot} is older than the history retention allows: history before {oldest} is not kept (the table keeps {retention})")]
    SnapshotTooOld {
        snapshot: String,
        oldest: String,
        retention: String,
    },
    #[error("row with primary key {key} is being changed by a transaction in progress; try again")]
    Locked { key: String },
    #[error("{0}")]
    TxnState(String),
    /// A request sent again was applied before, but what it did is no longer known.
    #[error("{0}")]
    OutcomeUnknown(String),
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("storage I/O error on {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("storage corrupted: {0}")]
    Corruption(String),
    #[error("{0}")]
    Arrow(#[from] ArrowError),
    #[error("parquet: {0}")]
    Parquet(#[from] ParquetError),
}

impl StorageError {
    /// Names `path` in an I/O error reading or writing it: `.map_err(StorageError::on(&path))`.
    pub fn on(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
        move |source| StorageError::File {
            path: path.display().to_string(),
            source,
        }
    }
}
