//! PostgreSQL's reading of a quoted literal compared with a boolean column: in
//! `indisprimary = 'f'` (as SQLAlchemy writes it) the literal is a boolean, where the engine
//! finds no common type for a boolean and a string.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::expr::BinaryExpr;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{Expr, ExprSchemable, Operator};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::BinaryOperator;

/// Plans `boolean = 'literal'` (and `<>`) in `context` as PostgreSQL does.
pub(super) fn install(context: &SessionContext) {
    let state = context.state_ref();
    let registered = state
        .write()
        .register_expr_planner(Arc::new(QuotedBooleans));
    if let Err(e) = registered {
        tracing::warn!(error = %e, "booleans compared with quoted literals will not plan");
    }
}

#[derive(Debug)]
struct QuotedBooleans;

impl ExprPlanner for QuotedBooleans {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let op = match expr.op {
            BinaryOperator::Eq => Operator::Eq,
            BinaryOperator::NotEq => Operator::NotEq,
            _ => return Ok(PlannerResult::Original(expr)),
        };
        let is_boolean = |side: &Expr| matches!(side.get_type(schema), Ok(DataType::Boolean));
        let planned = if is_boolean(&expr.left) {
            as_boolean(&expr.right).map(|right| (expr.left.clone(), right))
        } else if is_boolean(&expr.right) {
            as_boolean(&expr.left).map(|left| (left, expr.right.clone()))
        } else {
            None
        };
        Ok(match planned {
            Some((left, right)) => PlannerResult::Planned(Expr::BinaryExpr(BinaryExpr::new(
                Box::new(left),
                op,
                Box::new(right),
            ))),
            None => PlannerResult::Original(expr),
        })
    }
}

/// The boolean a quoted literal spells as PostgreSQL reads it (`t`, `f`, `true`, `no`, `on`,
/// `1`, ...); None for anything else.
fn as_boolean(expr: &Expr) -> Option<Expr> {
    let Expr::Literal(ScalarValue::Utf8(Some(text)), _) = expr else {
        return None;
    };
    let value = match text.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => true,
        "f" | "false" | "n" | "no" | "off" | "0" => false,
        _ => return None,
    };
    Some(Expr::Literal(ScalarValue::Boolean(Some(value)), None))
}
