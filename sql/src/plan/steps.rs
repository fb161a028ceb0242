//! Statements run as steps of one transaction ([`crate::plan::planner::Draft::Steps`]): INSERT
//! ... ON CONFLICT ([`crate::plan::on_conflict`]) and MERGE ([`crate::plan::merge`]).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::logical_expr::LogicalPlan;

use crate::exec::staged::StagedRows;
use crate::plan::params::parameter_types;
use crate::Result;

/// One step of a statement run as steps of one transaction ([`Draft::Steps`]).
pub(crate) enum Step<P> {
    /// Changes rows; its count adds to the statement's.
    Change(P),
    /// A query whose rows later steps read.
    Stage(P, Arc<StagedRows>),
    /// A query that must find no rows: if it finds one, the statement fails with this error,
    /// `{row}` in it replaced by the row's values.
    Refuse(P, String),
}

impl<P> Step<P> {
    pub(crate) fn plan(&self) -> &P {
        match self {
            Step::Change(plan) | Step::Stage(plan, _) | Step::Refuse(plan, _) => plan,
        }
    }

    /// The same step with its plan mapped by `f`.
    pub(crate) async fn try_map<Q, F>(self, f: impl FnOnce(P) -> F) -> Result<Step<Q>>
    where
        F: std::future::Future<Output = Result<Q>>,
    {
        Ok(match self {
            Step::Change(plan) => Step::Change(f(plan).await?),
            Step::Stage(plan, rows) => Step::Stage(f(plan).await?, rows),
            Step::Refuse(plan, error) => Step::Refuse(f(plan).await?, error),
        })
    }
}

/// The types of the parameters a statement of steps reads, from the step that reads each.
pub(crate) fn steps_parameter_types(steps: &[Step<LogicalPlan>]) -> Result<Vec<Option<DataType>>> {
    let mut types: Vec<Option<DataType>> = Vec::new();
    for step in steps {
        for (i, data_type) in parameter_types(step.plan())?.into_iter().enumerate() {
            match types.get_mut(i) {
                Some(known) => {
                    if known.is_none() {
                        *known = data_type;
                    }
                }
                None => types.push(data_type),
            }
        }
    }
    Ok(types)
}
