//! Nyala's tablet storage (Kudu paper, section 4): schema and key encoding, the in-memory
//! MemRowSet, immutable columnar DiskRowSets with delta stores, MVCC snapshots and scans that
//! return Arrow batches with projection and predicates applied.
//!
//! The crate knows nothing of networks, Raft or SQL: the engine applies writes in log order
//! through [`Tablet::apply`], flushes when asked, and scans at a snapshot timestamp.

mod bloom;
mod cache;
mod checksum;
mod column_map;
mod delta;
mod diskrowset;
mod error;
mod history;
mod key;
mod memrowset;
pub mod panics;
mod rowset_tree;
mod scalar;
mod scan;
mod schema;
mod tablet;
mod wire;
mod write;

pub use bloom::{FilterStats, JoinFilter, BLOOM_WARMUP_ROWS};
pub use cache::PageCache;
pub use diskrowset::ColumnRange;
pub use error::StorageError;
pub(crate) use key::KeyBytes;
pub use key::{encode_key_columns, encode_keys, format_key};
pub use scalar::Scalar;
pub use scan::{
    equality_combinations, predicate_mask, ColumnPredicate, PredicateOp, ScanIterator, ScanSpec,
};
pub use schema::{
    ColumnCompression, ColumnEncoding, ColumnSchema, ColumnType, Schema, AUTO_INCREMENT_COLUMN,
    EXTENSION_NAME, JSON_EXTENSION,
};
pub use tablet::{
    change_fields, FailPoint, Holds, MaintenanceKind, MaintenanceOp, RequestId, Tablet,
    TabletOptions, TxnState, CHANGE_COLUMN, COMMIT_TIME_COLUMN, REQUEST_RETENTION,
};
pub use write::{rows_bytes, AutoIds, TabletOp, Timestamp, WriteBatch, WriteKind, WriteOutcome};
