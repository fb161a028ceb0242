//! The statements clients send to read PostgreSQL's catalog (psql's `\d` family, drivers'
//! metadata calls), rewritten into SQL the engine plans: first by `datafusion-pg-catalog`'s
//! rules (`OPERATOR(pg_catalog.~)`, `'t'::regclass`, `COLLATE`, ...), then by Nyala's for
//! what those leave out:
//! - `current_catalog` and `current_schema` written without parentheses;
//! - a scalar subquery's value as `first_value(...)`: the engine plans a correlated one only
//!   if it is aggregated, where PostgreSQL fails if it returns more than one row (catalog
//!   queries' return one);
//! - `pg_table_is_visible(oid)`: whether the relation is in a schema of the search path
//!   (`public`, `pg_catalog`), where the library's says all are;
//! - `to_regtype(name)` and `to_regclass(name)`, as a scalar subquery of the catalog;
//! - set-returning functions in a select list: `information_schema._pg_expandarray(a)` and
//!   `generate_subscripts(a, 1)`, as `unnest` of a list;
//! - a composite's field, `(row).field`, as `get_field(row, 'field')`;
//! - subscripts of `indkey`, an `int2vector` (numbered from 0, where the engine's lists are
//!   numbered from 1).

use std::ops::ControlFlow;
use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, AccessExpr, BinaryOperator, Expr, Function, FunctionArg,
    FunctionArgExpr, FunctionArgumentList, FunctionArguments, GroupByExpr, Ident, ObjectName,
    SelectItem, SetExpr, Subscript, Value,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

/// `sql` as the engine plans it, where it reads PostgreSQL's catalog in PostgreSQL's own
/// dialect; None where it is Nyala's SQL as it stands.
pub(crate) fn rewritten(sql: &str) -> Option<String> {
    static PARSER: LazyLock<PostgresCompatibilityParser> =
        LazyLock::new(PostgresCompatibilityParser::new);
    if !reads_the_catalog(sql) {
        return None;
    }
    let mut statements = PARSER.parse(sql).ok()?;
    for statement in &mut statements {
        let _ = visit_expressions_mut(statement, |expr| {
            if let Some(rewritten) = rewritten_expr(expr) {
                *expr = rewritten;
            }
            ControlFlow::<()>::Continue(())
        });
    }
    let texts: Vec<String> = statements.iter().map(ToString::to_string).collect();
    Some(texts.join(";\n"))
}

