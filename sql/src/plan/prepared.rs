//! Prepared statements: a statement parsed and planned up to the point where its parameter
//! values are needed, so each execution only binds, optimizes and builds the physical plan.
//!
//! A DataFusion statement (queries, DML, SET) is kept as its logical plan with placeholders;
//! a query also as that plan optimized, so an execution only binds values and plans physically
//! (when binding the optimized plan fails, the plan is optimized again after binding). A
//! `tail` whose parameters are only in its WHERE (a prepared consumer's poll) is planned
//! physically when prepared, and an execution builds only the tail's scan and the filter above
//! it with the values bound ([`PreparedTail`]).
//! That plan holds the definitions of the tables it reads and writes as they were when it was
//! planned; the catalog replaces a table's definition whenever DDL changes anything, so a plan
//! whose tables are no longer the catalog's current ones is planned again from its text. So is
//! every statement whose plan depends on the moment it is planned (`AS OF now() - ...`) and
//! Nyala's own statements (DDL, SHOW, DESCRIBE), which are cheap to plan and change the catalog.
//!
//! ```
//! # use datafusion::common::ScalarValue;
//! # use datafusion::physical_plan::common::collect;
//! # use nyala_sql::{Database, DatabaseOptions};
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> nyala_sql::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let db = Database::open(dir.path(), DatabaseOptions::default()).await?;
//! # let session = db.session();
//! # session.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v STRING)").await?;
//! # session.execute("INSERT INTO t VALUES (7, 'seven'), (8, 'eight')").await?;
//! let lookup = session.prepare_statement("SELECT * FROM t WHERE k = $1").await?;
//! let planned = session.plan_prepared(&lookup, &[ScalarValue::from(7i64)]).await?;
//! let rows = collect(planned.execute().await?).await?;
//! assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
//! # db.shutdown().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::ScalarValue;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_plan::ExecutionPlan;
use nyala_engine::TableHandle;

use crate::catalog::table::NyalaTable;
use crate::functions::changes::ChangesTable;
use crate::functions::tail::TailTable;
use crate::plan::dml::{self, MutationNode};
use crate::plan::lookup::{KeyLookup, KeyMutation};
use crate::plan::params::{bind, parameter_types};
use crate::plan::planned::{Action, PlannedStatement, StatementInfo, StatementKind};
use crate::plan::planner::Draft;
use crate::plan::prepared_tail::PreparedTail;
use crate::plan::reusable::reusable;
use crate::plan::steps::steps_parameter_types;
use crate::results::{client_schema, client_type, count_schema, empty_schema};
use crate::session::access::Requirements;
use crate::session::Session;
use crate::Result;

/// A statement ready to be run many times with different parameter values.
#[derive(Clone)]
pub struct PreparedStatement {
    sql: String,
    /// The privileges it needs, checked at every execution.
    needs: Requirements,
    info: StatementInfo,
    template: Template,
}

#[derive(Clone)]
enum Template {
    /// DataFusion's logical plan with its placeholders, the same optimized (queries whose
    /// parameter types are known), and the table definitions it used.
    Logical {
        plan: Box<LogicalPlan>,
        optimized: Option<Box<LogicalPlan>>,
        tables: Vec<TableHandle>,
        /// The query as a lookup by the whole primary key, if it is one.
        lookup: Option<KeyLookup>,
        /// The UPDATE or DELETE as a write of one row by its whole primary key, if it is one.
        mutation: Option<KeyMutation>,
        /// A query without parameters planned physically, where its plan can run again
        /// ([`reusable`]).
        physical: Option<Arc<dyn ExecutionPlan>>,
        /// The query as a tail whose parameters are bound into a plan made once, if it is one.
        tail: Option<PreparedTail>,
    },
    /// Planned from its text at every execution.
    Text,
}

impl PreparedStatement {
    /// The statement's text.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Its kind, result schema and parameter schema.
    pub fn info(&self) -> &StatementInfo {
        &self.info
    }

    /// Whether executions bind their parameters into a tail planned when it was prepared
    /// ([`PreparedTail`]).
    pub fn is_prepared_tail(&self) -> bool {
        matches!(&self.template, Template::Logical { tail: Some(_), .. })
    }

    /// Whether executions read or write their row by its whole primary key without DataFusion
    /// ([`crate::plan::lookup`]), where the bound values allow it.
    pub fn is_keyed(&self) -> bool {
        matches!(
            &self.template,
            Template::Logical {
                lookup: Some(_),
                ..
            } | Template::Logical {
                mutation: Some(_),
                ..
            }
        )
    }
}

