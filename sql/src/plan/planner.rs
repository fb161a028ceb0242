//! How a session plans a statement: parsed, checked against the session's privileges, then
//! drafted. Nyala's own statements are planned completely here (DDL is carried as parsed, SHOW
//! is answered); everything else becomes DataFusion's logical plan, kept with its placeholders
//! until values are bound (see [`crate::plan::prepared`]), then planned physically with Nyala's
//! scan and mutation operators.
//!
//! A logical plan nests at most [`MAX_PLAN_DEPTH`] operators (CTEs that read one another and
//! subqueries stack up): some of DataFusion's optimizer rules recurse without stack protection,
//! so a deeper plan is refused before they run.

use datafusion::common::tree_node::{TreeNodeRecursion, TreeNodeVisitor};
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, Statement as SqlStatement, TableObject};

use crate::catalog::hidden;
use crate::catalog::schema as catalog;
use crate::functions::as_of;
use crate::parse::parser::NyalaParser;
use crate::parse::statement::{object_name, CopyDirection, Ddl, NyalaStatement};
use crate::plan::dml;
use crate::plan::params::{bind, cast_params, parameter_types};
use crate::plan::planned::{statement_kind, Action, PlannedStatement, StatementKind};
use crate::plan::steps::{steps_parameter_types, Step};
use crate::plan::values_insert;
use crate::session::access::Requirements;
use crate::session::settings;
use crate::session::transaction::TxnControl;
use crate::session::Session;
use crate::{Result, SqlError};

/// A statement parsed and turned into a logical plan, or planned completely where it has no
/// logical plan (Nyala's DDL and SHOW statements).
pub(crate) enum Draft {
    Logical {
        kind: StatementKind,
        plan: LogicalPlan,
    },
    Planned(PlannedStatement),
    /// Statements that change rows, run in order in one transaction (an INSERT ... ON
    /// CONFLICT DO UPDATE's UPDATE of existing keys and INSERT of new ones).
    Steps(Vec<Step<LogicalPlan>>),
}

impl Session {
    /// Parses and plans exactly one statement (a trailing `;` is allowed).
    pub async fn plan(&self, sql: &str) -> Result<PlannedStatement> {
        self.plan_with_params(sql, &[]).await
    }

    /// Plans one statement with `params` bound to its placeholders (`$1` or `?`, in order).
    pub async fn plan_with_params(
        &self,
        sql: &str,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let (_, draft) = self.authorized_draft(sql).await?;
        self.plan_draft(draft, params).await
    }

    /// Plans and executes exactly one statement.
    pub async fn execute(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        self.plan(sql).await?.execute().await
    }

    /// `sql` parsed, checked against the session's privileges, and drafted; what it needs.
    pub(crate) async fn authorized_draft(&self, sql: &str) -> Result<(Requirements, Draft)> {
        let statement = NyalaParser::parse_sql(sql)?;
        let controls_txn = match &statement {
            NyalaStatement::DataFusion(s) => TxnControl::of(s)?.is_some(),
            _ => false,
        };
        if !controls_txn {
            self.check_transaction()?;
        }
        // Its walks recurse as deep as the statement nests (up to the parser's limit): a long
        // statement may nest deep, so it is walked on a stack of its own.
        let needs = match sql.len() > REQUIREMENTS_ON_OWN_STACK {
            true => stacker::grow(64 << 20, || Requirements::of(&statement))?,
            false => Requirements::of(&statement)?,
        };
        self.authorize(&needs)?;
        Ok((needs, self.draft(statement).await?))
    }

