//! Tablet copy, both ends: the leader of a tablet opens a copy session that holds the files of
//! a consistent copy open ([`CopySessions`]); a new replica's server fetches them chunk by
//! chunk into a staging directory and installs the replica from it, as a learner
//! ([`receive_copy`]). Kudu's tablet copy, with files read at a log position the new replica's
//! log starts after.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::replica::{CopyPosition, Peers};
use super::scanners::SCANNER_IDLE;
use super::TabletServer;
use crate::rpc;
use crate::rpc::proto::common::TabletRef;
use crate::rpc::proto::tserver::{CopyTabletRequest, FetchChunkRequest, TabletFile, TabletFiles};
use crate::{EngineError, Result};

/// Bytes per FetchChunk answer.
const COPY_CHUNK_BYTES: u64 = 8 << 20;

/// The files of one tablet copy, held open, and when they were last read.
type CopySession = (Arc<Vec<std::fs::File>>, Instant);

/// Open tablet copies of a server, by session id.
#[derive(Default)]
pub struct CopySessions {
    open: Mutex<HashMap<u64, CopySession>>,
    next_id: AtomicU64,
}

impl CopySessions {
    /// Opens a copy of this server's replica of `tablet_id`, which must lead its tablet.
    /// Blocking: it flushes and reads the tablet's metadata.
    pub fn open(&self, server: &TabletServer, tablet_id: &str) -> Result<TabletFiles> {
        let replica = server.replica(tablet_id)?;
        if replica.leader() != Some(server.server_id()) {
            return Err(EngineError::Raft(nyala_raft::RaftError::NotLeader {
                leader_hint: replica.leader(),
            }));
        }
        let copy = replica.copy()?;
        let files = copy
            .files
            .iter()
            .map(|(name, _, size)| TabletFile {
                name: name.clone(),
                size: *size,
            })
            .collect();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        {
            let mut open = self.open.lock();
            open.retain(|_, (_, used)| used.elapsed() < SCANNER_IDLE);
            let handles = copy.files.into_iter().map(|f| f.1).collect();
            open.insert(id, (Arc::new(handles), Instant::now()));
        }
        let at = copy.position;
        Ok(TabletFiles {
            session: id,
            index: at.index,
            term: at.term,
            voters: at.voters,
            learners: at.learners,
            files,
        })
    }

    /// Up to [`COPY_CHUNK_BYTES`] of file `file` of session `id` from `offset`. Blocking.
    pub fn chunk(&self, id: u64, file: u32, offset: u64) -> Result<Vec<u8>> {
        let files = {
            let mut open = self.open.lock();
            let (files, used) = open.get_mut(&id).ok_or_else(|| {
                EngineError::Unsupported(format!("tablet copy {id} does not exist (expired?)"))
            })?;
            *used = Instant::now();
            files.clone()
        };
        let file = files
            .get(file as usize)
            .ok_or_else(|| EngineError::Unsupported(format!("no file {file} in copy {id}")))?;
        let len = file.metadata()?.len();
        let n = COPY_CHUNK_BYTES.min(len.saturating_sub(offset)) as usize;
        let mut buf = vec![0; n];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, offset)?;
        Ok(buf)
    }
}

/// Creates `server`'s replica of `copy.tablet_id` from its leader `copy.source`: the files,
/// fetched chunk by chunk into a staging directory, then the replica, as a learner. A failed
/// copy leaves no staging directory behind.
pub async fn receive_copy(server: &Arc<TabletServer>, copy: &CopyTabletRequest) -> Result<()> {
    let staging = server.staging_dir(&copy.tablet_id);
    let received = fetch_files(server, copy).await;
    let installed = match received {
        Ok(position) => {
            let peers = Peers {
                voters: position.voters.clone(),
                addresses: copy
                    .peers
                    .iter()
                    .map(|p| (p.server_id, p.address.clone()))
                    .collect(),
            };
            let (server, id) = (server.clone(), copy.tablet_id.clone());
            rpc::blocking(move || server.install_replica(&id, position, peers)).await
        }
        Err(e) => Err(e),
    };
    if installed.is_err() {
        let _ = tokio::fs::remove_dir_all(&staging).await;
    }
    installed
}

/// Fetches the files of a copy of `copy.tablet_id` into the staging directory; where the new
/// replica's log starts.
async fn fetch_files(server: &TabletServer, copy: &CopyTabletRequest) -> Result<CopyPosition> {
    let mut source = rpc::tserver(rpc::connect(&copy.source).await?);
    let files = source
        .fetch_tablet(TabletRef {
            tablet_id: copy.tablet_id.clone(),
        })
        .await
        .map_err(rpc::from_status)?
        .into_inner();
    let staging = server.staging_dir(&copy.tablet_id);
    if tokio::fs::try_exists(&staging).await? {
        tokio::fs::remove_dir_all(&staging).await?;
    }
    tokio::fs::create_dir_all(&staging).await?;
    for (i, file) in files.files.iter().enumerate() {
        if file.name.contains('/') || file.name.starts_with('.') {
            return Err(EngineError::Remote(format!("bad file name {}", file.name)));
        }
        let mut out = tokio::fs::File::create(staging.join(&file.name)).await?;
        let mut offset = 0;
        while offset < file.size {
            let chunk = source
                .fetch_chunk(FetchChunkRequest {
                    session: files.session,
                    file: i as u32,
                    offset,
                })
                .await
                .map_err(rpc::from_status)?
                .into_inner()
                .chunk;
            if chunk.is_empty() {
                return Err(EngineError::Remote(format!(
                    "copying {}: the source sent nothing at offset {offset} of {}",
                    file.name, file.size
                )));
            }
            tokio::io::AsyncWriteExt::write_all(&mut out, &chunk).await?;
            offset += chunk.len() as u64;
        }
        out.sync_all().await?;
    }
    Ok(CopyPosition {
        index: files.index,
        term: files.term,
        voters: files.voters,
        learners: files.learners,
    })
}
