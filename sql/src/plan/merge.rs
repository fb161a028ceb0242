//! `MERGE INTO t USING source ON condition WHEN [NOT] MATCHED [BY SOURCE | BY TARGET]
//! [AND condition] THEN UPDATE SET ... | DELETE | INSERT [(columns)] VALUES (...)`, in the terms
//! Nyala already has, as steps of one transaction (the session's, or one of the statement's
//! own), so it is atomic:
//!
//! 1. the source joined with the target once (a LEFT JOIN, or a FULL JOIN when a clause acts on
//!    target rows no source row matches), each row given the number of the first clause that
//!    applies to it and the target row's key, kept in memory ([`StagedRows`]);
//! 2. refused if two source rows match one target row (the SQL standard's cardinality
//!    violation: which would win?);
//! 3. an UPDATE ... FROM or a DELETE of the target rows of each UPDATE or DELETE clause, joined
//!    with their staged rows by key, then an INSERT ... SELECT of the staged rows of each INSERT
//!    clause.
//!
//! Every step reads the staged rows, not the target again, so the clauses see the target as it
//! was before the statement: a row an UPDATE changed is not taken by a later clause.

use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, WriteOp};
use datafusion::sql::sqlparser::ast::{
    Ident, Merge, MergeAction, MergeClause, MergeClauseKind, MergeInsertKind, TableFactor, Value,
};

use crate::exec::staged::StagedRows;
use crate::parse::statement::object_name;
use crate::plan::planner::Draft;
use crate::plan::steps::Step;
use crate::session::Session;
use crate::{Result, SqlError};

/// The name the steps read the staged rows by.
const STAGED: &str = "__nyala_merge_rows";
/// The staged column holding the number of the clause a row takes (from 1).
const CLAUSE: &str = "__nyala_clause";
/// The staged columns holding the matched target row's key (`__nyala_key_0`, ...).
const KEY: &str = "__nyala_key_";
/// A column added to the source when target rows without a source row count: TRUE in the
/// source's rows, NULL in the FULL JOIN's rows of the target alone.
const IN_SOURCE: &str = "__nyala_in_source";

impl Session {
    /// The steps of a MERGE, in the order they run.
    pub(crate) async fn draft_merge(&self, merge: Merge) -> Result<Draft> {
        if merge.output.is_some() {
            return Err(SqlError::NotSupported("OUTPUT in MERGE".into()));
        }
        let TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } = &merge.table
        else {
            return Err(SqlError::Invalid("MERGE INTO needs a table".into()));
        };
        let name = object_name(name)?;
        let table = self.db.client.table(&name)?;
        let schema = &table.schema;
        let quoted = |c: &str| Ident::with_quote('"', c).to_string();
        let key: Vec<String> = (schema.key_columns().iter())
            .map(|&i| quoted(&schema.columns()[i].name))
            .collect();
        // How the clauses name the target and the source.
        let target = match alias {
            Some(alias) => alias.name.to_string(),
            None => quoted(&name),
        };
        let source = source_name(&merge.source)?;
        check_reachable(&merge.clauses)?;
        let by_source =
            (merge.clauses.iter()).any(|c| c.clause_kind == MergeClauseKind::NotMatchedBySource);