    /// A parsed statement as a logical plan still to be bound, or planned completely where it
    /// has none (Nyala's DDL and SHOW statements).
    pub(crate) async fn draft(&self, statement: NyalaStatement) -> Result<Draft> {
        let planned = |kind, action| {
            Ok(Draft::Planned(PlannedStatement {
                kind,
                session: self.clone(),
                action,
            }))
        };
        if let NyalaStatement::DataFusion(statement) = &statement {
            if let Some(control) = TxnControl::of(statement)? {
                return planned(StatementKind::Ddl, Action::Transaction(control));
            }
        }
        match statement {
            NyalaStatement::Ddl(Ddl::CreateView {
                name,
                sql,
                or_replace,
            }) => {
                self.check_view(&name, &sql).await?;
                let ddl = Ddl::CreateView {
                    name,
                    sql,
                    or_replace,
                };
                planned(StatementKind::Ddl, Action::Ddl(ddl))
            }
            NyalaStatement::Ddl(ddl) => planned(StatementKind::Ddl, Action::Ddl(ddl)),
            NyalaStatement::CloneTable {
                name,
                source,
                if_not_exists,
                as_of,
            } => {
                let as_of = match as_of {
                    Some(time) => Some(as_of::time_of(&self.ctx.state(), &time).await?),
                    None => None,
                };
                let ddl = Ddl::CloneTable {
                    name,
                    source,
                    if_not_exists,
                    as_of,
                };
                planned(StatementKind::Ddl, Action::Ddl(ddl))
            }
            NyalaStatement::CreateTableAs(ctas) => {
                planned(StatementKind::Dml, self.plan_create_table_as(ctas).await?)
            }
            NyalaStatement::Show(show) => {
                planned(StatementKind::Query, Action::Rows(self.show(&show)?))
            }
            NyalaStatement::UpdateFrom { update, explain } => {
                let mut plan = self.plan_update_from(*update).await?;
                let mut kind = StatementKind::Dml;
                if let Some((verbose, analyze)) = explain {
                    plan = LogicalPlanBuilder::from(plan)
                        .explain(verbose, analyze)?
                        .build()?;
                    kind = StatementKind::Query;
                }
                Ok(Draft::Logical { kind, plan })
            }
            NyalaStatement::DataFusion(statement) => {
                if let Some(spec) = self.partial_upsert(&statement) {
                    return self.draft_on_conflict(spec).await;
                }
                if let SqlStatement::Explain { statement, .. } = statement.as_ref() {
                    if self.partial_upsert(statement).is_some() {
                        return Err(SqlError::NotSupported(
                            "EXPLAIN of an UPSERT that names some of the table's columns".into(),
                        ));
                    }
                }
                let plan = self.logical_plan(statement).await?;
                let kind = statement_kind(&plan)?;
                Ok(Draft::Logical { kind, plan })
            }
            NyalaStatement::InsertOnConflict(spec) => self.draft_on_conflict(spec).await,
            NyalaStatement::Merge(merge) => self.draft_merge(*merge).await,
            NyalaStatement::CopyFile(spec) => match &spec.direction {
                CopyDirection::From { table, columns } => {
                    self.db.client.table(table)?;
                    let (table, columns) = (table.clone(), columns.clone());
                    let action = Action::CopyFrom {
                        spec,
                        table,
                        columns,
                    };
                    planned(StatementKind::Dml, action)
                }
                CopyDirection::To { query } => {
                    let plan = self.plan_sql(query).await?;
                    if statement_kind(&plan)? != StatementKind::Query {
                        return Err(SqlError::Invalid("COPY (...) TO takes a query".into()));
                    }
                    let planned_query = self.plan_logical(StatementKind::Query, plan, &[]).await?;
                    let Action::Plan(plan) = planned_query.action else {
                        return Err(SqlError::Invalid("COPY (...) TO takes a query".into()));
                    };
                    planned(StatementKind::Dml, Action::CopyTo { spec, plan })
                }
            },
            NyalaStatement::Backup(_) | NyalaStatement::Restore(_) if self.in_transaction() => {
                Err(SqlError::NotSupported(
                    "BACKUP and RESTORE inside a transaction (COMMIT or ROLLBACK first)".into(),
                ))
            }
            NyalaStatement::Backup(spec) => planned(StatementKind::Query, Action::Backup(spec)),
            NyalaStatement::Restore(spec) => planned(StatementKind::Query, Action::Restore(spec)),
            NyalaStatement::InsertIgnore(statement) => {
                let plan = self.logical_plan(statement).await?;
                let kind = statement_kind(&plan)?;
                let plan = dml::plan_insert_ignore(plan)?;
                Ok(Draft::Logical { kind, plan })
            }
        }
    }

