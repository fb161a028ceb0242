//! Nyala's engine: the pieces between SQL and storage that make tablets into a database.
//!
//! - [`clock::HybridClock`] hands out MVCC timestamps; the leader puts them in log entries.
//! - [`partition::PartitionSchema`] maps a row to its tablet: hash levels, then range partitions.
//! - [`replica::TabletReplica`] is one tablet behind its Raft log: writes are proposed, applied
//!   deterministically, and scans read at a safe snapshot.
//! - [`tserver::TabletServer`] hosts replicas, which its [`maintenance`] thread flushes and
//!   compacts; [`master::Master`] keeps the catalog, itself a Raft-logged tablet (as in Kudu).
//! - [`client::Client`] is what the SQL layer talks to: DDL through the master, writes routed to
//!   tablets by partition key, scans per tablet.
//!
//! In `nyala serve` the master and the tablet server live in one process and the client calls
//! them directly; the cluster issue puts RPC behind the same client API.

pub mod client;
pub mod clock;
pub mod error;
pub mod host;
pub mod maintenance;
pub mod master;
pub mod partition;
pub mod remote;
pub mod replica;
pub mod rpc;
pub mod tserver;

pub use client::{Client, TableHandle, TabletStats, WriteError};
pub use error::EngineError;
pub use master::{ColumnChange, TableId, TableInfo};
pub use nyala_storage as storage;
pub use partition::{BoundSpec, HashLevel, PartitionSchema, RangeSpec};

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
