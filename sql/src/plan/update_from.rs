//! `UPDATE t SET ... FROM s [WHERE ...]`, which DataFusion 55 does not plan: planned as
//! DataFusion plans an UPDATE, a projection of every column of `t` (kept or assigned) over `t`
//! joined with the FROM tables and filtered by WHERE, so the mutation that follows is the same
//! as for any UPDATE.

use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use datafusion::sql::sqlparser::ast::{
    AssignmentTarget, Ident, TableFactor, Update, UpdateTableFromKind,
};

use crate::functions::as_of;
use crate::parse::parser::NyalaParser;
use crate::parse::statement::{normalize_ident, object_name, NyalaStatement};
use crate::session::Session;
use crate::{Result, SqlError};

impl Session {
    /// `UPDATE t SET ... FROM s [WHERE ...]` as DataFusion plans an UPDATE: a projection of
    /// every column of `t`, kept or assigned, over `t` joined with `s` and filtered by WHERE.
    pub(crate) async fn plan_update_from(&self, mut update: Update) -> Result<LogicalPlan> {
        as_of::lower(&mut update)?;
        if update.returning.is_some() || update.limit.is_some() || !update.order_by.is_empty() {
            return Err(SqlError::NotSupported(
                "RETURNING, ORDER BY or LIMIT in UPDATE".into(),
            ));
        }
        let TableFactor::Table {
            name: table_name,
            alias,
            ..
        } = &update.table.relation
        else {
            return Err(SqlError::Invalid("UPDATE needs a table to update".into()));
        };
        let name = object_name(table_name)?;
        let table = self.db.client.table(&name)?;
        let qualifier = match alias {
            Some(alias) => alias.name.clone(),
            None => Ident::with_quote('"', &name),
        };
        let mut assigned = std::collections::HashMap::new();
        for assignment in &update.assignments {
            let AssignmentTarget::ColumnName(target) = &assignment.target else {
                return Err(SqlError::NotSupported("tuple assignment in UPDATE".into()));
            };
            let column = target
                .0
                .last()
                .and_then(|part| part.as_ident())
                .map(normalize_ident)
                .unwrap_or_default();
            if table.schema.column_index(&column).is_none() {
                return Err(SqlError::Invalid(format!(
                    "table '{name}' has no column '{column}'"
                )));
            }
            if assigned.insert(column.clone(), &assignment.value).is_some() {
                return Err(SqlError::Invalid(format!(
                    "column '{column}' is assigned twice"
                )));
            }
        }
        let columns: Vec<String> = table
            .schema
            .columns()
            .iter()
            .map(|c| {
                let column = Ident::with_quote('"', &c.name);
                match assigned.get(&c.name) {
                    Some(value) => format!("{value} AS {column}"),
                    None => format!("{qualifier}.{column} AS {column}"),
                }
            })
            .collect();
        let from = match &update.from {
            Some(UpdateTableFromKind::BeforeSet(from) | UpdateTableFromKind::AfterSet(from)) => {
                from.iter().map(ToString::to_string).collect::<Vec<_>>()
            }
            None => vec![],
        };
        let mut sql = format!(
            "SELECT {} FROM {}",
            columns.join(", "),
            std::iter::once(update.table.to_string())
                .chain(from)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(selection) = &update.selection {
            sql.push_str(&format!(" WHERE {selection}"));
        }
        self.plan_dml_of(&name, WriteOp::Update, &sql).await
    }

    /// The plan of `sql`, an `UPDATE ... FROM` Nyala wrote (ON CONFLICT's, MERGE's).
    pub(crate) async fn plan_update_from_sql(&self, sql: &str) -> Result<LogicalPlan> {
        let NyalaStatement::UpdateFrom { update, .. } = NyalaParser::parse_sql(sql)? else {
            return Err(SqlError::Invalid(format!("cannot plan {sql}")));
        };
        self.plan_update_from(*update).await
    }

    /// The DML `op` on table `name` of the rows the query `sql` yields: whole rows of the
    /// table, as DataFusion's plan of an UPDATE or DELETE reads them.
    pub(crate) async fn plan_dml_of(
        &self,
        name: &str,
        op: WriteOp,
        sql: &str,
    ) -> Result<LogicalPlan> {
        let input = self.plan_sql(sql).await?;
        let target = provider_as_source(self.ctx.table_provider(name).await?);
        Ok(LogicalPlan::Dml(DmlStatement::new(
            TableReference::bare(name),
            target,
            op,
            Arc::new(input),
        )))
    }
}
