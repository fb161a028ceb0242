//! The master: the catalog of tables and where their tablets live.
//!
//! As in Kudu, the catalog is itself a tablet (`sys.catalog`) written through its own Raft log:
//! one row per table, keyed by table id, holding the table's definition as JSON (and one per
//! view, keyed `view:<name>`, holding its query). On start the
//! master scans it back into memory. DDL is serialised by one lock; creating a table makes its
//! tablets first and then commits the catalog row, so a crash in between leaves only orphan
//! tablets, which the next start deletes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray};
use nyala_storage::{
    ColumnSchema, ColumnType, ScanSpec, Schema, TabletOptions, Timestamp, WriteBatch, WriteKind,
};
use parking_lot::RwLock;

use crate::catalog::{
    Access, Catalog, ColumnChange, DdlOp, Privilege, TableInfo, UserInfo, ViewInfo,
};
use crate::clock::HybridClock;
use crate::consensus::RaftGroups;
use crate::partition::{PartitionSchema, RangeSpec};
use crate::tserver::replica::{Replication, TabletReplica};
use crate::{EngineError, Result};

pub mod admin;
pub mod ksck;
pub mod metrics;
mod node;
pub mod placement;
pub mod registry;
mod repair;
pub mod service;

pub use node::MasterNode;
pub use placement::{ClusterPlacement, TabletPlacement};
pub use registry::{ServerSummary, TServerRegistry};

/// The master of a database: the catalog, and the lifecycle of every table's tablets.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use nyala_engine::{DdlOp, PartitionSchema};
/// # use nyala_engine::clock::HybridClock;
/// # use nyala_engine::master::{Master, TabletPlacement};
/// # use nyala_engine::storage::Schema;
/// # async fn sketch(dir: &std::path::Path, placement: Arc<dyn TabletPlacement>, schema: Schema)
/// # -> nyala_engine::Result<()> {
/// let master = Master::open(dir, Arc::new(HybridClock::new()), placement, None)?;
/// master.ddl(DdlOp::CreateTable { name: "events".into(), schema, partition: PartitionSchema::single(),
///     if_not_exists: false, replicas: 0, owner: None }).await?;
/// let table = master.table("events");
/// # Ok(()) }
/// ```
pub struct Master {
    catalog: Arc<TabletReplica>,
    /// The catalog entry `tables` reflects; a replicated catalog whose followers applied more
    /// is loaded again.
    loaded: std::sync::atomic::AtomicU64,
    /// Where the masters of a replicated catalog listen, by Raft node id.
    masters: BTreeMap<u64, String>,
    placement: Arc<dyn TabletPlacement>,
    tables: RwLock<BTreeMap<String, Arc<TableInfo>>>,
    views: RwLock<BTreeMap<String, Arc<ViewInfo>>>,
    users: RwLock<BTreeMap<String, Arc<UserInfo>>>,
    ddl: tokio::sync::Mutex<()>,
    /// Held while a replica moves (re-replication, rebalancing): one move at a time.
    moves: tokio::sync::Mutex<()>,
    /// Held until the master shuts down (or is dropped).
    lock: parking_lot::Mutex<Option<crate::dir_lock::DirLock>>,
}

/// The tablet id of the catalog.
pub const CATALOG_TABLET: &str = "sys.catalog";

/// The ids of the catalog rows of views begin with this (table ids are UUIDs).
const VIEW_ID_PREFIX: &str = "view:";
/// The ids of the catalog rows of users begin with this.
const USER_ID_PREFIX: &str = "user:";

fn catalog_schema() -> Result<Schema> {
    let column = |name: &str| ColumnSchema::new(name, ColumnType::String, false);
    Ok(Schema::new(
        vec![column("id"), column("name"), column("info")],
        vec![0],
    )?)
}

