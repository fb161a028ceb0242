//! `NyalaTable`: the DataFusion `TableProvider` of a Nyala table.
//!
//! Scans become one [`NyalaScanExec`] partition per tablet with projection, convertible filters
//! and (when no filter needs re-checking) the limit pushed into storage. INSERT and UPSERT
//! (`InsertOp::Replace`) here, UPDATE and DELETE through [`crate::plan::dml::MutationNode`], become
//! plans ending in a [`DataSinkExec`] over a [`NyalaSink`], so DataFusion does all expression
//! evaluation and Nyala only applies mutations.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{Constraint, Constraints, ScalarValue};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use nyala_engine::{Client, TableHandle};
use nyala_storage::{ScanSpec, Timestamp, WriteKind};

use crate::catalog::predicate::to_predicates;
use crate::exec::mutation::ConditionalMutationExec;
use crate::exec::scan::NyalaScanExec;
use crate::exec::sink::NyalaSink;

const SCAN_BATCH_ROWS: usize = 8192;

#[derive(Debug)]
pub struct NyalaTable {
    client: Client,
    table: TableHandle,
    constraints: Constraints,
    /// Column defaults (`DEFAULT` in CREATE TABLE) as literals, by column name.
    defaults: HashMap<String, Expr>,
    /// `AS OF`: the snapshot every scan of the table reads at.
    as_of: Option<Timestamp>,
}

impl NyalaTable {
    pub fn new(client: Client, table: TableHandle) -> Self {
        let constraints = Constraints::new_unverified(vec![Constraint::PrimaryKey(
            table.schema.key_columns().to_vec(),
        )]);
        let defaults = table
            .schema
            .columns()
            .iter()
            .filter_map(|c| {
                let text = c.default.clone()?;
                let value = ScalarValue::try_from_string(text, &c.column_type.arrow_type()).ok()?;
                Some((c.name.clone(), Expr::Literal(value, None)))
            })
            .collect();
        Self {
            client,
            table,
            constraints,
            defaults,
            as_of: None,
        }
    }

    /// The table's definition, and whether this provider reads it `AS OF` a fixed time.
    pub(crate) fn handle(&self) -> (TableHandle, bool) {
        (self.table.clone(), self.as_of.is_some())
    }

    /// The table as it was at `snapshot` (read-only).
    pub fn pinned_at(self, snapshot: Timestamp) -> Self {
        Self {
            as_of: Some(snapshot),
            ..self
        }
    }

