//! [`DecimalArithmeticRule`]: the physical optimizer rule that puts a [`DecimalArithmetic`] in
//! place of each `Decimal128` arithmetic `BinaryExpr` of projections, filters and first-stage
//! aggregates' arguments.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::projection::ProjectionExpr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::decimal::expr::DecimalArithmetic;

/// The physical optimizer rule that swaps decimal arithmetic for [`DecimalArithmetic`].
#[derive(Debug, Default)]
pub struct DecimalArithmeticRule;

impl DecimalArithmeticRule {
    /// The rule's name among the physical optimizer's.
    pub const NAME: &'static str = "nyala_decimal_arithmetic";

    /// `node` with its expressions swapped, if it is a node this rule rewrites and any changed.
    fn rewrite(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
            let schema = projection.input().schema();
            let mut changed = false;
            let exprs: Vec<ProjectionExpr> = (projection.expr().iter())
                .map(|e| {
                    let expr = swapped(&e.expr, &schema, &mut changed);
                    ProjectionExpr::new(expr, e.alias.clone())
                })
                .collect();
            return match changed {
                true => Ok(Some(Arc::new(ProjectionExec::try_new(
                    exprs,
                    projection.input().clone(),
                )?))),
                false => Ok(None),
            };
        }
        if let Some(filter) = node.downcast_ref::<FilterExec>() {
            let mut changed = false;
            let predicate = swapped(filter.predicate(), &filter.input().schema(), &mut changed);
            return match changed {
                true => Ok(Some(Arc::new(
                    FilterExecBuilder::from(filter)
                        .with_predicate(predicate)
                        .build()?,
                ))),
                false => Ok(None),
            };
        }
        if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
            // Later stages merge states: their arguments are not evaluated (nor are they
            // over the stage's input).
            let first_stage = matches!(
                aggregate.mode(),
                AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
            );
            if !first_stage {
                return Ok(None);
            }
            let schema = aggregate.input_schema();
            let mut changed = false;
            let mut exprs = Vec::with_capacity(aggregate.aggr_expr().len());
            for function in aggregate.aggr_expr() {
                let all = function.all_expressions();
                let mut swapped_here = false;
                let args = (all.args.iter())
                    .map(|arg| swapped(arg, &schema, &mut swapped_here))
                    .collect();
                let new = match swapped_here {
                    true => function.with_new_expressions(args, all.order_by_exprs),
                    false => None,
                };
                changed |= new.is_some();
                exprs.push(new.map_or_else(|| function.clone(), Arc::new));
            }
            return match changed {
                true => Ok(Some(Arc::new(aggregate.with_new_aggr_exprs(exprs)))),
                false => Ok(None),
            };
        }
        Ok(None)
    }
}

/// `expr` with each `Decimal128` arithmetic operation (over `schema`) a [`DecimalArithmetic`];
/// sets `changed` if any was. An expression whose types cannot be worked out stays as it is.
fn swapped(
    expr: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    changed: &mut bool,
) -> Arc<dyn PhysicalExpr> {
    let rewritten = expr.clone().transform_up(|e| {
        let Some(binary) = e.downcast_ref::<BinaryExpr>() else {
            return Ok(Transformed::no(e));
        };
        if !binary.op().is_numerical_operators() {
            return Ok(Transformed::no(e));
        }
        let types = (binary.left().data_type(schema))
            .and_then(|l| Ok((l, binary.right().data_type(schema)?, e.data_type(schema)?)));
        match types {
            Ok((
                DataType::Decimal128(..),
                DataType::Decimal128(..),
                result @ DataType::Decimal128(..),
            )) => Ok(Transformed::yes(Arc::new(DecimalArithmetic::new(
                binary.left().clone(),
                *binary.op(),
                binary.right().clone(),
                result,
            )) as Arc<dyn PhysicalExpr>)),
            _ => Ok(Transformed::no(e)),
        }
    });
    match rewritten {
        Ok(t) => {
            *changed |= t.transformed;
            t.data
        }
        Err(_) => expr.clone(),
    }
}

impl PhysicalOptimizerRule for DecimalArithmeticRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| match Self::rewrite(&node)? {
            Some(new) => Ok(Transformed::yes(new)),
            None => Ok(Transformed::no(node)),
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}