impl Master {
    /// Opens the catalog in `dir` (creating it on first start), loads every table, and reconciles
    /// the local tablet server with it. With `replication`, the catalog is replicated by Raft
    /// among the masters: DDL runs on the master that leads it, and the others follow.
    pub fn open(
        dir: &Path,
        clock: Arc<HybridClock>,
        placement: Arc<dyn TabletPlacement>,
        replication: Option<Replication>,
    ) -> Result<Self> {
        let lock = crate::dir_lock::DirLock::acquire(dir)?;
        let catalog_dir = dir.join("catalog");
        let masters = replication
            .as_ref()
            .map(|r| r.peers.addresses.clone())
            .unwrap_or_default();
        // The catalog replica's directory appears whole (see `TabletReplica::create`).
        let catalog = if catalog_dir.exists() {
            TabletReplica::open(
                &catalog_dir,
                CATALOG_TABLET,
                TabletOptions::default(),
                clock,
                replication,
                None,
            )?
        } else {
            TabletReplica::create(
                &catalog_dir,
                CATALOG_TABLET,
                catalog_schema()?,
                TabletOptions::default(),
                clock,
                replication,
                None,
            )?
        };
        let master = Self {
            catalog: Arc::new(catalog),
            loaded: Default::default(),
            masters,
            placement,
            tables: RwLock::new(BTreeMap::new()),
            views: RwLock::new(BTreeMap::new()),
            users: RwLock::new(BTreeMap::new()),
            ddl: tokio::sync::Mutex::new(()),
            moves: tokio::sync::Mutex::new(()),
            lock: parking_lot::Mutex::new(Some(lock)),
        };
        master.load()?;
        master.reconcile_tablets()?;
        Ok(master)
    }

    /// The catalog's replica (for the Raft messages of a replicated catalog).
    pub fn catalog(&self) -> &Arc<TabletReplica> {
        &self.catalog
    }

