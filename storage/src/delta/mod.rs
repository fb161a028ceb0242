//! Delta stores: the history of rows that live in a DiskRowSet (Kudu paper, section 4.3).
//!
//! A DiskRowSet's base data is immutable and holds one image per row. Its history is kept in
//! version records keyed by the row's ordinal in the rowset:
//!
//! - **REDO** records describe changes after the base image: `(ordinal, ts, new image)`, or a
//!   deletion. New ones collect in the rowset's [`DeltaMemStore`](memstore::DeltaMemStore)
//!   (images in the tablet's row arena); a flush writes them to a REDO [`DeltaFile`], which
//!   records the columns they may change ([`DeltaMeta::changed`]).
//! - **UNDO** records describe the versions before the base image: `(ordinal, ts, image before
//!   ts)`, where a missing image means the row did not exist before `ts`. They are written
//!   with the base data when a rowset is created (by a flush or a compaction). A major delta
//!   compaction that rewrites only some columns writes another UNDO file holding only those
//!   columns ([`DeltaMeta::columns`]): per-column records, whose other columns are those of
//!   the next newer version.
//!
//! The state of a row at snapshot S is: if it has UNDO records with `ts > S`, the base image
//! with each column taken from the oldest of them that holds the column (absent if the oldest
//! says the row did not exist yet); otherwise the image of its newest REDO record with
//! `ts <= S`; otherwise the base image. An UNDO file's records are older than the next UNDO
//! file's, and a row's REDO records newer than its UNDO records. Records at or before the
//! ancient history mark (the oldest snapshot a scan may use) are never needed, so rewrites drop
//! them, and a scan at a current snapshot reads no UNDO file at all (their newest records are
//! older than the snapshot).
//!
//! The files of this module: `file.rs` (delta files), `memstore.rs` (the DeltaMemStore, where
//! new REDO records collect), `tracker.rs` (a rowset's delta stores together: which record
//! gives a row's state at a snapshot) and `view.rs` (the images a scan reads instead of base
//! rows, put together from those records).

mod file;
mod memstore;
mod tracker;
mod view;

pub use file::{DeltaFile, DeltaMeta, Layout, Record};
pub use tracker::{Image, RowsetDeltas};
pub use view::View;