/// What the engine plans for `expr` (whose parts are already rewritten), if it differs.
fn rewritten_expr(expr: &Expr) -> Option<Expr> {
    match expr {
        Expr::Identifier(ident) => match ident.value.to_ascii_lowercase().as_str() {
            "current_catalog" => Some(call("current_database", vec![])),
            "current_schema" if ident.quote_style.is_none() => Some(call("current_schema", vec![])),
            _ => None,
        },
        Expr::Subquery(query) => {
            let mut query = query.clone();
            let SetExpr::Select(select) = query.body.as_mut() else {
                return None;
            };
            let [item] = select.projection.as_mut_slice() else {
                return None;
            };
            let (SelectItem::UnnamedExpr(value) | SelectItem::ExprWithAlias { expr: value, .. }) =
                item
            else {
                return None;
            };
            let grouped =
                !matches!(&select.group_by, GroupByExpr::Expressions(keys, _) if keys.is_empty());
            if grouped || is_aggregate(value) || query.limit_clause.is_some() {
                return None;
            }
            *value = call("first_value", vec![value.clone()]);
            Some(Expr::Subquery(query))
        }
        Expr::BinaryOp {
            left,
            op: BinaryOperator::PGCustomBinaryOperator(parts),
            right,
        } => Some(Expr::BinaryOp {
            left: left.clone(),
            op: builtin_operator(parts.last()?)?,
            right: right.clone(),
        }),
        Expr::Function(function) => {
            let name = function
                .name
                .0
                .last()?
                .as_ident()?
                .value
                .to_ascii_lowercase();
            let args = plain_args(function)?;
            match (name.as_str(), args.as_slice()) {
                ("_pg_expandarray", [array]) => Some(call(
                    "unnest",
                    vec![call("pg_expandarray", vec![array.clone()])],
                )),
                ("pg_table_is_visible", [oid]) => parsed(&format!(
                    "{oid} IN (SELECT c.oid FROM pg_catalog.pg_class c \
                     JOIN pg_catalog.pg_namespace n ON c.relnamespace = n.oid \
                     WHERE n.nspname IN ('{}', 'pg_catalog'))",
                    nyala_sql::SCHEMA_NAME
                )),
                ("to_regtype", [name]) => parsed(&format!(
                    "(SELECT oid FROM pg_catalog.pg_type WHERE typname = {name})"
                )),
                ("to_regclass", [name]) => parsed(&format!(
                    "(SELECT oid FROM pg_catalog.pg_class WHERE relname = {name})"
                )),
                ("generate_subscripts", [array, _dimension]) => parsed(&format!(
                    "unnest(range(1, CAST(array_length({array}) AS BIGINT) + 1))"
                )),
                _ => None,
            }
        }
        Expr::CompoundFieldAccess { root, access_chain } => {
            if let (Expr::Nested(row), Some((AccessExpr::Dot(Expr::Identifier(field)), rest))) =
                (root.as_ref(), access_chain.split_first())
            {
                let field = Expr::value(Value::SingleQuotedString(field.value.clone()));
                let accessed = call("get_field", vec![row.as_ref().clone(), field]);
                return Some(match rest {
                    [] => accessed,
                    rest => Expr::CompoundFieldAccess {
                        root: Box::new(accessed),
                        access_chain: rest.to_vec(),
                    },
                });
            }
            let mut chain = access_chain.clone();
            let mut changed = false;
            for at in 0..chain.len() {
                let of_int2vector = match at {
                    0 => is_int2vector(root),
                    _ => matches!(&chain[at - 1], AccessExpr::Dot(name) if is_int2vector(name)),
                };
                if let (true, AccessExpr::Subscript(Subscript::Index { index })) =
                    (of_int2vector, &mut chain[at])
                {
                    *index = Expr::BinaryOp {
                        left: Box::new(Expr::Nested(Box::new(index.clone()))),
                        op: BinaryOperator::Plus,
                        right: Box::new(number(1)),
                    };
                    changed = true;
                }
            }
            changed.then(|| Expr::CompoundFieldAccess {
                root: root.clone(),
                access_chain: chain,
            })
        }
        _ => None,
    }
}

/// Whether `expr` is a call of an aggregate function (of those catalog queries use).
fn is_aggregate(expr: &Expr) -> bool {
    let Expr::Function(function) = expr else {
        return false;
    };
    let name = function.name.0.last().and_then(|part| part.as_ident());
    name.is_some_and(|name| {
        let aggregates = [
            "count",
            "sum",
            "min",
            "max",
            "avg",
            "array_agg",
            "string_agg",
            "bool_and",
            "bool_or",
            "every",
            "json_agg",
            "jsonb_agg",
            "first_value",
        ];
        aggregates.contains(&name.value.to_ascii_lowercase().as_str())
    })
}

/// The operator `OPERATOR(pg_catalog.symbol)` names, as the engine writes it.
fn builtin_operator(symbol: &str) -> Option<BinaryOperator> {
    Some(match symbol {
        "=" => BinaryOperator::Eq,
        "<>" | "!=" => BinaryOperator::NotEq,
        "<" => BinaryOperator::Lt,
        "<=" => BinaryOperator::LtEq,
        ">" => BinaryOperator::Gt,
        ">=" => BinaryOperator::GtEq,
        "~" => BinaryOperator::PGRegexMatch,
        "~*" => BinaryOperator::PGRegexIMatch,
        "!~" => BinaryOperator::PGRegexNotMatch,
        "!~*" => BinaryOperator::PGRegexNotIMatch,
        "||" => BinaryOperator::StringConcat,
        _ => return None,
    })
}

