//! UPDATE, DELETE and INSERT IGNORE as logical plans: DataFusion's DML plan is rewritten into a
//! [`MutationNode`] whose input selects the target rows like any query (filters, subqueries and
//! joins, runtime filters included) and yields their key columns, plus for an UPDATE the new
//! values of the assigned columns. [`NyalaQueryPlanner`] plans the node into the table's sink
//! ([`crate::exec::sink`]).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchemaRef, TableReference};
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    DmlStatement, Expr, Extension, LogicalPlan, LogicalPlanBuilder, TableSource,
    UserDefinedLogicalNode, UserDefinedLogicalNodeCore, WriteOp,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use nyala_storage::WriteKind;

use crate::catalog::table::NyalaTable;

/// A DELETE, an UPDATE or an INSERT IGNORE of a Nyala table in a logical plan. Its input yields
/// the key columns of the target rows (named as in the table) and, for an UPDATE, the new values
/// of the assigned columns; for an INSERT IGNORE, the new rows.
#[derive(Clone)]
pub struct MutationNode {
    table: TableReference,
    target: Arc<dyn TableSource>,
    kind: WriteKind,
    input: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

/// Rewrites DataFusion's DELETE and UPDATE plans (anywhere in `plan`, under EXPLAIN too) into
/// [`MutationNode`]s. DataFusion's own path would hand the table only the WHERE conjuncts that
/// mention the target table, losing subqueries and joins: `DELETE ... WHERE k IN (SELECT ...)`
/// would delete every row.
pub fn plan_mutations(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Delete | WriteOp::Update) => {
            Ok(Transformed::yes(MutationNode::try_new(dml)?))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// Rewrites the INSERT of `plan` (an INSERT, or EXPLAIN of one) into a [`MutationNode`] that
/// skips rows whose key exists or repeats.
pub fn plan_insert_ignore(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(InsertOp::Append)) => {
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(MutationNode {
                    table: dml.table_name,
                    target: dml.target,
                    kind: WriteKind::InsertIgnore,
                    input: dml.input,
                    schema: dml.output_schema,
                }),
            })))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

impl MutationNode {
    /// The table the node writes.
    pub(crate) fn target(&self) -> &Arc<dyn TableSource> {
        &self.target
    }

    fn try_new(dml: DmlStatement) -> Result<LogicalPlan> {
        let provider = source_as_provider(&dml.target)?;
        let Some(table) = provider.downcast_ref::<NyalaTable>() else {
            return Ok(LogicalPlan::Dml(dml));
        };
        let input = dml.input.as_ref();
        let columns = table.column_names();
        if input.schema().fields().len() != columns.len() {
            return Err(DataFusionError::Plan(format!(
                "{} of '{}' selects {} columns, the table has {}",
                dml.op,
                dml.table_name,
                input.schema().fields().len(),
                columns.len()
            )));
        }
        // Input columns are the table's, in order: for DELETE the target rows as they are,
        // for UPDATE the rows as they will be.
        let mut wanted = table.key_columns();
        let kind = match dml.op {
            WriteOp::Update => {
                for (i, name) in assigned_columns(input, &dml.table_name)? {
                    if wanted.contains(&i) {
                        return Err(DataFusionError::Plan(format!(
                            "cannot update primary key column '{name}'; delete the row and insert it with the new key"
                        )));
                    }
                    wanted.push(i);
                }
                WriteKind::Update
            }
            _ => WriteKind::Delete,
        };
        let exprs = wanted.iter().map(|&i| {
            Expr::Column(Column::from(input.schema().qualified_field(i))).alias(&columns[i])
        });
        let projected = LogicalPlanBuilder::from(input.clone())
            .project(exprs)?
            .build()?;
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(MutationNode {
                table: dml.table_name,
                target: dml.target,
                kind,
                input: Arc::new(projected),
                schema: dml.output_schema,
            }),
        }))
    }
}

