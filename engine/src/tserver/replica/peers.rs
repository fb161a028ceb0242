//! Who a replicated tablet's replicas are, kept beside the replica: `peers.json` holds the
//! voters (tablet server ids, which are also their Raft node ids) and where each server listens.
//! It is written whole (to a temporary file, synced, renamed), so a crash leaves the old list or
//! the new one. A replica without it is a single voter (the embedded node's tablets).

use std::path::Path;
use std::sync::Arc;

use crate::{EngineError, Result};

/// The replicas of a replicated tablet: the voters (tablet server ids, which are also their Raft
/// node ids) and where each server listens. Kept in `peers.json` in the replica's directory; a
/// replica without it is a single-voter tablet of the embedded node.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Peers {
    pub voters: Vec<u64>,
    pub addresses: std::collections::BTreeMap<u64, String>,
}

const PEERS_FILE: &str = "peers.json";

impl Peers {
    pub(super) fn read(dir: &Path) -> Result<Option<Peers>> {
        match std::fs::read(dir.join(PEERS_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                EngineError::CatalogCorrupted(format!("{}: {e}", dir.join(PEERS_FILE).display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn write(&self, dir: &Path) -> Result<()> {
        let json =
            serde_json::to_vec(self).map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
        let tmp = dir.join("peers.json.tmp");
        std::fs::write(&tmp, json)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, dir.join(PEERS_FILE))?;
        Ok(())
    }
}

/// How a replica reaches the other replicas of its tablet.
pub struct Replication {
    /// This server's id (its Raft node id in every group).
    pub server_id: u64,
    pub peers: Peers,
    pub transport: Box<dyn nyala_raft::Transport>,
    /// Tells the server where a newly added member listens.
    pub learn: Option<Arc<dyn Fn(u64, String) + Send + Sync>>,
    /// Whether followers serve reads (the masters' catalog): then they hear of every commit
    /// at once, not at the next append or heartbeat (see `RaftConfig::lazy_commit_broadcast`).
    pub followers_serve_reads: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_round_trip_through_their_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Peers::read(dir.path()).unwrap().is_none());
        let peers = Peers {
            voters: vec![3, 1, 2],
            addresses: [(1, "a:1".to_string()), (2, "b:2".to_string())].into(),
        };
        peers.write(dir.path()).unwrap();
        let read = Peers::read(dir.path()).unwrap().unwrap();
        assert_eq!(read.voters, peers.voters);
        assert_eq!(read.addresses, peers.addresses);
        // Written whole: no temporary file stays.
        assert!(!dir.path().join("peers.json.tmp").exists());
    }

    #[test]
    fn a_damaged_peers_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PEERS_FILE), b"{\"voters\": [1,").unwrap();
        assert!(matches!(
            Peers::read(dir.path()),
            Err(EngineError::CatalogCorrupted(_))
        ));
    }
}
