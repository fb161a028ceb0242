//! `INSERT ... ON CONFLICT [(key)] DO NOTHING | DO UPDATE SET ... [WHERE ...]`, PostgreSQL's
//! upsert, in the terms Nyala already has: DO NOTHING is INSERT IGNORE; DO UPDATE is an
//! `UPDATE t SET ... FROM (<the INSERT's rows>) AS excluded (<its columns>) WHERE <the keys
//! match> [AND <condition>]` of the rows whose key exists, then the INSERT of the rows whose key
//! does not (`WHERE NOT EXISTS`), both in one transaction (the session's, or one of the
//! statement's own), so the statement is atomic and an existing row is changed from the listed
//! expressions only, as UPDATE changes it. In a transaction DO NOTHING is that INSERT too
//! (INSERT IGNORE runs outside transactions only). `UPSERT INTO t (k, a) ...` naming only
//! some columns is `ON CONFLICT (k) DO UPDATE SET a = EXCLUDED.a`.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Assignment, AssignmentTarget, DoUpdate, Expr, Ident, ObjectName, Query, Statement, TableObject,
    VisitMut, VisitorMut,
};

use crate::parse::statement::{normalize_ident, object_name, OnConflictSpec};
use crate::plan::dml;
use crate::plan::planned::StatementKind;
use crate::plan::planner::Draft;
use crate::plan::steps::Step;
use crate::session::Session;
use crate::{Result, SqlError};

impl Session {
    /// `UPSERT INTO t (k, a, ...) ...` naming only some of the table's columns: an `INSERT ...
    /// ON CONFLICT (key) DO UPDATE` of the columns it names (Doris' partial column update), so
    /// an existing row keeps the others. None for every other statement (an UPSERT of whole
    /// rows replaces them).
    pub(crate) fn partial_upsert(&self, statement: &Statement) -> Option<OnConflictSpec> {
        let Statement::Insert(insert) = statement else {
            return None;
        };
        let TableObject::TableName(name) = &insert.table else {
            return None;
        };
        if !insert.replace_into || insert.columns.is_empty() {
            return None;
        }
        let table = self.db.client.table(&object_name(name).ok()?).ok()?;
        let schema = &table.schema;
        if schema.auto_increment_column().is_some() || schema.position_column().is_some() {
            return None; // refused as UPSERT, with its own error
        }
        let listed = column_names(&insert.columns);
        if schema.columns().iter().all(|c| listed.contains(&c.name)) {
            return None;
        }
        let assignments: Vec<Assignment> = (listed.iter())
            .filter(|c| {
                schema
                    .column_index(c)
                    .is_some_and(|i| !schema.is_key_column(i))
            })
            .map(|c| Assignment {
                target: AssignmentTarget::ColumnName(ObjectName::from(vec![Ident::with_quote(
                    '"', c,
                )])),
                value: Expr::CompoundIdentifier(vec![
                    Ident::new("excluded"),
                    Ident::with_quote('"', c),
                ]),
            })
            .collect();
        let mut insert = insert.clone();
        insert.replace_into = false;
        Some(OnConflictSpec {
            insert: Box::new(insert),
            target: None,
            update: (!assignments.is_empty()).then_some(DoUpdate {
                assignments,
                selection: None,
            }),
        })
    }

