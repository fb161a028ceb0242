//! The `nyala.public` schema as DataFusion sees it: every table and view of the master's
//! catalog, looked up at planning time, so those created by other sessions are visible at once.
//! A view is its query's SQL text, planned with the reading statement's session each time. Next to it,
//! `nyala.sys` ([`crate::catalog::sys`]) holds system tables computed at planning time.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::{TableProvider, ViewTable};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::resolve::resolve_table_references;
use nyala_engine::Client;
use parking_lot::RwLock;

use crate::catalog::hidden;
use crate::catalog::table::NyalaTable;
use crate::session::access::{Authorizer, Principal};

pub struct NyalaSchemaProvider {
    client: Client,
    /// The session's user: only what it may see is listed.
    principal: Arc<Principal>,
    /// The session's state, to plan the queries of views with (weak: the state holds this
    /// provider).
    state: Weak<RwLock<SessionState>>,
}

impl std::fmt::Debug for NyalaSchemaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NyalaSchemaProvider").finish()
    }
}

impl NyalaSchemaProvider {
    pub fn new(
        client: Client,
        state: Weak<RwLock<SessionState>>,
        principal: Arc<Principal>,
    ) -> Self {
        Self {
            client,
            state,
            principal,
        }
    }
}

#[async_trait]
impl SchemaProvider for NyalaSchemaProvider {
    /// Tables, then views: those the session's user may see.
    fn table_names(&self) -> Vec<String> {
        let tables = self.client.tables().into_iter().map(|t| t.name.clone());
        let views = self.client.views().into_iter().map(|v| v.name.clone());
        visible(&self.client, &self.principal, tables.chain(views))
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        if let Ok(table) = self.client.table(name) {
            return Ok(Some(Arc::new(NyalaTable::new(self.client.clone(), table))));
        }
        let Some(view) = self.client.view(name) else {
            return Ok(None);
        };
        let state = (self.state.upgrade())
            .ok_or_else(|| DataFusionError::Plan("the session has ended".into()))?;
        let state = state.read().clone();
        let plan = view_plan(&state, &self.client, &view.sql)
            .await
            .map_err(|e| DataFusionError::Plan(format!("view '{name}' cannot be read: {e}")))?;
        Ok(Some(Arc::new(ViewTable::new(plan, Some(view.sql.clone())))))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.client.table(name).is_ok() || self.client.view(name).is_some()
    }
}

/// The logical plan of a view's query, as every statement that reads the view plans it (its
/// wildcards leave hidden keys out, as a statement's do).
pub(crate) async fn view_plan(
    state: &SessionState,
    client: &Client,
    sql: &str,
) -> Result<LogicalPlan> {
    let dialect = state.config().options().sql_parser.dialect;
    let mut statement = state.sql_to_statement(sql, &dialect)?;
    if let DFStatement::Statement(statement) = &mut statement {
        hidden::exclude_hidden(statement.as_mut(), hidden::keyless_in(client));
    }
    state.statement_to_plan(statement).await
}

/// Whether the query `sql` reads the view `name`, directly or through the views it reads (the
/// views in the catalog read no view in a cycle, so this ends).
pub(crate) fn reads_view(client: &Client, sql: &str, name: &str) -> Result<bool> {
    for statement in DFParser::parse_sql(sql)? {
        let (tables, _ctes) = resolve_table_references(&statement, true)?;
        for table in tables {
            if table.table() == name {
                return Ok(true);
            }
            if let Some(view) = client.view(table.table()) {
                if reads_view(client, &view.sql, name)? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The names among `names` that `principal` may see.
pub(crate) fn visible(
    client: &Client,
    principal: &Principal,
    names: impl Iterator<Item = String>,
) -> Vec<String> {
    let authorizer = Authorizer { client };
    let user = principal.name();
    names
        .filter(|name| authorizer.sees(user.as_deref(), name))
        .collect()
}
