//! What PostgreSQL clients read about the database: `pg_catalog` (its tables and functions,
//! from `datafusion-pg-catalog`) in every PostgreSQL session, and the statements clients send
//! to read it (psql's `\d` family, drivers' metadata calls) rewritten into SQL the engine plans:
//! `OPERATOR(pg_catalog.~)`, `'t'::regclass`, `COLLATE`, qualified function calls, ...

use std::ops::ControlFlow;
use std::sync::{Arc, LazyLock};

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{create_udf, ColumnarValue, ScalarUDF, Volatility};
use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, Expr, Function, FunctionArgumentList, FunctionArguments, Ident,
    ObjectName, Statement,
};
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use nyala_server::ClientSession;

/// Installs `pg_catalog` in `session`'s catalog, and `version()` as PostgreSQL's (clients
/// such as SQLAlchemy read the server's version from it).
pub(crate) fn install(session: &ClientSession) {
    let context = session.sql().context();
    if let Err(e) = datafusion_pg_catalog::setup_pg_catalog(
        context,
        nyala_sql::CATALOG_NAME,
        EmptyContextProvider,
    ) {
        tracing::warn!(error = %e, "pg_catalog is not available in a PostgreSQL session");
    }
    context.register_udf(version_udf());
    context.register_udf(type_is_visible_udf());
}

/// `pg_type_is_visible(oid)`: every type is (Nyala has one schema; clients list domains with
/// it, of which there are none).
fn type_is_visible_udf() -> ScalarUDF {
    let visible = |args: &[ColumnarValue]| {
        let rows = match args.first() {
            Some(ColumnarValue::Array(array)) => array.len(),
            _ => return Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true)))),
        };
        let all = arrow::array::BooleanArray::from(vec![true; rows]);
        Ok(ColumnarValue::Array(Arc::new(all)))
    };
    create_udf(
        "pg_type_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(visible),
    )
}

/// What `version()` says to PostgreSQL clients.
pub(crate) const VERSION: &str = concat!(
    "PostgreSQL 16.6 (Nyala ",
    env!("CARGO_PKG_VERSION"),
    ") on x86_64-pc-linux-gnu"
);

fn version_udf() -> ScalarUDF {
    let version = |_: &[ColumnarValue]| {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            VERSION.into(),
        ))))
    };
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(version),
    )
}

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
        name_functions(statement);
    }
    let texts: Vec<String> = statements.iter().map(ToString::to_string).collect();
    Some(texts.join(";\n"))
}

/// SQL's value functions written without parentheses (`current_catalog`, `current_schema`)
/// as the functions the engine has.
fn name_functions(statement: &mut Statement) {
    let _ = visit_expressions_mut(statement, |expr| {
        if let Expr::Identifier(ident) = expr {
            let function = match ident.value.to_ascii_lowercase().as_str() {
                "current_catalog" => Some("current_database"),
                "current_schema" if ident.quote_style.is_none() => Some("current_schema"),
                _ => None,
            };
            if let Some(function) = function {
                *expr = call(function);
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

/// `name()`.
fn call(name: &str) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![],
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
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
}