    /// The plans of an INSERT ... ON CONFLICT, in the order they run.
    pub(crate) async fn draft_on_conflict(&self, spec: OnConflictSpec) -> Result<Draft> {
        let OnConflictSpec {
            insert,
            target,
            update,
        } = spec;
        let TableObject::TableName(table_name) = &insert.table else {
            return Err(SqlError::NotSupported(
                "ON CONFLICT into a table function".into(),
            ));
        };
        let name = object_name(table_name)?;
        let table = self.db.client.table(&name)?;
        let schema = &table.schema;
        if schema.auto_increment_column().is_some() || schema.position_column().is_some() {
            return Err(SqlError::NotSupported(format!(
                "ON CONFLICT into '{name}', whose key the database assigns: no inserted row can \
                 conflict"
            )));
        }
        let column = |i: &usize| schema.columns()[*i].name.clone();
        let key: Vec<String> = schema.key_columns().iter().map(column).collect();
        if let Some(target) = &target {
            let mut sorted = target.clone();
            sorted.sort();
            let mut expected = key.clone();
            expected.sort();
            if sorted != expected {
                return Err(SqlError::Invalid(format!(
                    "ON CONFLICT ({}) must name the primary key of '{name}', ({}): it is the \
                     table's one unique constraint",
                    target.join(", "),
                    key.join(", ")
                )));
            }
        }
        let columns: Vec<String> = match insert.columns.is_empty() {
            true => (0..schema.columns().len()).map(|i| column(&i)).collect(),
            false => column_names(&insert.columns),
        };
        if let Some(missing) = key.iter().find(|k| !columns.contains(k)) {
            return Err(SqlError::Invalid(format!(
                "INSERT ... ON CONFLICT needs the primary key column '{missing}' among the \
                 inserted columns"
            )));
        }
        let Some(source) = &insert.source else {
            return Err(SqlError::Invalid(
                "INSERT ... ON CONFLICT needs rows".into(),
            ));
        };
        if update.is_none() && !self.in_transaction() {
            let statement = Box::new(Statement::Insert(insert.as_ref().clone()));
            return Ok(Draft::Logical {
                kind: StatementKind::Dml,
                plan: dml::plan_insert_ignore(self.logical_plan(statement).await?)?,
            });
        }
        let quoted = |c: &String| Ident::with_quote('"', c).to_string();
        let t = quoted(&name);
        // `<table>.k1 = excluded.k1 AND ...`
        let same_key = |table: &str| {
            (key.iter())
                .map(|k| format!("{table}.{k} = excluded.{k}", k = quoted(k)))
                .collect::<Vec<_>>()
                .join(" AND ")
        };
        // The rows whose key is not there yet (in a transaction: as it sees the table).
        let excluded: Vec<String> = columns.iter().map(quoted).collect();
        let excluded = format!("({source}) AS excluded ({})", excluded.join(", "));
        let insert_new = format!(
            "INSERT INTO {t} ({}) SELECT * FROM {excluded} WHERE NOT EXISTS \
             (SELECT 1 FROM {t} AS existing WHERE {})",
            columns.iter().map(quoted).collect::<Vec<_>>().join(", "),
            same_key("existing")
        );
        let insert_new = self.plan_sql(&insert_new).await?;
        let Some(update) = update else {
            return Ok(Draft::Logical {
                kind: StatementKind::Dml,
                plan: insert_new,
            });
        };
        // A column named alone is the existing row's, as in PostgreSQL (`qty + EXCLUDED.qty`).
        let mut update = update;
        let mut existing = ExistingRow {
            table: Ident::with_quote('"', &name),
            columns: (0..schema.columns().len()).map(|i| column(&i)).collect(),
            depth: 0,
        };
        let _ = VisitMut::visit(&mut update, &mut existing);
        let mut filter = same_key(&t);
        if let Some(condition) = &update.selection {
            filter = format!("{filter} AND ({condition})");
        }
        let assignments: Vec<String> = update.assignments.iter().map(|a| a.to_string()).collect();
        let sql = format!(
            "UPDATE {t} SET {} FROM {excluded} WHERE {filter}",
            assignments.join(", ")
        );
        let update = self.plan_update_from_sql(&sql).await?;
        Ok(Draft::Steps(vec![
            Step::Change(update),
            Step::Change(insert_new),
        ]))
    }
}

/// The column names of an INSERT's column list.
fn column_names(columns: &[ObjectName]) -> Vec<String> {
    (columns.iter())
        .map(|c| c.0.last().and_then(|p| p.as_ident()).map(normalize_ident))
        .map(Option::unwrap_or_default)
        .collect()
}

/// Qualifies the table's columns named alone in DO UPDATE's expressions (outside subqueries)
/// with the table's name: they are the existing row's.
struct ExistingRow {
    table: Ident,
    columns: Vec<String>,
    /// Subqueries entered.
    depth: usize,
}

impl VisitorMut for ExistingRow {
    type Break = ();

    fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Identifier(ident) = expr {
            if self.depth == 0 && self.columns.contains(&normalize_ident(ident)) {
                *expr = Expr::CompoundIdentifier(vec![self.table.clone(), ident.clone()]);
            }
        }
        ControlFlow::Continue(())
    }
}