    /// Loads the catalog again if its replica applied entries since the last load (a follower
    /// of a replicated catalog learns DDL this way).
    fn refresh(&self) {
        let applied = self.catalog.last_applied();
        if applied > self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            if let Err(e) = self.load() {
                tracing::error!(error = %e, "cannot reload the catalog");
            }
        }
    }

    fn load(&self) -> Result<()> {
        let applied = self.catalog.last_applied();
        let spec = ScanSpec {
            projection: Some(vec![0, 2]),
            predicates: vec![],
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1024,
            string_views: false,
            changes_since: None,
        };
        let strings = |batch: &RecordBatch, c: usize| {
            let column = batch.column(c).as_any().downcast_ref::<StringArray>();
            column.cloned().ok_or_else(|| {
                EngineError::CatalogCorrupted("catalog column is not a string".into())
            })
        };
        let corrupted = |e: serde_json::Error| EngineError::CatalogCorrupted(e.to_string());
        let mut tables = BTreeMap::new();
        let mut views = BTreeMap::new();
        let mut users = BTreeMap::new();
        for batch in self.catalog.scan(spec, None)? {
            let batch = batch?;
            let (ids, infos) = (strings(&batch, 0)?, strings(&batch, 1)?);
            for (id, info) in ids.iter().zip(infos.iter()) {
                let (Some(id), Some(info)) = (id, info) else {
                    continue;
                };
                if id.starts_with(VIEW_ID_PREFIX) {
                    let view: ViewInfo = serde_json::from_str(info).map_err(corrupted)?;
                    views.insert(view.name.clone(), Arc::new(view));
                } else if id.starts_with(USER_ID_PREFIX) {
                    let user: UserInfo = serde_json::from_str(info).map_err(corrupted)?;
                    users.insert(user.name.clone(), Arc::new(user));
                } else {
                    let info: TableInfo = serde_json::from_str(info).map_err(corrupted)?;
                    tables.insert(info.name.clone(), Arc::new(info));
                }
            }
        }
        *self.tables.write() = tables;
        *self.views.write() = views;
        *self.users.write() = users;
        self.loaded
            .store(applied, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Has the tablets match the catalog after a crash (see [`TabletPlacement::reconcile`]).
    fn reconcile_tablets(&self) -> Result<()> {
        let tables: Vec<Arc<TableInfo>> = self.tables.read().values().cloned().collect();
        self.placement.reconcile(&tables)
    }

    pub fn table(&self, name: &str) -> Option<Arc<TableInfo>> {
        self.refresh();
        self.tables.read().get(name).cloned()
    }

    /// All tables, sorted by name.
    pub fn tables(&self) -> Vec<Arc<TableInfo>> {
        self.refresh();
        self.tables.read().values().cloned().collect()
    }

    /// All views, sorted by name.
    pub fn views(&self) -> Vec<Arc<ViewInfo>> {
        self.refresh();
        self.views.read().values().cloned().collect()
    }

    fn view(&self, name: &str) -> Option<Arc<ViewInfo>> {
        self.refresh();
        self.views.read().get(name).cloned()
    }

    /// All users, sorted by name.
    pub fn users(&self) -> Vec<Arc<UserInfo>> {
        self.refresh();
        self.users.read().values().cloned().collect()
    }

    fn user(&self, name: &str) -> Option<Arc<UserInfo>> {
        self.refresh();
        self.users.read().get(name).cloned()
    }

    async fn create_user(&self, user: UserInfo, if_not_exists: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        if self.user(&user.name).is_some() {
            return match if_not_exists {
                true => Ok(false),
                false => Err(EngineError::Unsupported(format!(
                    "user {} exists already",
                    user.name
                ))),
            };
        }
        self.write_user(WriteKind::Upsert, &user).await?;
        self.users.write().insert(user.name.clone(), Arc::new(user));
        Ok(true)
    }

    async fn alter_user(
        &self,
        name: &str,
        password_hash: String,
        scram: Option<crate::catalog::ScramVerifier>,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let user = self.existing_user(name)?;
        let altered = UserInfo {
            password_hash,
            scram,
            ..(*user).clone()
        };
        self.write_user(WriteKind::Upsert, &altered).await?;
        self.users
            .write()
            .insert(name.to_string(), Arc::new(altered));
        Ok(true)
    }

    /// Drops a user after taking back what was granted to it; refused while it owns tables or
    /// views (they would be left without an owner).
    async fn drop_user(&self, name: &str, if_exists: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(user) = self.user(name) else {
            return match if_exists {
                true => Ok(false),
                false => Err(EngineError::Unsupported(format!("no user {name}"))),
            };
        };
        if user.admin {
            return Err(EngineError::Unsupported(
                "the administrator cannot be dropped".into(),
            ));
        }
        let owner = Some(name);
        let owned: Vec<String> = (self
            .tables()
            .iter()
            .filter(|t| t.access.owner.as_deref() == owner))
        .map(|t| t.name.clone())
        .chain(
            (self
                .views()
                .iter()
                .filter(|v| v.access.owner.as_deref() == owner))
            .map(|v| v.name.clone()),
        )
        .collect();
        if !owned.is_empty() {
            return Err(EngineError::Unsupported(format!(
                "user {name} owns {}: drop them first",
                owned.join(", ")
            )));
        }
        for table in self.tables() {
            if table.access.grants.contains_key(name) {
                self.change_table_access(&table, name, &Privilege::ALL, false)
                    .await?;
            }
        }
        for view in self.views() {
            if view.access.grants.contains_key(name) {
                self.change_view_access(&view, name, &Privilege::ALL, false)
                    .await?;
            }
        }
        self.write_user(WriteKind::Delete, &user).await?;
        self.users.write().remove(name);
        Ok(true)
    }

    fn existing_user(&self, name: &str) -> Result<Arc<UserInfo>> {
        self.user(name)
            .ok_or_else(|| EngineError::Unsupported(format!("no user {name}")))
    }

    /// `GRANT` (`grant`) or `REVOKE` privileges on a table or view.
    async fn change_privileges(
        &self,
        object: &str,
        user: &str,
        privileges: &[Privilege],
        grant: bool,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        self.existing_user(user)?;
        if let Some(table) = self.table(object) {
            return self
                .change_table_access(&table, user, privileges, grant)
                .await;
        }
        let view = self
            .view(object)
            .ok_or_else(|| EngineError::TableNotFound(object.into()))?;
        if let Some(privilege) = privileges.iter().find(|p| **p != Privilege::Select) {
            return Err(EngineError::Unsupported(format!(
                "{object} is a view: only SELECT can be granted on it, not {privilege}"
            )));
        }
        self.change_view_access(&view, user, privileges, grant)
            .await
    }

    async fn change_table_access(
        &self,
        table: &TableInfo,
        user: &str,
        privileges: &[Privilege],
        grant: bool,
    ) -> Result<bool> {
        let mut changed = table.clone();
        changed.access.change(user, privileges, grant);
        if changed.access == table.access {
            return Ok(false);
        }
        self.write_catalog(WriteKind::Upsert, &changed).await?;
        self.tables
            .write()
            .insert(changed.name.clone(), Arc::new(changed));
        Ok(true)
    }

    async fn change_view_access(
        &self,
        view: &ViewInfo,
        user: &str,
        privileges: &[Privilege],
        grant: bool,
    ) -> Result<bool> {
        let mut changed = view.clone();
        changed.access.change(user, privileges, grant);
        if changed.access == view.access {
            return Ok(false);
        }
        self.write_view(WriteKind::Upsert, &changed).await?;
        self.views
            .write()
            .insert(changed.name.clone(), Arc::new(changed));
        Ok(true)
    }

    /// Writes `user`'s catalog row (id `user:<name>`).
    async fn write_user(&self, kind: WriteKind, user: &UserInfo) -> Result<()> {
        let json = serde_json::to_string(user)
            .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
        let id = format!("{USER_ID_PREFIX}{}", user.name);
        self.write_catalog_row(kind, &id, &user.name, json).await
    }

    /// An error if a table or view is called `name` already.
    fn name_is_free(&self, name: &str) -> Result<()> {
        match (self.table(name), self.view(name)) {
            (None, None) => Ok(()),
            (Some(_), _) => Err(EngineError::TableExists(name.into())),
            (_, Some(_)) => Err(EngineError::TableExists(format!("{name} (a view)"))),
        }
    }

    /// Creates a view, or replaces the one called so with `or_replace`.
    async fn create_view(&self, view: ViewInfo, or_replace: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        if self.table(&view.name).is_some() {
            return Err(EngineError::TableExists(view.name));
        }
        if self.view(&view.name).is_some() && !or_replace {
            return Err(EngineError::TableExists(format!(
                "{} (a view; CREATE OR REPLACE VIEW replaces it)",
                view.name
            )));
        }
        // A replaced view keeps its owner and grants.
        let view = match self.view(&view.name) {
            Some(old) => ViewInfo {
                access: old.access.clone(),
                ..view
            },
            None => view,
        };
        self.write_view(WriteKind::Upsert, &view).await?;
        self.views.write().insert(view.name.clone(), Arc::new(view));
        Ok(true)
    }

    async fn drop_view(&self, name: &str, if_exists: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(view) = self.view(name) else {
            return match if_exists {
                true => Ok(false),
                false => Err(EngineError::TableNotFound(format!("view {name}"))),
            };
        };
        self.write_view(WriteKind::Delete, &view).await?;
        self.views.write().remove(name);
        Ok(true)
    }

    /// Writes `view`'s catalog row (id `view:<name>`).
    async fn write_view(&self, kind: WriteKind, view: &ViewInfo) -> Result<()> {
        let json = serde_json::to_string(view)
            .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
        let id = format!("{VIEW_ID_PREFIX}{}", view.name);
        self.write_catalog_row(kind, &id, &view.name, json).await
    }

    /// Creates a table and its tablets. Returns `Ok(false)` if it exists and `if_not_exists`.
    /// `replicas`: replicas of each tablet (0: the default).
    pub async fn create_table(
        &self,
        name: &str,
        schema: Schema,
        partition: PartitionSchema,
        if_not_exists: bool,
        replicas: usize,
        owner: Option<String>,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        if self.table(name).is_some() {
            return if if_not_exists {
                Ok(false)
            } else {
                Err(EngineError::TableExists(name.into()))
            };
        }
        self.name_is_free(name)?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let info = TableInfo {
            tablets: (0..partition.num_tablets())
                .map(|t| format!("{id}-{t}"))
                .collect(),
            id,
            name: name.to_string(),
            schema,
            partition,
            replicas,
            placement: BTreeMap::new(),
            access: Access::owned_by(owner),
        };
        self.create_tablets_and_commit(&info.tablets, info.clone(), None)
            .await?;
        Ok(true)
    }

    /// Creates table `name` as a clone of table `source` (see [`DdlOp::CloneTable`]): each of
    /// its tablets is a clone of the source's tablet in the same place. Returns `Ok(false)` if
    /// it exists and `if_not_exists`.
    pub async fn clone_table(
        &self,
        name: &str,
        source: &str,
        as_of: Option<Timestamp>,
        if_not_exists: bool,
        owner: Option<String>,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        if self.table(name).is_some() && if_not_exists {
            return Ok(false);
        }
        self.name_is_free(name)?;
        let source = self.existing(source)?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let info = TableInfo {
            tablets: (0..source.tablets.len())
                .map(|t| format!("{id}-{t}"))
                .collect(),
            id,
            name: name.to_string(),
            placement: BTreeMap::new(),
            access: Access::owned_by(owner),
            ..(*source).clone()
        };
        let clones = Some((source.tablets.as_slice(), as_of));
        self.create_tablets_and_commit(&info.tablets, info.clone(), clones)
            .await?;
        Ok(true)
    }

    /// Creates `tablets` (with the table's schema, or as clones of the tablets `clones` names
    /// at its time, one for one), then commits `info` to the catalog; if either fails, the new
    /// tablets are deleted and nothing changes.
    async fn create_tablets_and_commit(
        &self,
        tablets: &[String],
        mut info: TableInfo,
        clones: Option<(&[String], Option<Timestamp>)>,
    ) -> Result<()> {
        let mut created = Ok(());
        for (i, t) in tablets.iter().enumerate() {
            let placed = match clones {
                None => {
                    (self.placement)
                        .create_tablet(t, &info.schema, info.replicas)
                        .await
                }
                Some((sources, as_of)) => self.placement.clone_tablet(t, &sources[i], as_of).await,
            };
            match placed {
                Ok(servers) if servers.is_empty() => {}
                Ok(servers) => {
                    info.placement.insert(t.clone(), servers);
                }
                Err(e) => {
                    created = Err(e);
                    break;
                }
            }
        }
        let committed = match created {
            Ok(()) => self.write_catalog(WriteKind::Upsert, &info).await,
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            for tablet in tablets {
                let _ = self.delete_tablet(&info, tablet).await;
            }
            return Err(e);
        }
        self.tables
            .write()
            .insert(info.name.clone(), Arc::new(info));
        Ok(())
    }

    /// Deletes tablet `id` of table `info` wherever its replicas are.
    async fn delete_tablet(&self, info: &TableInfo, id: &str) -> Result<()> {
        let servers = info.placement.get(id).cloned().unwrap_or_default();
        self.placement.delete_tablet(id, &servers).await
    }

    /// The table called `name`, or a TableNotFound error.
    fn existing(&self, name: &str) -> Result<Arc<TableInfo>> {
        self.table(name)
            .ok_or_else(|| EngineError::TableNotFound(name.into()))
    }

    /// Runs one DDL statement; whether it did something (a CREATE or DROP with IF [NOT]
    /// EXISTS may not).
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        match op {
            DdlOp::CreateTable {
                name,
                schema,
                partition,
                if_not_exists,
                replicas,
                owner,
            } => {
                self.create_table(&name, schema, partition, if_not_exists, replicas, owner)
                    .await
            }
            DdlOp::CloneTable {
                name,
                source,
                as_of,
                if_not_exists,
                owner,
            } => {
                self.clone_table(&name, &source, as_of, if_not_exists, owner)
                    .await
            }
            DdlOp::DropTable { name, if_exists } => self.drop_table(&name, if_exists).await,
            DdlOp::RenameTable { name, new_name } => {
                self.rename_table(&name, &new_name).await.map(|()| true)
            }
            DdlOp::AlterColumns { name, changes } => {
                self.alter_columns(&name, &changes).await.map(|()| true)
            }
            DdlOp::SetHistoryMaxAge { name, secs } => {
                self.set_history_max_age(&name, secs).await.map(|()| true)
            }
            DdlOp::AddRangePartition { name, range } => {
                self.add_range_partition(&name, &range).await.map(|()| true)
            }
            DdlOp::DropRangePartition { name, range } => self
                .drop_range_partition(&name, &range)
                .await
                .map(|()| true),
            DdlOp::CreateView { view, or_replace } => self.create_view(view, or_replace).await,
            DdlOp::DropView { name, if_exists } => self.drop_view(&name, if_exists).await,
            DdlOp::CreateUser {
                user,
                if_not_exists,
            } => self.create_user(user, if_not_exists).await,
            DdlOp::AlterUser {
                name,
                password_hash,
                scram,
            } => self.alter_user(&name, password_hash, scram).await,
            DdlOp::DropUser { name, if_exists } => self.drop_user(&name, if_exists).await,
            DdlOp::Privileges {
                object,
                user,
                privileges,
                grant,
            } => {
                self.change_privileges(&object, &user, &privileges, grant)
                    .await
            }
        }
    }

    /// Drops a table and deletes its tablets. Returns `Ok(false)` if it is absent and `if_exists`.
    pub async fn drop_table(&self, name: &str, if_exists: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(info) = self.table(name) else {
            return if if_exists {
                Ok(false)
            } else {
                Err(EngineError::TableNotFound(name.into()))
            };
        };
        self.write_catalog(WriteKind::Delete, &info).await?;
        self.tables.write().remove(name);
        for tablet in &info.tablets {
            if let Err(e) = self.delete_tablet(&info, tablet).await {
                // The catalog no longer owns it: the next start deletes it.
                tracing::warn!(tablet = %tablet, error = %e, "could not delete tablet of dropped table");
            }
        }
        Ok(true)
    }

    /// Renames a table; its tablets and data stay as they are.
    pub async fn rename_table(&self, name: &str, new_name: &str) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        self.name_is_free(new_name)?;
        let renamed = TableInfo {
            name: new_name.to_string(),
            ..(*info).clone()
        };
        self.write_catalog(WriteKind::Upsert, &renamed).await?;
        let mut tables = self.tables.write();
        tables.remove(name);
        tables.insert(new_name.to_string(), Arc::new(renamed));
        Ok(())
    }

    /// Adds, drops or renames columns. The catalog commits the new schema first, then every
    /// tablet rewrites its data to it through its log; a crash in between is finished on the
    /// next start (see `reconcile_tablets`).
    pub async fn alter_columns(&self, name: &str, changes: &[ColumnChange]) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let mut schema = info.schema.clone();
        for change in changes {
            schema = match change {
                ColumnChange::Add(column) => schema.with_column_added(column.clone())?,
                ColumnChange::Drop(column) => schema.with_column_dropped(column)?,
                ColumnChange::Rename { name, new_name } => {
                    schema.with_column_renamed(name, new_name)?
                }
            };
        }
        // Partition columns are key columns, which stay; only their positions may move.
        let sources = info.schema.sources_in(&schema);
        let partition = info
            .partition
            .with_columns_moved(|c| sources[c].unwrap_or(c));
        let altered = TableInfo {
            schema,
            partition,
            ..(*info).clone()
        };
        self.commit_schema(name, altered).await
    }

    /// Commits a table's new schema to the catalog, then has every tablet take it through its
    /// log (a crash in between is finished on the next start: see `reconcile_tablets`).
    async fn commit_schema(&self, name: &str, altered: TableInfo) -> Result<()> {
        self.write_catalog(WriteKind::Upsert, &altered).await?;
        self.tables
            .write()
            .insert(name.to_string(), Arc::new(altered.clone()));
        for tablet in &altered.tablets {
            self.placement.alter_schema(tablet, &altered.schema).await?;
        }
        Ok(())
    }

    /// Sets how long a table keeps its history: the catalog commits the new schema (which
    /// holds it, as Kudu's table extra config does), then every tablet takes it through its
    /// log, which changes its metadata only.
    pub async fn set_history_max_age(&self, name: &str, secs: u64) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let altered = TableInfo {
            schema: info.schema.clone().with_history_max_age_secs(Some(secs)),
            ..(*info).clone()
        };
        self.commit_schema(name, altered).await
    }

    /// Adds a range partition to a range-partitioned table: its tablets (one per hash bucket
    /// combination) are created, then the catalog commits them.
    pub async fn add_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let (partition, at) = info.partition.add_range(&info.schema, range)?;
        let span = partition.range_tablets(at);
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let new: Vec<String> = (0..span.len())
            .map(|c| format!("{}-{}-{c}", info.id, &prefix[..8]))
            .collect();
        let mut tablets = info.tablets.clone();
        tablets.splice(span.start..span.start, new.iter().cloned());
        let added = TableInfo {
            partition,
            tablets,
            ..(*info).clone()
        };
        self.create_tablets_and_commit(&new, added, None).await
    }

    /// Drops a range partition, deleting its tablets and their rows.
    pub async fn drop_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let (partition, at) = info.partition.drop_range(&info.schema, range)?;
        let span = info.partition.range_tablets(at);
        let mut tablets = info.tablets.clone();
        let removed: Vec<String> = tablets.drain(span).collect();
        let dropped = TableInfo {
            partition,
            tablets,
            ..(*info).clone()
        };
        self.write_catalog(WriteKind::Upsert, &dropped).await?;
        self.tables
            .write()
            .insert(name.to_string(), Arc::new(dropped));
        for tablet in &removed {
            if let Err(e) = self.delete_tablet(&info, tablet).await {
                tracing::warn!(tablet = %tablet, error = %e, "could not delete tablet of dropped range");
            }
        }
        Ok(())
    }

    async fn write_catalog(&self, kind: WriteKind, info: &TableInfo) -> Result<()> {
        let json = serde_json::to_string(info)
            .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
        self.write_catalog_row(kind, &info.id, &info.name, json)
            .await
    }

    /// Writes one row of the catalog tablet: `id`, `name`, the definition as JSON.
    async fn write_catalog_row(
        &self,
        kind: WriteKind,
        id: &str,
        name: &str,
        json: String,
    ) -> Result<()> {
        let schema = self.catalog.schema().arrow_schema();
        let rows = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![id])) as Arc<dyn Array>,
                Arc::new(StringArray::from(vec![name])),
                Arc::new(StringArray::from(vec![json])),
            ],
        )?;
        match self.catalog.write(&WriteBatch::new(kind, rows)).await {
            Ok(_) => {
                // Our own change is in `tables` already.
                self.loaded.fetch_max(
                    self.catalog.last_applied(),
                    std::sync::atomic::Ordering::AcqRel,
                );
                Ok(())
            }
            Err(EngineError::Raft(nyala_raft::RaftError::NotLeader { leader_hint })) => {
                Err(self.not_leader(leader_hint))
            }
            Err(e) => Err(e),
        }
    }

    /// The error of a master that does not lead the catalog; `leader` is the one it knows.
    fn not_leader(&self, leader: Option<u64>) -> EngineError {
        EngineError::NotLeaderMaster {
            leader: leader.map(|l| match self.masters.get(&l) {
                Some(address) => format!("the master at {address}"),
                None => format!("master {l}"),
            }),
        }
    }

    /// Flushes and stops the catalog tablet.
    pub fn shutdown(&self) -> Result<()> {
        let stopped = self.catalog.shutdown();
        // The directory may be opened again.
        self.lock.lock().take();
        stopped
    }
}