/// The (index, name) of the columns an UPDATE's input projection assigns: every column that is
/// not the target table's own column passed through.
fn assigned_columns(input: &LogicalPlan, table: &TableReference) -> Result<Vec<(usize, String)>> {
    let LogicalPlan::Projection(projection) = input else {
        return Err(DataFusionError::Plan(
            "UPDATE plan has an unexpected shape".into(),
        ));
    };
    let mut aliases = vec![table.clone()];
    input.apply(|node| {
        if let LogicalPlan::SubqueryAlias(alias) = node {
            if matches!(alias.input.as_ref(), LogicalPlan::TableScan(scan) if scan.table_name.resolved_eq(table))
            {
                aliases.push(alias.alias.clone());
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    let mut assigned = Vec::new();
    for (i, (expr, field)) in projection
        .expr
        .iter()
        .zip(projection.schema.fields())
        .enumerate()
    {
        let unchanged = matches!(
            expr.clone().unalias(),
            Expr::Column(c) if c.name == *field.name()
                && c.relation.as_ref().is_none_or(|r| aliases.iter().any(|a| a.resolved_eq(r)))
        );
        if !unchanged {
            assigned.push((i, field.name().clone()));
        }
    }
    Ok(assigned)
}

impl fmt::Debug for MutationNode {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        UserDefinedLogicalNodeCore::fmt_for_explain(self, f)
    }
}

impl PartialEq for MutationNode {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.kind == other.kind && self.input == other.input
    }
}

impl Eq for MutationNode {}

impl PartialOrd for MutationNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (&self.table, self.kind, &self.input).partial_cmp(&(&other.table, other.kind, &other.input))
    }
}

impl Hash for MutationNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.table.hash(state);
        self.kind.hash(state);
        self.input.hash(state);
    }
}

impl UserDefinedLogicalNodeCore for MutationNode {
    fn name(&self) -> &str {
        "NyalaMutation"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NyalaMutation: {} {}", self.kind_name(), self.table)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("NyalaMutation needs an input".into()))?;
        Ok(Self {
            input: Arc::new(input),
            ..self.clone()
        })
    }
}

/// Plans [`MutationNode`]s: the selected rows go into the table's sink.
struct MutationPlanner;

#[async_trait]
impl ExtensionPlanner for MutationPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(mutation) = node.as_any().downcast_ref::<MutationNode>() else {
            return Ok(None);
        };
        let provider = source_as_provider(&mutation.target)?;
        let (Some(table), [input]) = (provider.downcast_ref::<NyalaTable>(), physical_inputs)
        else {
            return Err(DataFusionError::Internal(format!(
                "cannot plan {} of '{}'",
                mutation.kind_name(),
                mutation.table
            )));
        };
        if mutation.kind == WriteKind::InsertIgnore {
            return Ok(Some(table.sink(input.clone(), mutation.kind)));
        }
        let (Some(state), [logical]) = (
            session.as_any().downcast_ref::<SessionState>(),
            logical_inputs,
        ) else {
            return Err(DataFusionError::Internal(format!(
                "cannot plan {} of '{}' outside a session",
                mutation.kind_name(),
                mutation.table
            )));
        };
        Ok(Some(table.conditional_sink(
            input.clone(),
            mutation.kind,
            Arc::new((*logical).clone()),
            Arc::new(state.clone()),
        )))
    }
}

impl MutationNode {
    pub(crate) fn kind(&self) -> WriteKind {
        self.kind
    }

    /// The plan yielding the target rows' keys (and, for an UPDATE, the new values).
    pub(crate) fn input(&self) -> &LogicalPlan {
        &self.input
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            WriteKind::Update => "UPDATE",
            WriteKind::InsertIgnore => "INSERT IGNORE",
            _ => "DELETE",
        }
    }
}

/// DataFusion's physical planner with Nyala's logical nodes added.
#[derive(Debug)]
pub struct NyalaQueryPlanner;

#[async_trait]
impl QueryPlanner for NyalaQueryPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(MutationPlanner)])
            .create_physical_plan(plan, session)
            .await
    }
}