    /// Refuses a view whose query does not plan now, or reads the view itself (directly or
    /// through other views: CREATE OR REPLACE would make it endless).
    async fn check_view(&self, name: &str, sql: &str) -> Result<()> {
        let plan = catalog::view_plan(&self.ctx.state(), &self.db.client, sql).await?;
        check_plan_depth(&plan)?;
        match catalog::reads_view(&self.db.client, sql, name)? {
            true => Err(SqlError::Invalid(format!(
                "view '{name}' cannot read itself"
            ))),
            false => Ok(()),
        }
    }

    /// Binds `params` to a logical plan's placeholders and plans it physically.
    pub(crate) async fn plan_logical(
        &self,
        kind: StatementKind,
        plan: LogicalPlan,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let action = if let LogicalPlan::Statement(statement) = &plan {
            let plan = LogicalPlan::Statement(settings::checked_set(statement)?);
            Action::Setting(bind(plan, params)?)
        } else {
            let plan = dml::plan_mutations(bind(plan, params)?)?;
            let state = self.ctx.state();
            Action::Plan(match values_insert::inserts_values(&plan) {
                true => {
                    let analyzed = state.analyzer().execute_and_check(
                        plan,
                        state.config_options(),
                        |_, _| {},
                    )?;
                    match values_insert::inserts_values(&analyzed) {
                        true => values_insert::plan_values_insert(&analyzed, &state).await?,
                        false => {
                            (state.query_planner())
                                .create_physical_plan(&analyzed, &state)
                                .await?
                        }
                    }
                }
                false => state.create_physical_plan(&plan).await?,
            })
        };
        Ok(PlannedStatement {
            kind,
            session: self.clone(),
            action,
        })
    }

