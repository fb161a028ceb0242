//! The catalog's vocabulary: what a table is ([`TableInfo`]), the DDL operations on tables
//! ([`DdlOp`], defined once and used by the SQL layer, the client, the RPC between coordinator
//! and master, and the master), and the [`Catalog`] seam through which a client reads table
//! definitions and runs DDL — on the master in this process, or on the cluster's leading master.

use std::collections::BTreeMap;
use std::sync::Arc;

use nyala_storage::{ColumnSchema, Schema};
use serde::{Deserialize, Serialize};

use crate::partition::{PartitionSchema, RangeSpec};
use crate::Result;

mod access;
pub use access::{hash_password, Access, Privilege, ScramVerifier, UserInfo, SCRAM_ITERATIONS};

pub type TableId = String;

/// A table's definition as the catalog stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableInfo {
    pub id: TableId,
    pub name: String,
    pub schema: Schema,
    pub partition: PartitionSchema,
    /// Tablet ids, in the partitioning's tablet order (see [`PartitionSchema`]).
    pub tablets: Vec<String>,
    /// Replicas of each tablet (0: the host's default).
    #[serde(default)]
    pub replicas: usize,
    /// The tablet servers holding each tablet's replicas, in a cluster (empty in the embedded
    /// node).
    #[serde(default)]
    pub placement: BTreeMap<String, Vec<u64>>,
    /// Its owner and the privileges granted on it.
    #[serde(default)]
    pub access: Access,
}

/// One change of `ALTER TABLE ... ADD | DROP | RENAME COLUMN`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ColumnChange {
    Add(ColumnSchema),
    Drop(String),
    Rename { name: String, new_name: String },
}

/// One DDL operation on the catalog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum DdlOp {
    CreateTable {
        name: String,
        schema: Schema,
        partition: PartitionSchema,
        if_not_exists: bool,
        replicas: usize,
        /// The user creating it, who owns it.
        #[serde(default)]
        owner: Option<String>,
    },
    /// `CREATE TABLE name CLONE source [AS OF time]`: a table with the source's schema,
    /// partitioning and rows (as of `as_of`, or now), independent from then on.
    CloneTable {
        name: String,
        source: String,
        as_of: Option<nyala_storage::Timestamp>,
        if_not_exists: bool,
        #[serde(default)]
        owner: Option<String>,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    RenameTable {
        name: String,
        new_name: String,
    },
    AlterColumns {
        name: String,
        changes: Vec<ColumnChange>,
    },
    /// `ALTER TABLE name SET (history_max_age_secs = secs)`.
    SetHistoryMaxAge {
        name: String,
        secs: u64,
    },
    AddRangePartition {
        name: String,
        range: RangeSpec,
    },
    DropRangePartition {
        name: String,
        range: RangeSpec,
    },
    /// `CREATE [OR REPLACE] VIEW name AS query`: `query` is the SQL text, checked by the SQL
    /// layer before it gets here.
    CreateView {
        view: ViewInfo,
        or_replace: bool,
    },
    DropView {
        name: String,
        if_exists: bool,
    },
    CreateUser {
        user: UserInfo,
        if_not_exists: bool,
    },
    /// A new password (its hash).
    AlterUser {
        name: String,
        password_hash: String,
        /// The new password's SCRAM verifier (absent from operations logged before there
        /// were).
        #[serde(default)]
        scram: Option<ScramVerifier>,
    },
    /// Also takes back every privilege granted to the user; refused while it owns tables.
    DropUser {
        name: String,
        if_exists: bool,
    },
    /// `GRANT privileges ON table_or_view TO user` (`grant`), or `REVOKE ... FROM user`.
    Privileges {
        object: String,
        user: String,
        privileges: Vec<Privilege>,
        grant: bool,
    },
}

/// A view as the catalog stores it: a name for a query, planned whenever a statement reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewInfo {
    pub name: String,
    /// The query's SQL text.
    pub sql: String,
    /// Its owner (whose privileges its query reads with) and the privileges granted on it.
    #[serde(default)]
    pub access: Access,
}

/// What the catalog holds, as a leading master hands it to the others and to clients.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CatalogContents {
    pub tables: Vec<TableInfo>,
    #[serde(default)]
    pub views: Vec<ViewInfo>,
    #[serde(default)]
    pub users: Vec<UserInfo>,
}

impl DdlOp {
    /// The tables the operation names.
    pub fn table_names(&self) -> impl Iterator<Item = &str> {
        let (name, other) = match self {
            DdlOp::CreateTable { name, .. }
            | DdlOp::DropTable { name, .. }
            | DdlOp::AlterColumns { name, .. }
            | DdlOp::SetHistoryMaxAge { name, .. }
            | DdlOp::AddRangePartition { name, .. }
            | DdlOp::DropRangePartition { name, .. }
            | DdlOp::DropView { name, .. }
            | DdlOp::CreateView {
                view: ViewInfo { name, .. },
                ..
            }
            | DdlOp::Privileges { object: name, .. } => (Some(name), None),
            DdlOp::RenameTable { name, new_name }
            | DdlOp::CloneTable {
                name,
                source: new_name,
                ..
            } => (Some(name), Some(new_name)),
            DdlOp::CreateUser { .. } | DdlOp::AlterUser { .. } | DdlOp::DropUser { .. } => {
                (None, None)
            }
        };
        name.into_iter().chain(other).map(String::as_str)
    }
}

/// Where a client finds table definitions and runs DDL.
#[async_trait::async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Runs one DDL operation; whether it did something (a CREATE ... IF NOT EXISTS of an
    /// existing table, or a DROP ... IF EXISTS of a missing one, does not).
    async fn ddl(&self, op: DdlOp) -> Result<bool>;
    fn table(&self, name: &str) -> Option<Arc<TableInfo>>;
    fn tables(&self) -> Vec<Arc<TableInfo>>;
    /// All views, sorted by name.
    fn views(&self) -> Vec<Arc<ViewInfo>>;
    /// All users, sorted by name.
    fn users(&self) -> Vec<Arc<UserInfo>>;
    /// Flushes and stops what this process holds of the catalog.
    fn shutdown(&self) -> Result<()> {
        Ok(())
    }
}
