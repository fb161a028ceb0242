//! `NyalaTable`: the DataFusion `TableProvider` of a Nyala table.
//!
//! Scans become one [`NyalaScanExec`] partition per tablet with projection, convertible filters
//! and (when no filter needs re-checking) the limit pushed into storage. INSERT, UPSERT
//! (`InsertOp::Replace`), UPDATE and DELETE become plans ending in a [`DataSinkExec`] over a
//! [`NyalaSink`], so DataFusion does all expression evaluation and Nyala only applies mutations.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{Constraint, Constraints, DFSchema};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, ExprSchemable, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;
use nyala_engine::{Client, TableHandle};
use nyala_storage::{ScanSpec, Timestamp, WriteKind};

use crate::dml::NyalaSink;
use crate::predicate::to_predicates;
use crate::scan::NyalaScanExec;

const SCAN_BATCH_ROWS: usize = 8192;

#[derive(Debug)]
pub struct NyalaTable {
    client: Client,
    table: TableHandle,
    constraints: Constraints,
}

impl NyalaTable {
    pub fn new(client: Client, table: TableHandle) -> Self {
        let constraints = Constraints::new_unverified(vec![Constraint::PrimaryKey(
            table.schema.key_columns().to_vec(),
        )]);
        Self {
            client,
            table,
            constraints,
        }
    }

    /// A scan of this table with `filters` pushed into storage where they convert.
    fn scan_exec(
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
        // DataFusion re-applies inexact filters above the scan, so a limit below them is only
        // correct without filters.
        let limit = if filters.is_empty() { limit } else { None };
        let spec = ScanSpec {
            projection,
            predicates,
            snapshot: Timestamp(0),
            limit,
            batch_size: SCAN_BATCH_ROWS,
        };
        NyalaScanExec::try_new(self.client.clone(), self.table.clone(), spec, pushed)
    }

    /// Scan → filter, the rows a DELETE or UPDATE targets, with every column.
    fn target_rows(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<(Arc<dyn ExecutionPlan>, DFSchema)> {
        let df_schema = DFSchema::try_from(self.schema().as_ref().clone())?;
        let mut plan: Arc<dyn ExecutionPlan> = Arc::new(self.scan_exec(None, &filters, None)?);
        if let Some(predicate) = conjunction(filters) {
            let predicate = state.create_physical_expr(predicate, &df_schema)?;
            plan = Arc::new(FilterExec::try_new(predicate, plan)?);
        }
        Ok((plan, df_schema))
    }

    fn key_projection(&self) -> Vec<(Arc<dyn PhysicalExpr>, String)> {
        self.table
            .schema
            .key_columns()
            .iter()
            .map(|&i| {
                let name = self.table.schema.columns()[i].name.clone();
                (
                    Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>,
                    name,
                )
            })
            .collect()
    }

    fn sink(&self, input: Arc<dyn ExecutionPlan>, kind: WriteKind) -> Arc<dyn ExecutionPlan> {
        let sink = NyalaSink::new(
            self.client.clone(),
            self.table.clone(),
            kind,
            input.schema(),
        );
        Arc::new(DataSinkExec::new(input, Arc::new(sink), None))
    }
}

#[async_trait]
impl TableProvider for NyalaTable {
    fn schema(&self) -> SchemaRef {
        self.table.schema.arrow_schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.scan_exec(
            projection.cloned(),
            filters,
            limit,
        )?))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match to_predicates(&self.table.schema, f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
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

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (rows, _) = self.target_rows(state, filters)?;
        let keys = Arc::new(ProjectionExec::try_new(self.key_projection(), rows)?);
        Ok(self.sink(keys, WriteKind::Delete))
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = &self.table.schema;
        for (column, _) in &assignments {
            match schema.column_index(column) {
                None => return Err(DataFusionError::Plan(format!("unknown column '{column}'"))),
                Some(i) if schema.is_key_column(i) => {
                    return Err(DataFusionError::Plan(format!(
                        "cannot update primary key column '{column}'; delete the row and insert it with the new key"
                    )))
                }
                Some(_) => {}
            }
        }
        let (rows, df_schema) = self.target_rows(state, filters)?;
        let mut exprs = self.key_projection();
        for (column, value) in assignments {
            let target = self.schema().field_with_name(&column)?.data_type().clone();
            let value = value.cast_to(&target, &df_schema)?;
            exprs.push((state.create_physical_expr(value, &df_schema)?, column));
        }
        let updates = Arc::new(ProjectionExec::try_new(exprs, rows)?);
        Ok(self.sink(updates, WriteKind::Update))
    }
}