#[async_trait::async_trait]
impl Catalog for Master {
    async fn ddl(&self, op: DdlOp) -> Result<bool> {
        Master::ddl(self, op).await
    }

    fn table(&self, name: &str) -> Option<Arc<TableInfo>> {
        Master::table(self, name)
    }

    fn tables(&self) -> Vec<Arc<TableInfo>> {
        Master::tables(self)
    }

    fn views(&self) -> Vec<Arc<ViewInfo>> {
        Master::views(self)
    }

    fn users(&self) -> Vec<Arc<UserInfo>> {
        Master::users(self)
    }

    fn shutdown(&self) -> Result<()> {
        Master::shutdown(self)
    }
}

impl RaftGroups for Master {
    fn step(&self, tablet_id: &str, message: nyala_raft::Message) -> Option<nyala_raft::Message> {
        if tablet_id != CATALOG_TABLET {
            return Some(message);
        }
        self.catalog.step(message);
        None
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use parking_lot::Mutex;

    use super::*;
    use crate::partition::HashLevel;

    /// Placement that keeps no tablets, only what it was asked: tablets "created" on server 7,
    /// deleted, and the tables reconciled at a start. With `fail_at`, that creation fails.
    #[derive(Default)]
    struct RecordedPlacement {
        created: Mutex<Vec<String>>,
        deleted: Mutex<Vec<(String, Vec<u64>)>>,
        reconciled: Mutex<Vec<String>>,
        fail_at: Option<usize>,
    }

    #[async_trait::async_trait]
    impl TabletPlacement for RecordedPlacement {
        async fn create_tablet(&self, id: &str, _: &Schema, _: usize) -> Result<Vec<u64>> {
            let mut created = self.created.lock();
            if self.fail_at == Some(created.len()) {
                return Err(EngineError::Unavailable("no tablet server answers".into()));
            }
            created.push(id.to_string());
            Ok(vec![7])
        }

        async fn delete_tablet(&self, id: &str, servers: &[u64]) -> Result<()> {
            self.deleted.lock().push((id.to_string(), servers.to_vec()));
            Ok(())
        }

        async fn alter_schema(&self, _: &str, _: &Schema) -> Result<()> {
            Ok(())
        }

        async fn clone_tablet(&self, _: &str, _: &str, _: Option<Timestamp>) -> Result<Vec<u64>> {
            Err(EngineError::Unsupported("no clones here".into()))
        }

        fn reconcile(&self, tables: &[Arc<TableInfo>]) -> Result<()> {
            let mut reconciled = self.reconciled.lock();
            reconciled.extend(tables.iter().map(|t| t.name.clone()));
            Ok(())
        }
    }

    fn open(dir: &Path, placement: &Arc<RecordedPlacement>) -> Master {
        let clock = Arc::new(HybridClock::new());
        Master::open(dir, clock, placement.clone(), None).unwrap()
    }

    fn schema() -> Schema {
        let columns = vec![
            ColumnSchema::new("k", ColumnType::Int64, false),
            ColumnSchema::new("v", ColumnType::String, true),
        ];
        Schema::new(columns, vec![0]).unwrap()
    }

    /// `schema()` hashed on `k` into `buckets` tablets.
    fn hashed(buckets: u32) -> PartitionSchema {
        let hash = vec![HashLevel {
            columns: vec![0],
            buckets,
        }];
        PartitionSchema::new(&schema(), hash, vec![], vec![]).unwrap()
    }

    async fn create(master: &Master, name: &str, if_not_exists: bool) -> Result<bool> {
        (master.create_table(name, schema(), hashed(3), if_not_exists, 0, None)).await
    }

    /// A created table's tablets are placed, and the table, with where they went, is read
    /// back from the catalog tablet when the master starts again; dropping it deletes its
    /// tablets where they are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_created_table_is_in_the_catalog_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let placement = Arc::new(RecordedPlacement::default());
        let master = open(dir.path(), &placement);
        assert!(create(&master, "t", false).await.unwrap());
        assert!(!create(&master, "t", true).await.unwrap());
        assert!(matches!(
            create(&master, "t", false).await,
            Err(EngineError::TableExists(_))
        ));
        let table = master.table("t").unwrap();
        assert_eq!(table.tablets, *placement.created.lock());
        assert_eq!(table.tablets.len(), 3);
        master.shutdown().unwrap();
        drop(master);

        let placement = Arc::new(RecordedPlacement::default());
        let master = open(dir.path(), &placement);
        let reopened = master.table("t").expect("table read back");
        assert_eq!(reopened.id, table.id);
        assert_eq!(reopened.tablets, table.tablets);
        assert_eq!(reopened.schema, schema());
        assert!(reopened
            .tablets
            .iter()
            .all(|t| reopened.placement[t] == [7]));
        assert_eq!(*placement.reconciled.lock(), ["t"]);

        assert!(master.drop_table("t", false).await.unwrap());
        assert!(!master.drop_table("t", true).await.unwrap());
        let deleted = placement.deleted.lock().clone();
        let expected: Vec<(String, Vec<u64>)> =
            table.tablets.iter().map(|t| (t.clone(), vec![7])).collect();
        assert_eq!(deleted, expected);
        assert!(master.tables().is_empty());
        master.shutdown().unwrap();
    }