        // 1. The source joined with the target, each row numbered with the clause it takes.
        let in_target = format!("{target}.{} IS NOT NULL", key[0]);
        let in_source = match by_source {
            true => format!("{source}.{IN_SOURCE} IS NOT NULL"),
            false => "TRUE".to_string(),
        };
        let mut cases = Vec::with_capacity(merge.clauses.len());
        for (i, clause) in merge.clauses.iter().enumerate() {
            let when = match clause.clause_kind {
                MergeClauseKind::Matched => format!("{in_target} AND {in_source}"),
                MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget => {
                    format!("NOT ({in_target})")
                }
                MergeClauseKind::NotMatchedBySource => format!("NOT ({in_source})"),
            };
            let when = match &clause.predicate {
                Some(predicate) => format!("{when} AND ({predicate})"),
                None => when,
            };
            cases.push(format!("WHEN {when} THEN {}", i + 1));
        }
        let keys: Vec<String> = (key.iter().enumerate())
            .map(|(i, k)| format!("{target}.{k} AS {KEY}{i}"))
            .collect();
        let (from, join) = match by_source {
            true => (
                format!(
                    "(SELECT *, TRUE AS {IN_SOURCE} FROM {}) AS {source}",
                    merge.source
                ),
                "FULL JOIN",
            ),
            false => (merge.source.to_string(), "LEFT JOIN"),
        };
        let staging_sql = format!(
            "SELECT * FROM (SELECT {source}.*, {}, CASE {} ELSE 0 END AS {CLAUSE} FROM {from} \
             {join} {} ON {}) AS __nyala_merge WHERE {CLAUSE} <> 0",
            keys.join(", "),
            cases.join(" "),
            merge.table,
            merge.on
        );
        let staging = self.plan_sql(&staging_sql).await?;
        let staged = StagedRows::new(staging.schema().as_arrow());
        // The staged rows as the later steps name them: a row of NULLs of their types, then
        // read from memory instead ([`read_staged`]).
        let rows = format!(
            "(SELECT * FROM ({}) AS {STAGED}) AS {source}",
            typed_nulls(&staged.schema())?
        );
        let mut steps = vec![Step::Stage(staging, staged.clone())];