    /// A scan of this table with `filters` pushed into storage where they convert.
    pub(crate) fn scan_exec(
        &self,
        projection: Option<Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<NyalaScanExec> {
        let mut predicates = Vec::new();
        let mut pushed = Vec::new();
        for filter in filters {
            if let Some(p) = to_predicates(&self.table.schema, filter) {
                predicates.extend(p);
                pushed.push(filter.human_display().to_string());
            }
        }
        // DataFusion re-applies inexact filters (those on parameters) above the scan, so a limit
        // below them is only correct without filters.
        let limit = if filters.is_empty() { limit } else { None };
        let spec = ScanSpec {
            projection,
            predicates,
            snapshot: Timestamp(0),
            limit,
            batch_size: SCAN_BATCH_ROWS,
            string_views: true,
            changes_since: None,
        };
        let scan = NyalaScanExec::try_new(self.client.clone(), self.table.clone(), spec, pushed)?;
        Ok(match self.as_of {
            Some(snapshot) => scan.pinned_at(snapshot),
            None => scan,
        })
    }

    pub(crate) fn column_names(&self) -> Vec<String> {
        self.table
            .schema
            .columns()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    pub(crate) fn key_columns(&self) -> Vec<usize> {
        self.table.schema.key_columns().to_vec()
    }

    pub(crate) fn sink(
        &self,
        input: Arc<dyn ExecutionPlan>,
        kind: WriteKind,
    ) -> Arc<dyn ExecutionPlan> {
        let sink = NyalaSink::new(
            self.client.clone(),
            self.table.clone(),
            kind,
            input.schema(),
        );
        Arc::new(DataSinkExec::new(input, Arc::new(sink), None))
    }

    /// The sink of an UPDATE or DELETE: writes the rows on condition that they have not changed
    /// since the statement read them, and reads the others again (see [`crate::exec::mutation`]).
    pub(crate) fn conditional_sink(
        &self,
        input: Arc<dyn ExecutionPlan>,
        kind: WriteKind,
        logical: Arc<LogicalPlan>,
        state: Arc<SessionState>,
    ) -> Arc<dyn ExecutionPlan> {
        let sink = NyalaSink::new(
            self.client.clone(),
            self.table.clone(),
            kind,
            input.schema(),
        );
        Arc::new(ConditionalMutationExec::new(
            input,
            logical,
            state,
            Arc::new(sink),
        ))
    }
}

#[async_trait]
impl TableProvider for NyalaTable {
    /// String columns are `Utf8View`, as scans return them (see `ScanSpec::string_views`).
    fn schema(&self) -> SchemaRef {
        self.table.schema.arrow_view_schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.defaults.get(column)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let scan = self.scan_exec(projection.cloned(), filters, limit)?;
        Ok(Arc::new(
            scan.with_exact_filter(self.exact_filter(state, filters)),
        ))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Storage evaluates the filters it takes exactly, so DataFusion need not filter again;
        // but a filter on a parameter may not convert once its value is bound (1.5 for an
        // integer column), and then only DataFusion's own filter applies it.
        Ok(filters
            .iter()
            .map(
                |f| match to_predicates(&self.table.schema, &with_sample_values(f)) {
                    Some(_) if !has_placeholders(f) => TableProviderFilterPushDown::Exact,
                    Some(_) => TableProviderFilterPushDown::Inexact,
                    None => TableProviderFilterPushDown::Unsupported,
                },
            )
            .collect())
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let kind = match insert_op {
            InsertOp::Append => WriteKind::Insert,
            InsertOp::Replace => WriteKind::Upsert,
            InsertOp::Overwrite => {
                return Err(DataFusionError::NotImplemented(
                    "INSERT OVERWRITE is not supported; use DELETE and INSERT".into(),
                ))
            }
        };
        Ok(self.sink(input, kind))
    }
}

impl NyalaTable {
    /// The filters storage takes, as one expression over the table's columns, for the scan's
    /// statistics (None if there are none or it does not plan).
    fn exact_filter(
        &self,
        state: &dyn Session,
        filters: &[Expr],
    ) -> Option<Arc<dyn datafusion::physical_expr::PhysicalExpr>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        let pushed = filters
            .iter()
            .filter(|f| to_predicates(&self.table.schema, f).is_some())
            .cloned()
            .reduce(Expr::and)?;
        // Filters name the table's columns qualified by the name the query gave it.
        let unqualified = pushed
            .transform(|e| match e {
                Expr::Column(c) => Ok(Transformed::yes(Expr::Column(
                    datafusion::common::Column::new_unqualified(c.name),
                ))),
                other => Ok(Transformed::no(other)),
            })
            .ok()?
            .data;
        let schema = datafusion::common::DFSchema::try_from(
            self.table.schema.arrow_view_schema().as_ref().clone(),
        )
        .ok()?;
        state.create_physical_expr(unqualified, &schema).ok()
    }
}

/// Whether `filter` holds a placeholder (`$1`).
pub(crate) fn has_placeholders(filter: &Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    filter
        .exists(|e| Ok(matches!(e, Expr::Placeholder(_))))
        .unwrap_or(true)
}

/// `filter` with each typed placeholder (`$1`) replaced by a value of its type: a prepared
/// query is optimized before its parameters are bound, and a filter on a parameter is pushed
/// into the scan when one on a value would be (the scan converts it once it is bound).
fn with_sample_values(filter: &Expr) -> Expr {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    filter
        .clone()
        .transform(|e| match &e {
            Expr::Placeholder(p) => match p
                .field
                .as_ref()
                .and_then(|f| ScalarValue::new_default(f.data_type()).ok())
            {
                Some(value) => Ok(Transformed::yes(Expr::Literal(value, None))),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })
        .map(|t| t.data)
        .unwrap_or_else(|_| filter.clone())
}