    /// A table whose tablets cannot all be made is not created: the catalog never holds it,
    /// and the tablets made are deleted again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_whose_tablets_cannot_all_be_made_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let placement = Arc::new(RecordedPlacement {
            fail_at: Some(2),
            ..Default::default()
        });
        let master = open(dir.path(), &placement);
        assert!(matches!(
            create(&master, "t", false).await,
            Err(EngineError::Unavailable(_))
        ));
        assert!(master.table("t").is_none());
        let created = placement.created.lock().clone();
        assert_eq!(created.len(), 2);
        let deleted: Vec<String> = (placement.deleted.lock().iter())
            .map(|(t, _)| t.clone())
            .collect();
        assert!(created.iter().all(|t| deleted.contains(t)));
        master.shutdown().unwrap();
        drop(master);
        let master = open(dir.path(), &Arc::default());
        assert!(master.tables().is_empty());
        master.shutdown().unwrap();
    }

    /// Tables and views share one namespace: neither can be created, or a table renamed, to
    /// a name the other has.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tables_and_views_share_one_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let master = open(dir.path(), &Arc::default());
        let view = |name: &str| DdlOp::CreateView {
            view: ViewInfo {
                name: name.into(),
                sql: "SELECT 1".into(),
                access: Access::default(),
            },
            or_replace: false,
        };
        assert!(master.ddl(view("v")).await.unwrap());
        assert!(create(&master, "t", false).await.unwrap());
        assert!(matches!(
            create(&master, "v", false).await,
            Err(EngineError::TableExists(_))
        ));
        assert!(matches!(
            master.ddl(view("t")).await,
            Err(EngineError::TableExists(_))
        ));
        assert!(matches!(
            master.rename_table("t", "v").await,
            Err(EngineError::TableExists(_))
        ));
        let drop_view = DdlOp::DropView {
            name: "v".into(),
            if_exists: false,
        };
        assert!(master.ddl(drop_view).await.unwrap());
        master.rename_table("t", "v").await.unwrap();
        assert!(master.table("t").is_none() && master.table("v").is_some());
        assert!(master.views().is_empty());
        master.shutdown().unwrap();
    }

    /// A user who owns a table cannot be dropped (the table would have no owner); once the
    /// table is gone, it can.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_owning_a_table_is_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let master = open(dir.path(), &Arc::default());
        let user = UserInfo {
            name: "ann".into(),
            password_hash: "not checked here".into(),
            admin: false,
            scram: None,
        };
        let create_user = DdlOp::CreateUser {
            user,
            if_not_exists: false,
        };
        assert!(master.ddl(create_user).await.unwrap());
        let owner = Some("ann".to_string());
        (master.create_table("t", schema(), hashed(1), false, 0, owner))
            .await
            .unwrap();
        let drop_user = || DdlOp::DropUser {
            name: "ann".into(),
            if_exists: false,
        };
        assert!(matches!(
            master.ddl(drop_user()).await,
            Err(EngineError::Unsupported(_))
        ));
        assert_eq!(master.users().len(), 1);
        master.drop_table("t", false).await.unwrap();
        assert!(master.ddl(drop_user()).await.unwrap());
        assert!(master.users().is_empty());
        master.shutdown().unwrap();
    }
}