impl Session {
    /// Parses and plans `sql` (one statement) for repeated execution.
    pub async fn prepare_statement(&self, sql: &str) -> Result<PreparedStatement> {
        let (needs, draft) = self.authorized_draft(sql).await?;
        let (info, template) = match draft {
            Draft::Logical { kind, plan } => {
                let parameters = parameter_types(&plan)?;
                let schema = match kind {
                    StatementKind::Ddl => empty_schema(),
                    _ => client_schema(&Arc::new(plan.schema().as_arrow().clone())),
                };
                let typed = parameters.iter().all(|p| p.is_some());
                let info = StatementInfo {
                    kind,
                    schema,
                    parameters: parameter_schema(&parameters),
                };
                let template = match tables_of(&plan) {
                    // A plan that reads the clock is optimized when it runs: the optimizer
                    // replaces `now()` by the time it runs at.
                    Some(tables) if !reads_the_clock(&plan) => {
                        let optimized = (kind == StatementKind::Query && typed)
                            .then(|| self.ctx.state().optimize(&plan).ok().map(Box::new))
                            .flatten();
                        let lookup = optimized.as_deref().and_then(|optimized| {
                            KeyLookup::recognise(optimized, &info.schema, &parameters)
                        });
                        let mutation = (kind == StatementKind::Dml && typed)
                            .then(|| self.key_mutation(&plan, &parameters))
                            .flatten();
                        let (physical, tail) = match (&optimized, parameters.is_empty()) {
                            (Some(optimized), true) => (self.reusable_plan(optimized).await, None),
                            (Some(optimized), false) => {
                                let state = self.ctx.state();
                                let tail = PreparedTail::recognise(optimized, &parameters, &state);
                                (None, tail.await)
                            }
                            (None, _) => (None, None),
                        };
                        Template::Logical {
                            plan: Box::new(plan),
                            optimized,
                            tables,
                            lookup,
                            mutation,
                            physical,
                            tail,
                        }
                    }
                    _ => Template::Text,
                };
                (info, template)
            }
            Draft::Steps(plans) => {
                let parameters = steps_parameter_types(&plans)?;
                let info = StatementInfo {
                    kind: StatementKind::Dml,
                    schema: count_schema(),
                    parameters: parameter_schema(&parameters),
                };
                (info, Template::Text)
            }
            Draft::Planned(planned) => {
                let info = StatementInfo {
                    kind: planned.kind(),
                    schema: planned.schema(),
                    parameters: empty_schema(),
                };
                (info, Template::Text)
            }
        };
        Ok(PreparedStatement {
            sql: sql.to_string(),
            needs,
            info,
            template,
        })
    }

    /// Plans one execution of `prepared` with `params` bound to its placeholders.
    pub async fn plan_prepared(
        &self,
        prepared: &PreparedStatement,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        self.authorize(&prepared.needs)?;
        if let Template::Logical { .. } = prepared.template {
            // (Text statements are checked when drafted: COMMIT and ROLLBACK always run.)
            self.check_transaction()?;
        }
        match &prepared.template {
            Template::Logical {
                plan,
                optimized,
                tables,
                lookup,
                mutation,
                physical,
                tail,
            } if self.is_current(tables) => {
                // A key write runs outside DataFusion's plans, where a transaction's writes
                // are not; a key lookup reads at the transaction's snapshot through its
                // writes (`BoundLookup::run`).
                let mutation = mutation.as_ref().filter(|_| !self.in_transaction());
                if let Some(Some(bound)) = mutation.map(|m| m.bind(params)).transpose()? {
                    return Ok(PlannedStatement {
                        kind: StatementKind::Dml,
                        session: self.clone(),
                        action: Action::KeyMutation(bound),
                    });
                }
                if let (Some(physical), true) = (physical, params.is_empty()) {
                    return Ok(PlannedStatement {
                        kind: StatementKind::Query,
                        session: self.clone(),
                        action: Action::Plan(physical.clone()),
                    });
                }
                if let Some(Ok(plan)) = tail.as_ref().map(|t| t.plan(params)) {
                    return Ok(PlannedStatement {
                        kind: StatementKind::Query,
                        session: self.clone(),
                        action: Action::Plan(plan),
                    });
                }
                if let Some(Some(bound)) = lookup.as_ref().map(|l| l.bind(params)).transpose()? {
                    return Ok(PlannedStatement {
                        kind: StatementKind::Query,
                        session: self.clone(),
                        action: Action::Lookup(bound),
                    });
                }
                if let Some(optimized) = optimized {
                    let optimized = optimized.as_ref().clone();
                    if let Ok(planned) = self.plan_optimized(optimized, params).await {
                        return Ok(planned);
                    }
                }
                self.plan_logical(prepared.info.kind, plan.as_ref().clone(), params)
                    .await
            }
            _ => self.plan_with_params(&prepared.sql, params).await,
        }
    }

