//! How deep a statement may nest: sqlparser builds long chains of operators without
//! recursing, but every walk after it recurses, so a statement nested deeper than
//! [`MAX_EXPRESSION_DEPTH`] (or with queries deeper than [`MAX_QUERY_DEPTH`]) is refused before
//! anything walks it.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Visit, Visitor};

/// Most levels of expressions and queries nested in one another in a statement.
pub const MAX_EXPRESSION_DEPTH: usize = 512;

/// Most queries nested in one another in a statement (the statement's own query, subqueries,
/// derived tables): DataFusion's checks of a plan take time exponential in it (23 levels of
/// scalar subqueries took 11 s to plan, each level more doubles that).
pub const MAX_QUERY_DEPTH: usize = 16;

/// What a statement nests too deeply.
pub(crate) enum TooDeep {
    /// Expressions and queries together, beyond [`MAX_EXPRESSION_DEPTH`].
    Expressions,
    /// Queries, beyond [`MAX_QUERY_DEPTH`].
    Queries,
}

/// What `node` nests too deeply, if anything. The walk stops at the first excess, so its own
/// recursion is bounded.
pub(crate) fn too_deep<V: Visit>(node: &V) -> Option<TooDeep> {
    #[derive(Default)]
    struct Depth {
        all: usize,
        queries: usize,
    }
    impl Depth {
        fn enter(&mut self) -> ControlFlow<TooDeep> {
            self.all += 1;
            match self.all > MAX_EXPRESSION_DEPTH {
                true => ControlFlow::Break(TooDeep::Expressions),
                false => ControlFlow::Continue(()),
            }
        }
        fn leave(&mut self) -> ControlFlow<TooDeep> {
            self.all -= 1;
            ControlFlow::Continue(())
        }
    }
    impl Visitor for Depth {
        type Break = TooDeep;
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<TooDeep> {
            self.enter()
        }
        fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<TooDeep> {
            self.leave()
        }
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<TooDeep> {
            // UNION / INTERSECT / EXCEPT chains nest too, in the query's body, which the
            // visitor would follow recursively before reaching an expression.
            if set_operation_depth(&query.body) > MAX_EXPRESSION_DEPTH {
                return ControlFlow::Break(TooDeep::Expressions);
            }
            self.queries += 1;
            if self.queries > MAX_QUERY_DEPTH {
                return ControlFlow::Break(TooDeep::Queries);
            }
            self.enter()
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<TooDeep> {
            self.queries -= 1;
            self.leave()
        }
    }
    // The walk recurses a few frames per level: room for MAX_EXPRESSION_DEPTH levels.
    let walk = || node.visit(&mut Depth::default()).break_value();
    stacker::maybe_grow(64 << 10, 16 << 20, walk)
}

/// How deep set operations nest in a query body (1: none), walked without recursion.
fn set_operation_depth(body: &SetExpr) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(body, 1)];
    while let Some((expr, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        if let SetExpr::SetOperation { left, right, .. } = expr {
            pending.push((left, depth + 1));
            pending.push((right, depth + 1));
        }
    }
    deepest
}
