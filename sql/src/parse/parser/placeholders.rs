//! `?` placeholders numbered `$1, $2, ...` in the order they appear (JDBC and ADBC send `?`,
//! DataFusion binds `$n`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, Expr, Value, ValueWithSpan, VisitMut,
};

use datafusion::sql::sqlparser::tokenizer::Location;

/// JDBC and ADBC send `?` placeholders; DataFusion binds `$1`, `$2`, ...: each `?` is numbered
/// by its place in the text, and `?n` is `$n`.
pub(crate) fn number_placeholders<V: VisitMut>(node: &mut V) {
    fn placeholder(expr: &mut Expr) -> Option<(&mut String, Location)> {
        match expr {
            Expr::Value(ValueWithSpan {
                value: Value::Placeholder(p),
                span,
            }) => Some((p, span.start)),
            _ => None,
        }
    }
    let mut positions = Vec::new();
    let _ = visit_expressions_mut(node, |expr| {
        if let Some((p, at)) = placeholder(expr) {
            if p == "?" {
                positions.push(at);
            }
        }
        ControlFlow::<()>::Continue(())
    });
    positions.sort();
    let _ = visit_expressions_mut(node, |expr| {
        if let Some((p, at)) = placeholder(expr) {
            if p == "?" {
                let n = positions.partition_point(|&other| other < at) + 1;
                *p = format!("${n}");
            } else if let Some(n) = p.strip_prefix('?') {
                *p = format!("${n}");
            }
        }
        ControlFlow::<()>::Continue(())
    });
}
