//! [`ChoosingPlanner`]: plans each statement for one coordinator or for the cluster, as
//! `nyala.distributed` and the statement say.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::display::{PlanType, StringifiedPlan, ToStringifiedPlan};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{ExplainFormat, LogicalPlan};
use datafusion::physical_plan::explain::ExplainExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{display_plan_ascii, DistributedExec};
use nyala_engine::Client;

use crate::exec::decimal::DecimalArithmeticRule;
use crate::exec::mutation::ConditionalMutationExec;
use crate::exec::runtime_filter::RuntimeFilterRule;
use crate::exec::scan::NyalaScanExec;
use crate::exec::staged::StagedRowsExec;
use crate::exec::tail::TailExec;
use crate::plan::dml::NyalaQueryPlanner;
use crate::session::settings::DistributedMode;
use crate::session::transaction::TxnSlot;

/// Under `nyala.distributed = auto`, the rows a query's scans must reach, by the tablets'
/// estimates, before it runs distributed: below that, one coordinator answers sooner than
/// stages started on several servers.
pub const AUTO_MIN_ROWS: usize = 1_000_000;

/// Plans a statement as today (one coordinator) or, when it is a query that
/// `nyala.distributed` sends to the cluster, with datafusion-distributed's planner.
#[derive(Debug)]
pub(crate) struct ChoosingPlanner {
    /// datafusion-distributed's planner over [`UnfilteredPlanner`].
    pub(crate) distributed: Arc<dyn QueryPlanner + Send + Sync>,
    pub(crate) client: Client,
}

#[async_trait]
impl QueryPlanner for ChoosingPlanner {
    async fn create_physical_plan(
        &self,
        logical: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // EXPLAIN of a distributed query shows its stages (DataFusion's would show the plan
        // for one coordinator).
        if let LogicalPlan::Explain(explain) = logical {
            let shown = explain.explain_format == ExplainFormat::Indent
                && explain.logical_optimization_succeeded;
            if shown && is_query(&explain.plan) {
                let (plan, distributed) = self.plan(&explain.plan, session).await?;
                if distributed {
                    let mut plans = explain.stringified_plans.clone();
                    plans.push(explain.plan.to_stringified(PlanType::FinalLogicalPlan));
                    let text = display_plan_ascii(plan.as_ref(), false);
                    plans.push(StringifiedPlan::new(PlanType::FinalPhysicalPlan, text));
                    let schema = explain.schema.inner().clone();
                    return Ok(Arc::new(ExplainExec::new(schema, plans, explain.verbose)));
                }
            }
        }
        Ok(self.plan(logical, session).await?.0)
    }
}

impl ChoosingPlanner {
    /// The plan of `logical`, and whether it is distributed.
    async fn plan(
        &self,
        logical: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
        let local = NyalaQueryPlanner
            .create_physical_plan(logical, session)
            .await?;
        if !self.distributes(logical, &local, session)? {
            return Ok((local, false));
        }
        let plan = self
            .distributed
            .create_physical_plan(logical, session)
            .await?;
        let distributed = plan.is::<DistributedExec>();
        Ok((plan, distributed))
    }

    /// Whether the statement planned as `local` runs distributed: a query outside a
    /// transaction, made of operators that can run on other servers, in a cluster, when the
    /// setting says so (`auto`: more than one tablet server, [`AUTO_MIN_ROWS`] rows scanned).
    fn distributes(
        &self,
        logical: &LogicalPlan,
        local: &Arc<dyn ExecutionPlan>,
        session: &dyn Session,
    ) -> Result<bool> {
        let mode = DistributedMode::of(session.config_options());
        let in_transaction = (session.config().get_extension::<TxnSlot>())
            .is_some_and(|slot| slot.current().is_some());
        if mode == DistributedMode::Off || in_transaction || !is_query(logical) {
            return Ok(false);
        }
        let servers = self.client.tablet_servers().len();
        let (travels, rows) = travels_and_rows(local)?;
        tracing::debug!(?mode, servers, travels, rows, "distributed or not");
        Ok(travels
            && match mode {
                DistributedMode::On => servers >= 1,
                _ => servers > 1 && rows >= AUTO_MIN_ROWS,
            })
    }
}

/// Whether `plan` is a query (perhaps explained): no DML, DDL or other statement.
fn is_query(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Explain(explain) => is_query(&explain.plan),
        LogicalPlan::Analyze(analyze) => is_query(&analyze.input),
        LogicalPlan::Dml(_)
        | LogicalPlan::Ddl(_)
        | LogicalPlan::Copy(_)
        | LogicalPlan::Statement(_)
        | LogicalPlan::DescribeTable(_)
        | LogicalPlan::Extension(_) => false,
        _ => true,
    }
}

/// Whether every operator of `plan` can run on another server, and the rows its scans read
/// by the tablets' estimates.
fn travels_and_rows(plan: &Arc<dyn ExecutionPlan>) -> Result<(bool, usize)> {
    let (mut travels, mut rows) = (true, 0usize);
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<NyalaScanExec>() {
            // A queue's long poll waits where it started.
            travels &= !scan.waits();
            let tablets = scan.tablets().iter();
            let client = scan.client();
            rows += tablets
                .map(|&t| client.estimated_rows(scan.table(), Some(t)))
                .sum::<usize>();
        }
        if node.is::<TailExec>()
            || node.is::<StagedRowsExec>()
            || node.is::<ConditionalMutationExec>()
        {
            travels = false;
        }
        Ok(match travels {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    })?;
    Ok((travels, rows))
}

/// [`NyalaQueryPlanner`] without Nyala's runtime filters, for plans split into stages: a
/// build side and the scans waiting for its filters may end up on different servers, where
/// the scans would wait for ever. DataFusion's dynamic filters stay (Nyala's rule would have
/// replaced them): a hash join and the scans it filters that run in one stage share them on
/// the worker too (see `codec.rs`). Nor with Nyala's decimal arithmetic: the codec
/// datafusion-distributed composes of its own and Nyala's passes no expression of Nyala's on
/// (DataFusion 55's `ComposedPhysicalExtensionCodec` forwards plans and functions only).
#[derive(Debug)]
pub(crate) struct UnfilteredPlanner;

#[async_trait]
impl QueryPlanner for UnfilteredPlanner {
    async fn create_physical_plan(
        &self,
        logical: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
            return Err(DataFusionError::Internal(
                "a distributed plan needs a DataFusion session state".into(),
            ));
        };
        let rules = (state.physical_optimizers().iter())
            .filter(|rule| {
                ![RuntimeFilterRule::NAME, DecimalArithmeticRule::NAME].contains(&rule.name())
            })
            .cloned()
            .collect();
        let state = SessionStateBuilder::new_from_existing(state.clone())
            .with_physical_optimizer_rules(rules)
            .build();
        NyalaQueryPlanner
            .create_physical_plan(logical, &state)
            .await
    }
}
