//! A table function's argument given as a parameter, when the function needs its value while
//! the statement is planned (before any parameter has one): `tail('q', $1, 5000)`,
//! `changes('t', $1, NULL)`. In a SELECT that reads nothing but the call (no joins), the
//! parameter is replaced by a constant the function reads as "see the WHERE clause", and
//! `<column> > $n` joins the WHERE, where binding gives it its value and the function's scan
//! finds it.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, Ident, Select, TableFactor, TableWithJoins,
    Value, ValueWithSpan, VisitMut, VisitorMut,
};

use crate::parse::statement::normalize_ident;

/// Lowers `function`'s argument number `argument` where it is a parameter: `lower` is given
/// the call's arguments and says the column the condition compares and the constant that
/// replaces the parameter (None leaves the call as it is, and the function refuses the
/// parameter when it is called).
pub(crate) fn lower_parameter<V: VisitMut>(
    node: &mut V,
    function: &str,
    argument: usize,
    lower: &dyn Fn(&[FunctionArg]) -> Option<(Ident, Expr)>,
) {
    let _ = node.visit(&mut Lower {
        function,
        argument,
        lower,
    });
}

struct Lower<'a> {
    function: &'a str,
    argument: usize,
    lower: &'a dyn Fn(&[FunctionArg]) -> Option<(Ident, Expr)>,
}

impl VisitorMut for Lower<'_> {
    type Break = ();

    fn pre_visit_select(&mut self, select: &mut Select) -> ControlFlow<()> {
        if let Some(condition) = self.condition(&mut select.from) {
            select.selection = Some(match select.selection.take() {
                Some(other) => Expr::BinaryOp {
                    left: Box::new(Expr::Nested(Box::new(other))),
                    op: BinaryOperator::And,
                    right: Box::new(condition),
                },
                None => condition,
            });
        }
        ControlFlow::Continue(())
    }
}

impl Lower<'_> {
    /// For `FROM function(..., $n, ...) [AS alias]` alone: replaces `$n` and returns
    /// `<column> > $n`.
    fn condition(&self, from: &mut [TableWithJoins]) -> Option<Expr> {
        let [TableWithJoins { relation, joins }] = from else {
            return None;
        };
        let TableFactor::Table {
            name,
            alias,
            args: Some(args),
            ..
        } = relation
        else {
            return None;
        };
        let named = match name.0.as_slice() {
            [part] => part
                .as_ident()
                .is_some_and(|i| normalize_ident(i) == self.function),
            _ => false,
        };
        if !joins.is_empty() || !named || alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            return None;
        }
        let is_parameter = |arg: &FunctionArg| {
            matches!(
                arg,
                FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(ValueWithSpan {
                    value: Value::Placeholder(_),
                    ..
                })))
            )
        };
        if !args.args.get(self.argument).is_some_and(is_parameter) {
            return None;
        }
        let (column, constant) = (self.lower)(&args.args)?;
        let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(parameter))) =
            args.args.get_mut(self.argument)
        else {
            return None;
        };
        let column = match alias {
            Some(alias) => Expr::CompoundIdentifier(vec![alias.name.clone(), column]),
            None => Expr::Identifier(column),
        };
        Some(Expr::BinaryOp {
            left: Box::new(column),
            op: BinaryOperator::Gt,
            right: Box::new(std::mem::replace(parameter, constant)),
        })
    }
}