    /// DataFusion's plan of `statement`, its AS OF clauses turned into what DataFusion plans.
    pub(crate) async fn logical_plan(
        &self,
        mut statement: Box<SqlStatement>,
    ) -> Result<LogicalPlan> {
        as_of::lower(&mut statement)?;
        hidden::exclude_hidden(statement.as_mut(), hidden::keyless_in(&self.db.client));
        crate::functions::tail::lower_parameters(&mut statement, &self.db.client);
        crate::functions::changes::lower_parameters(&mut statement);
        self.refuse_assigned_columns(&statement)?;
        self.name_assigned_columns(&mut statement);
        let plan = self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(statement))
            .await?;
        check_plan_depth(&plan)?;
        Ok(plan)
    }

    /// DataFusion's plan of `sql`, one statement DataFusion plans (the statements Nyala writes
    /// itself to plan another: ON CONFLICT's, MERGE's, COPY TO's query).
    pub(crate) async fn plan_sql(&self, sql: &str) -> Result<LogicalPlan> {
        let NyalaStatement::DataFusion(statement) = NyalaParser::parse_sql(sql)? else {
            return Err(SqlError::Invalid(format!("cannot plan {sql}")));
        };
        self.logical_plan(statement).await
    }

    /// An INSERT whose column list names a queue table's POSITION column (even to give it
    /// NULL) is refused: the database assigns it.
    fn refuse_assigned_columns(&self, statement: &SqlStatement) -> Result<()> {
        let insert = match statement {
            SqlStatement::Explain { statement, .. } => match statement.as_ref() {
                SqlStatement::Insert(insert) => insert,
                _ => return Ok(()),
            },
            SqlStatement::Insert(insert) => insert,
            _ => return Ok(()),
        };
        let TableObject::TableName(name) = &insert.table else {
            return Ok(());
        };
        let Some(table) = object_name(name)
            .ok()
            .and_then(|n| self.db.client.table(&n).ok())
        else {
            return Ok(());
        };
        let Some(position) = table.schema.position_column() else {
            return Ok(());
        };
        let position = &table.schema.columns()[position].name;
        let named = |column: &ObjectName| {
            (column.0.last().and_then(|part| part.as_ident()))
                .is_some_and(|ident| crate::parse::statement::normalize_ident(ident) == *position)
        };
        match insert.columns.iter().any(named) {
            true => Err(SqlError::Invalid(format!(
                "column '{position}' is GENERATED ALWAYS AS POSITION: the database assigns it, \
                 so leave it out of INSERT"
            ))),
            false => Ok(()),
        }
    }

    /// An INSERT without a column list into a table with a NON UNIQUE PRIMARY KEY lists the
    /// table's columns except auto_incrementing_id, which the database assigns.
    fn name_assigned_columns(&self, statement: &mut SqlStatement) {
        let insert = match statement {
            SqlStatement::Explain { statement, .. } => match statement.as_mut() {
                SqlStatement::Insert(insert) => insert,
                _ => return,
            },
            SqlStatement::Insert(insert) => insert,
            _ => return,
        };
        if !insert.columns.is_empty() {
            return;
        }
        let TableObject::TableName(name) = insert.table.clone() else {
            return;
        };
        let Some(table) = object_name(&name)
            .ok()
            .and_then(|n| self.db.client.table(&n).ok())
        else {
            return;
        };
        if let Some(hidden) = table.schema.auto_increment_column() {
            insert.columns = table
                .schema
                .columns()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != hidden)
                .map(|(_, c)| ObjectName::from(vec![Ident::with_quote('"', &c.name)]))
                .collect();
        }
    }

    /// Plans a statement that has no parameters, from its draft.
    pub(crate) async fn plan_draft(
        &self,
        draft: Draft,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        match draft {
            Draft::Logical { kind, plan } => self.plan_logical(kind, plan, params).await,
            Draft::Planned(_) if !params.is_empty() => Err(SqlError::Invalid(format!(
                "this statement has no parameters, {} were bound",
                params.len()
            ))),
            Draft::Planned(planned) => Ok(planned),
            Draft::Steps(plans) => {
                // Each step binds the parameters it reads; together they read all of them.
                let types = steps_parameter_types(&plans)?;
                cast_params(&types, params)?;
                let mut steps = Vec::with_capacity(plans.len());
                for step in plans {
                    let planned = step.try_map(|plan| async {
                        let used = parameter_types(&plan)?.len();
                        let planned =
                            (self.plan_logical(StatementKind::Dml, plan, &params[..used])).await?;
                        match planned.action {
                            Action::Plan(plan) => Ok(plan),
                            _ => Err(SqlError::Invalid("a step that runs no plan".into())),
                        }
                    });
                    steps.push(planned.await?);
                }
                Ok(PlannedStatement {
                    kind: StatementKind::Dml,
                    session: self.clone(),
                    action: Action::Steps(steps),
                })
            }
        }
    }
}

/// Statements longer than this (bytes) are checked for privileges on a stack of their own.
const REQUIREMENTS_ON_OWN_STACK: usize = 256;

/// Most operators of a logical plan nested in one another, subqueries included.
pub const MAX_PLAN_DEPTH: usize = 1000;

/// Refuses a plan deeper than [`MAX_PLAN_DEPTH`]. The walk stops at that depth (and
/// DataFusion's tree walks grow their stack as they go).
fn check_plan_depth(plan: &LogicalPlan) -> Result<()> {
    struct Depth {
        current: usize,
        exceeded: bool,
    }
    impl<'n> TreeNodeVisitor<'n> for Depth {
        type Node = LogicalPlan;
        fn f_down(&mut self, _: &'n LogicalPlan) -> datafusion::common::Result<TreeNodeRecursion> {
            self.current += 1;
            self.exceeded = self.current > MAX_PLAN_DEPTH;
            Ok(match self.exceeded {
                true => TreeNodeRecursion::Stop,
                false => TreeNodeRecursion::Continue,
            })
        }
        fn f_up(&mut self, _: &'n LogicalPlan) -> datafusion::common::Result<TreeNodeRecursion> {
            self.current -= 1;
            Ok(TreeNodeRecursion::Continue)
        }
    }
    let mut depth = Depth {
        current: 0,
        exceeded: false,
    };
    plan.visit_with_subqueries(&mut depth)?;
    match depth.exceeded {
        true => Err(SqlError::Invalid(format!(
            "the query nests more than {MAX_PLAN_DEPTH} operators (through CTEs that read one \
             another, subqueries or views); simplify it"
        ))),
        false => Ok(()),
    }
}