    /// Binds `params` to an optimized query plan and plans it physically.
    async fn plan_optimized(
        &self,
        plan: LogicalPlan,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let plan = bind(plan, params)?;
        let state = self.ctx.state();
        let physical = state
            .query_planner()
            .create_physical_plan(&plan, &state)
            .await?;
        Ok(PlannedStatement {
            kind: StatementKind::Query,
            session: self.clone(),
            action: Action::Plan(physical),
        })
    }

    /// An UPDATE or DELETE plan as a write of one row by its whole primary key, if it is one.
    fn key_mutation(
        &self,
        plan: &LogicalPlan,
        parameters: &[Option<DataType>],
    ) -> Option<KeyMutation> {
        let LogicalPlan::Extension(extension) = dml::plan_mutations(plan.clone()).ok()? else {
            return None;
        };
        let node = extension.node.as_any().downcast_ref::<MutationNode>()?;
        let input = self.ctx.state().optimize(node.input()).ok()?;
        KeyMutation::recognise(node.kind(), &input, parameters)
    }

    /// `optimized` (a query without parameters) planned physically, if that plan can be run
    /// again and again ([`reusable`]).
    async fn reusable_plan(&self, optimized: &LogicalPlan) -> Option<Arc<dyn ExecutionPlan>> {
        let state = self.ctx.state();
        let physical = state
            .query_planner()
            .create_physical_plan(optimized, &state);
        physical.await.ok().filter(reusable)
    }

    /// Whether every table definition in `tables` is still the catalog's current one.
    fn is_current(&self, tables: &[TableHandle]) -> bool {
        tables.iter().all(|table| {
            self.db
                .client
                .table(&table.name)
                .is_ok_and(|now| Arc::ptr_eq(&now, table))
        })
    }
}

/// Whether `plan` calls a function whose value is not fixed by its arguments (`now()`,
/// `random()`), so that what the optimizer makes of it holds only for one execution.
fn reads_the_clock(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        for expr in node.expressions() {
            let _ = expr.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    found |= f.func.signature().volatility != Volatility::Immutable;
                }
                Ok(match found {
                    true => TreeNodeRecursion::Stop,
                    false => TreeNodeRecursion::Continue,
                })
            });
        }
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    found
}

/// The Nyala tables a plan reads and writes (a `tail` reads its queue table), None if its plan
/// cannot be reused: it reads a table `AS OF` a time computed when it was planned, or a table
/// that is not a Nyala table (`sys.partitions` and the like hold the rows of the moment they
/// were planned).
fn tables_of(plan: &LogicalPlan) -> Option<Vec<TableHandle>> {
    let mut tables = Vec::new();
    let mut reusable = true;
    let mut visit = |source: &Arc<dyn datafusion::logical_expr::TableSource>| {
        let provider = source_as_provider(source).ok();
        let table = provider.as_ref().and_then(|p| {
            (p.downcast_ref::<NyalaTable>().map(NyalaTable::handle))
                .or_else(|| p.downcast_ref::<TailTable>().map(|t| (t.handle(), false)))
                .or_else(|| {
                    p.downcast_ref::<ChangesTable>()
                        .map(|t| (t.handle(), false))
                })
        });
        match table {
            Some((handle, false)) => tables.push(handle),
            _ => reusable = false,
        }
    };
    let walked = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(scan) => visit(&scan.source),
            LogicalPlan::Dml(dml) => visit(&dml.target),
            LogicalPlan::Extension(extension) => {
                if let Some(mutation) = extension.node.as_any().downcast_ref::<MutationNode>() {
                    visit(mutation.target());
                }
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    (walked.is_ok() && reusable).then_some(tables)
}

/// The parameters `$1, $2, ...` with the types a plan gives them (text where it gives none),
/// as clients see them.
fn parameter_schema(parameters: &[Option<DataType>]) -> SchemaRef {
    let fields = (parameters.iter().enumerate())
        .map(|(i, t)| {
            let t = t.as_ref().map_or(DataType::Utf8, client_type);
            Field::new(format!("${}", i + 1), t, true)
        })
        .collect::<Vec<_>>();
    Arc::new(ArrowSchema::new(fields))
}
