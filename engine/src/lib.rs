//! Nyala's engine: the pieces between SQL and storage that make tablets into a database,
//! in folders by role as in Kudu (`src/kudu/{master,tserver,client,consensus,rpc}`).
//!
//! - [`catalog`]: what a table is ([`TableInfo`]) and the DDL operations ([`DdlOp`]); the
//!   [`catalog::Catalog`] seam through which a client reads and changes it.
//! - [`master`]: the [`master::Master`] keeps the catalog, itself a Raft-logged tablet (as in
//!   Kudu), places tablets ([`master::TabletPlacement`]), tracks tablet servers from their
//!   reports ([`master::TServerRegistry`]) and re-replicates; its RPC service.
//! - [`tserver`]: the [`tserver::TabletServer`] hosts [`tserver::replica::TabletReplica`]s (a
//!   tablet behind its Raft log), flushes and compacts them, and serves writes, scans and
//!   tablet copies over RPC.
//! - [`consensus`]: Raft between servers — the transport out, the service in.
//! - [`client`]: [`Client`] is what the SQL layer talks to: DDL through the catalog, writes
//!   routed to tablets by partition key, scans per tablet, through the [`client::Tablets`]
//!   seam; [`client::MetaCache`] knows where a cluster's tablets and leaders are.
//! - [`metrics`]: the engine's Prometheus metrics (events counted where they happen) and the
//!   RPC metrics layer; tablet, Raft and master state are read at scrape time by collectors in
//!   [`tserver::metrics`] and [`master::metrics`].
//! - [`rpc`]: the typed gRPC services generated from `engine/proto/`, and how errors cross them.
//! - [`embedded`]: the single node of `nyala serve`, master and tablet server in one process
//!   on the same seams.
//! - [`clock::HybridClock`] hands out MVCC timestamps; [`partition::PartitionSchema`] maps a
//!   row to its tablet.

pub mod catalog;
pub mod client;
pub mod clock;
pub mod consensus;
pub mod dir_lock;
pub mod embedded;
pub mod error;
pub mod master;
pub mod metrics;
pub mod partition;
pub mod rpc;
pub mod tserver;

pub use catalog::{
    Access, ColumnChange, DdlOp, Privilege, ScramVerifier, TableId, TableInfo, UserInfo, ViewInfo,
    SCRAM_ITERATIONS,
};
pub use client::{Client, TableHandle, TabletStats, Transaction, WriteError, Written};
pub use error::EngineError;
pub use nyala_storage as storage;
pub use partition::{BoundSpec, HashLevel, HashSpec, PartitionSchema, RangeSpec};

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
