//! The database: one engine client (catalog and tablets, embedded or a cluster's) shared by
//! every SQL session opened on it.
//!
//! Sessions hold their own DataFusion state (settings, prepared plans) but see one catalog, so a
//! table one session creates is visible to all. A session is opened with [`Database::session`]
//! (in `session/open.rs`, beside what it registers into DataFusion).
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use nyala_engine::tserver::TabletServer;
use nyala_engine::Client;
use nyala_storage::TabletOptions;

use crate::distributed::workers::ClusterChannels;
use crate::limits::{Limits, QueryLimits};
use crate::{Result, SqlError};

/// Options for opening an embedded database.
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// MemRowSet size in bytes at which a tablet flushes to a DiskRowSet (None: storage default).
    pub flush_threshold_bytes: Option<usize>,
    /// Unflushed data all tablets together may hold before writers wait (None: 2 GiB).
    pub memory_limit_bytes: Option<usize>,
    /// How far back `AS OF` reads may go (None: storage default, 15 minutes).
    pub history_max_age: Option<std::time::Duration>,
    /// What one statement may use.
    pub limits: QueryLimits,
}

/// An open Nyala database: catalog, tablets and the SQL engine over them.
pub struct Database {
    pub(crate) client: Client,
    pub(crate) limits: Limits,
    /// The tablet server of an embedded database (None: the tablets are a cluster's).
    tablet_server: Option<Arc<TabletServer>>,
    /// Connections to the cluster's workers, which every session shares.
    pub(crate) channels: ClusterChannels,
    /// A session state with Nyala's functions, for workers' sessions.
    functions: std::sync::OnceLock<datafusion::execution::SessionState>,
}

impl Database {
    /// Opens (creating if needed) the database stored in `data_dir`, replaying logs as needed.
    pub async fn open(data_dir: &Path, options: DatabaseOptions) -> Result<Arc<Database>> {
        let mut tablet_options = TabletOptions::default();
        if let Some(bytes) = options.flush_threshold_bytes {
            tablet_options.flush_threshold_bytes = bytes;
        }
        if let Some(age) = options.history_max_age {
            tablet_options.history_max_age = age;
        }
        let dir = data_dir.to_path_buf();
        let memory_limit = options
            .memory_limit_bytes
            .unwrap_or(nyala_engine::tserver::DEFAULT_MEMORY_LIMIT);
        let node = tokio::task::spawn_blocking(move || {
            nyala_engine::embedded::open(&dir, tablet_options, memory_limit)
        })
        .await
        .map_err(|e| SqlError::Invalid(format!("opening the database failed: {e}")))??;
        Ok(Arc::new(Database {
            client: node.client,
            limits: Limits::new(options.limits),
            tablet_server: Some(node.server),
            channels: ClusterChannels::default(),
            functions: Default::default(),
        }))
    }

    /// The database of `client` (a master's, whose catalog is in process and whose tablets
    /// are on the cluster's tablet servers).
    pub fn with_client(client: Client, limits: QueryLimits) -> Arc<Database> {
        Arc::new(Database {
            client,
            limits: Limits::new(limits),
            tablet_server: None,
            channels: ClusterChannels::default(),
            functions: Default::default(),
        })
    }

    /// A coordinator of the cluster whose masters listen at `masters`, in the process of the
    /// tablet server `local` (whose tablets it scans in process): catalog from the masters,
    /// DDL through the leading one.
    pub async fn connect_cluster(
        masters: Vec<String>,
        local: Option<Arc<TabletServer>>,
        limits: QueryLimits,
    ) -> Result<Arc<Database>> {
        let client = Client::connect_cluster_at(masters, local).await?;
        Ok(Self::with_client(client, limits))
    }

    /// Whether the database is a cluster's (not an embedded node's).
    pub fn is_cluster(&self) -> bool {
        self.tablet_server.is_none()
    }

    /// A session state holding Nyala's functions (what workers' sessions register).
    pub(crate) fn functions(self: &Arc<Self>) -> &datafusion::execution::SessionState {
        self.functions.get_or_init(|| self.session().ctx.state())
    }

    /// Names and Arrow schemas of all user tables, sorted by name.
    pub fn tables(&self) -> Vec<(String, SchemaRef)> {
        self.client
            .tables()
            .iter()
            .map(|t| (t.name.clone(), t.schema.arrow_schema()))
            .collect()
    }

    /// Primary-key column names of `table`, in key order.
    pub fn primary_key(&self, table: &str) -> Option<Vec<String>> {
        let table = self.client.table(table).ok()?;
        Some(
            table
                .schema
                .key_columns()
                .iter()
                .map(|&i| table.schema.columns()[i].name.clone())
                .collect(),
        )
    }

    /// The tablet server of an embedded database, which holds its tablets.
    pub fn tablet_server(&self) -> Option<&Arc<TabletServer>> {
        self.tablet_server.as_ref()
    }

    /// The engine client under the SQL layer.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Waits until the tablets of the commits answered at their decision are told, then
    /// flushes and stops every tablet; the database must not be used afterwards.
    pub async fn shutdown(&self) -> Result<()> {
        self.client.wait_for_commits().await;
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || client.shutdown())
            .await
            .map_err(|e| SqlError::Invalid(format!("shutdown failed: {e}")))??;
        Ok(())
    }
}