        // 2. No target row matched by two source rows.
        let staged_keys: Vec<String> = (0..key.len()).map(|i| format!("{KEY}{i}")).collect();
        let twice = format!(
            "SELECT {keys} FROM {rows} WHERE {KEY}0 IS NOT NULL GROUP BY {keys} \
             HAVING count(*) > 1 LIMIT 1",
            keys = staged_keys.join(", ")
        );
        let error = format!(
            "more than one source row matches the row of '{name}' whose key ({}) is {{row}}: \
             MERGE would change it more than once",
            schema
                .key_columns()
                .iter()
                .map(|&i| schema.columns()[i].name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let twice = read_staged(self.plan_sql(&twice).await?, &staged)?;
        steps.push(Step::Refuse(twice, error));

        // 3. Each clause's rows changed.
        let same_key: Vec<String> = (key.iter().enumerate())
            .map(|(i, k)| format!("{target}.{k} = {source}.{KEY}{i}"))
            .collect();
        let same_key = same_key.join(" AND ");
        let mut inserts = Vec::new();
        for (i, clause) in merge.clauses.iter().enumerate() {
            let chosen = format!("{source}.{CLAUSE} = {}", i + 1);
            match &clause.action {
                MergeAction::Update(update) => {
                    if update.update_predicate.is_some() || update.delete_predicate.is_some() {
                        return Err(SqlError::NotSupported(
                            "WHERE or DELETE WHERE after a MERGE clause's UPDATE SET (write the \
                             condition after WHEN MATCHED AND ...)"
                                .into(),
                        ));
                    }
                    let assignments: Vec<String> =
                        update.assignments.iter().map(ToString::to_string).collect();
                    let sql = format!(
                        "UPDATE {} SET {} FROM {rows} WHERE {same_key} AND {chosen}",
                        merge.table,
                        assignments.join(", ")
                    );
                    let plan = self.plan_update_from_sql(&sql).await?;
                    steps.push(Step::Change(read_staged(plan, &staged)?));
                }
                MergeAction::Delete { .. } => {
                    let columns: Vec<String> = (schema.columns().iter())
                        .map(|c| format!("{target}.{c} AS {c}", c = quoted(&c.name)))
                        .collect();
                    let sql = format!(
                        "SELECT {} FROM {} JOIN {rows} ON {same_key} WHERE {chosen}",
                        columns.join(", "),
                        merge.table
                    );
                    let plan = self.plan_dml_of(&name, WriteOp::Delete, &sql).await?;
                    steps.push(Step::Change(read_staged(plan, &staged)?));
                }
                MergeAction::Insert(insert) => {
                    let MergeInsertKind::Values(values) = &insert.kind else {
                        return Err(SqlError::NotSupported(
                            "INSERT ROW in MERGE (write INSERT VALUES (...))".into(),
                        ));
                    };
                    let ([row], None) = (values.rows.as_slice(), &insert.insert_predicate) else {
                        return Err(SqlError::Invalid(
                            "a MERGE clause's INSERT takes one row of values, VALUES (...)".into(),
                        ));
                    };
                    let columns = match insert.columns.is_empty() {
                        true => String::new(),
                        false => {
                            let columns: Vec<String> =
                                insert.columns.iter().map(ToString::to_string).collect();
                            format!("({})", columns.join(", "))
                        }
                    };
                    let values: Vec<String> = row.content.iter().map(ToString::to_string).collect();
                    let sql = format!(
                        "INSERT INTO {} {columns} SELECT {} FROM {rows} WHERE {chosen}",
                        quoted(&name),
                        values.join(", ")
                    );
                    let plan = self.plan_sql(&sql).await?;
                    inserts.push(Step::Change(read_staged(plan, &staged)?));
                }
            }
        }
        steps.extend(inserts);
        Ok(Draft::Steps(steps))
    }
}

/// Refuses a clause after a clause of its kind without a condition, which takes every row the
/// later one could (as PostgreSQL does).
fn check_reachable(clauses: &[MergeClause]) -> Result<()> {
    let kind = |clause: &MergeClause| match clause.clause_kind {
        MergeClauseKind::NotMatchedByTarget => MergeClauseKind::NotMatched,
        kind => kind,
    };
    for (i, clause) in clauses.iter().enumerate() {
        let taken = clauses[..i]
            .iter()
            .find(|earlier| earlier.predicate.is_none() && kind(earlier) == kind(clause));
        if let Some(earlier) = taken {
            return Err(SqlError::Invalid(format!(
                "unreachable clause WHEN {} ...: the WHEN {} clause before it, without AND, \
                 takes every row it could",
                clause.clause_kind, earlier.clause_kind
            )));
        }
    }
    Ok(())
}

/// How a MERGE's clauses name its source: its alias, or the table's name.
fn source_name(source: &TableFactor) -> Result<String> {
    match source {
        TableFactor::Table {
            alias: Some(alias), ..
        }
        | TableFactor::Derived {
            alias: Some(alias), ..
        } => Ok(alias.name.to_string()),
        TableFactor::Table {
            name, alias: None, ..
        } => match name.0.last().and_then(|part| part.as_ident()) {
            Some(ident) => Ok(ident.to_string()),
            None => Err(SqlError::Invalid(format!(
                "MERGE ... USING {name}: not a table"
            ))),
        },
        TableFactor::Derived { alias: None, .. } => Err(SqlError::Invalid(
            "a subquery in MERGE ... USING needs an alias: USING (SELECT ...) AS s".into(),
        )),
        other => Err(SqlError::NotSupported(format!(
            "MERGE ... USING {other} (use a table, a view or a subquery)"
        ))),
    }
}

/// A query of one row of NULLs with the columns of `schema`, their names and types.
fn typed_nulls(schema: &Schema) -> Result<String> {
    let columns: Vec<String> = (schema.fields().iter())
        .map(|field| {
            let name = Ident::with_quote('"', field.name());
            let data_type = Value::SingleQuotedString(field.data_type().to_string());
            format!("arrow_cast(NULL, {data_type}) AS {name}")
        })
        .collect();
    Ok(format!("SELECT {}", columns.join(", ")))
}

/// `plan` with the row of NULLs it names [`STAGED`] replaced by a read of `staged`.
fn read_staged(plan: LogicalPlan, staged: &Arc<StagedRows>) -> Result<LogicalPlan> {
    let replaced = plan.transform_down_with_subqueries(|node| match &node {
        LogicalPlan::SubqueryAlias(alias) if alias.alias.table() == STAGED => {
            let read = LogicalPlanBuilder::scan(STAGED, provider_as_source(staged.clone()), None)?
                .alias(STAGED)?
                .build()?;
            Ok(Transformed::new(read, true, TreeNodeRecursion::Jump))
        }
        _ => Ok(Transformed::no(node)),
    })?;
    match replaced.transformed {
        true => Ok(replaced.data),
        false => Err(SqlError::Invalid(
            "a MERGE step that reads no staged rows".into(),
        )),
    }
}