/// Whether `expr` names a column of type `int2vector`, whose subscripts start at 0.
fn is_int2vector(expr: &Expr) -> bool {
    let column = match expr {
        Expr::Identifier(ident) => ident,
        Expr::CompoundIdentifier(idents) => match idents.last() {
            Some(ident) => ident,
            None => return false,
        },
        _ => return false,
    };
    ["indkey", "indoption"].contains(&column.value.to_ascii_lowercase().as_str())
}

/// The arguments of a call written `f(a, b)`, without named arguments or clauses.
fn plain_args(function: &Function) -> Option<Vec<Expr>> {
    let FunctionArguments::List(list) = &function.args else {
        return None;
    };
    if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
        return None;
    }
    let arg = |arg: &FunctionArg| match arg {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) => Some(expr.clone()),
        _ => None,
    };
    list.args.iter().map(arg).collect()
}

/// `name(args)`.
fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: (args.into_iter())
                .map(|arg| FunctionArg::Unnamed(FunctionArgExpr::Expr(arg)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// The expression `text` (which this module writes).
fn parsed(text: &str) -> Option<Expr> {
    let mut parser = Parser::new(&PostgreSqlDialect {}).try_with_sql(text).ok()?;
    parser.parse_expr().ok()
}

fn number(n: i64) -> Expr {
    Expr::value(Value::Number(n.to_string(), false))
}

/// Whether `sql` reads PostgreSQL's catalog (or casts to its object types).
fn reads_the_catalog(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    [
        "pg_",
        "information_schema",
        "::reg",
        "current_schema",
        "current_catalog",
        "version()",
    ]
    .iter()
    .any(|marker| lower.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psql_catalog_queries_are_rewritten_and_others_are_not() {
        assert_eq!(rewritten("SELECT * FROM t WHERE k = 1"), None);
        let psql = "SELECT c.relname FROM pg_catalog.pg_class c \
                    WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default";
        let rewritten = rewritten(psql).expect("a catalog query");
        assert!(!rewritten.contains("OPERATOR"), "{rewritten}");
        assert!(!rewritten.contains("COLLATE"), "{rewritten}");
        let pgjdbc = "SELECT current_catalog AS c FROM pg_catalog.pg_namespace";
        assert!(super::rewritten(pgjdbc)
            .unwrap()
            .contains("current_database()"));
    }

    #[test]
    fn set_returning_functions_and_fields_of_rows_become_unnest_and_get_field() {
        let pgjdbc = "SELECT (i.keys).n AS key_seq FROM (SELECT \
                      information_schema._pg_expandarray(i.indkey) AS keys \
                      FROM pg_catalog.pg_index i) i WHERE (i.keys).x = 1";
        let sql = rewritten(pgjdbc).unwrap();
        assert!(sql.contains("unnest(pg_expandarray(i.indkey))"), "{sql}");
        assert!(sql.contains("get_field(i.keys, 'n')"), "{sql}");
        assert!(sql.contains("get_field(i.keys, 'x')"), "{sql}");
        let sqlalchemy = "SELECT generate_subscripts(ix.indkey, 1) ord FROM pg_index ix";
        let sql = rewritten(sqlalchemy).unwrap();
        assert!(
            sql.contains("unnest(range(1, CAST(array_length(ix.indkey) AS BIGINT) + 1))"),
            "{sql}"
        );
        let odbc = "SELECT 1 FROM pg_catalog.pg_index i WHERE i.indkey[ia.attnum - 1] = 1";
        let sql = rewritten(odbc).unwrap();
        assert!(sql.contains("i.indkey[(ia.attnum - 1) + 1]"), "{sql}");
        let odbc = "SELECT 1 FROM pg_catalog.pg_index i, pg_catalog.pg_class c \
                    WHERE i.indexrelid OPERATOR(pg_catalog.=) c.oid";
        let sql = rewritten(odbc).unwrap();
        assert!(sql.contains("i.indexrelid = c.oid"), "{sql}");
    }
}
