//! The database: one engine client (catalog and tablets, embedded or a cluster's) shared by
//! every SQL session opened on it.
//!
//! Sessions hold their own DataFusion state (settings, prepared plans) but see one catalog, so a
//! table one session creates is visible to all; this is where that sharing is set up and where
//! each session gets Nyala's tables, system tables and planners registered into DataFusion.

use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use nyala_engine::tserver::TabletServer;
use nyala_engine::Client;
use nyala_storage::TabletOptions;

use crate::catalog::schema as catalog;
use crate::exec::runtime_filter;
use crate::functions::as_of;
use crate::functions::bounded as functions;
use crate::functions::tail;
use crate::limits::{Limits, QueryLimits, YieldingLeaves};
use crate::plan::dml;
use crate::session::access::Principal;
use crate::session::settings::NyalaOptions;
use crate::session::transaction::TxnSlot;
use crate::session::Session;
use crate::{Result, SqlError, CATALOG_NAME, SCHEMA_NAME};

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
        }))
    }

    /// The database of `client` (a master's, whose catalog is in process and whose tablets
    /// are on the cluster's tablet servers).
    pub fn with_client(client: Client, limits: QueryLimits) -> Arc<Database> {
        Arc::new(Database {
            client,
            limits: Limits::new(limits),
            tablet_server: None,
        })
    }

    /// A coordinator of the cluster whose masters listen at `masters` (a tablet server serving
    /// Flight SQL): catalog from the masters, DDL through the leading one.
    pub async fn connect_cluster(
        masters: Vec<String>,
        limits: QueryLimits,
    ) -> Result<Arc<Database>> {
        let client = Client::connect_cluster(masters).await?;
        Ok(Self::with_client(client, limits))
    }

    /// A new SQL session over this database.
    pub fn session(self: &Arc<Self>) -> Session {
        let txn = Arc::new(TxnSlot::default());
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(true)
            // Tablets are the unit of scan parallelism: a scan-only plan keeps one partition per
            // tablet, so Flight SQL can hand each tablet to a separate reader.
            .with_round_robin_repartition(false)
            .with_option_extension(NyalaOptions::default())
            .with_extension(txn.clone());
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(runtime_filter::RuntimeFilterRule::default()))
            .with_physical_optimizer_rule(Arc::new(YieldingLeaves))
            .with_query_planner(Arc::new(dml::NyalaQueryPlanner))
            .build();
        let ctx = SessionContext::new_with_state(state);
        functions::bound_growing_functions(&ctx);
        let principal = Arc::new(Principal::default());
        let catalog = MemoryCatalogProvider::new();
        // Registering a schema into a fresh in-memory catalog cannot fail.
        let _ = catalog.register_schema(
            SCHEMA_NAME,
            Arc::new(catalog::NyalaSchemaProvider::new(
                self.client.clone(),
                ctx.state_weak_ref(),
                principal.clone(),
            )),
        );
        let _ = catalog.register_schema(
            catalog::SysSchemaProvider::NAME,
            Arc::new(catalog::SysSchemaProvider::new(
                self.client.clone(),
                principal.clone(),
            )),
        );
        ctx.register_catalog(CATALOG_NAME, Arc::new(catalog));
        ctx.register_udtf(
            tail::FUNCTION,
            Arc::new(tail::TailFunction {
                client: self.client.clone(),
            }),
        );
        ctx.register_udtf(
            as_of::FUNCTION,
            Arc::new(as_of::AsOfFunction {
                client: self.client.clone(),
            }),
        );
        Session {
            db: self.clone(),
            ctx,
            principal,
            txn,
        }
    }

    /// Names and Arrow schemas of all user tables, sorted by name.
    pub fn tables(&self) -> Vec<(String, SchemaRef)> {
        self.client
            .tables()
            .iter()
            .map(|t| (t.name.clone(), t.schema.arrow_schema()))
            .collect()
    }

    /// Names and result schemas of all views, sorted by name. A view whose query no longer
    /// plans (a table it reads was dropped) has no columns.
    pub async fn views(self: &Arc<Self>) -> Vec<(String, SchemaRef)> {
        let state = self.session().ctx.state();
        let mut views = Vec::new();
        for view in self.client.views() {
            let schema = match catalog::view_plan(&state, &view.sql).await {
                Ok(plan) => {
                    crate::results::client_schema(&Arc::new(plan.schema().as_arrow().clone()))
                }
                Err(_) => Arc::new(arrow::datatypes::Schema::empty()),
            };
            views.push((view.name.clone(), schema));
        }
        views
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
