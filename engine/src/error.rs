//! Engine errors: what the catalog, routing and replicas report to the SQL layer.

use nyala_raft::RaftError;
use nyala_storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("table '{0}' does not exist")]
    TableNotFound(String),
    #[error("table '{0}' already exists")]
    TableExists(String),
    #[error("tablet {0} not found on this server")]
    TabletNotFound(String),
    #[error("invalid table definition: {0}")]
    InvalidTable(String),
    #[error("{0}")]
    NoRangePartition(String),
    #[error("{0}")]
    Unsupported(String),
    /// The server cannot take the request now (memory over its limit); retrying later may work.
    #[error("{0}")]
    Busy(String),
    /// DDL sent to a master that does not lead the replicated catalog.
    #[error("this master does not lead the catalog{}; run DDL through the leading master", leader.as_ref().map(|l| format!(" (it is {l})")).unwrap_or_default())]
    NotLeaderMaster { leader: Option<String> },
    /// Another server refused the request, saying why.
    #[error("{0}")]
    Remote(String),
    /// Another server could not be reached.
    #[error("server unavailable: {0}")]
    Unavailable(String),
    /// A transaction's commit was sent but its answer lost: it is committed or rolled back,
    /// as the transaction status table decides, within seconds.
    #[error(
        "the transaction's outcome is unknown (it is committed or rolled back within seconds): {0}"
    )]
    OutcomeUnknown(String),
    #[error("{0}")]
    Storage(#[from] StorageError),
    #[error("replication: {0}")]
    Raft(#[from] RaftError),
    #[error("catalog corrupted: {0}")]
    CatalogCorrupted(String),
    /// A tablet server's start could not open one of its replicas.
    #[error("cannot open the replica of tablet {tablet} in {dir}: {source}")]
    OpenReplica {
        tablet: String,
        dir: String,
        source: Box<EngineError>,
    },
    /// Another server (in this process or another) has the directory open.
    #[error("{0} is in use by another Nyala server; stop it first, or give this one another data directory")]
    DirectoryInUse(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
}
