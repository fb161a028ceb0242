//! A parsed statement → a [`PlannedStatement`](planned::PlannedStatement): DataFusion's logical
//! plan with placeholders, bound and planned physically with Nyala's operators.

pub(crate) mod dml;
pub(crate) mod lookup;
pub(crate) mod merge;
pub(crate) mod on_conflict;
pub(crate) mod params;
pub(crate) mod planned;
pub(crate) mod planner;
pub(crate) mod prepared;
pub(crate) mod prepared_tail;
pub(crate) mod reusable;
pub(crate) mod steps;
pub(crate) mod update_from;
pub(crate) mod values_insert;
pub(crate) mod yielding_leaves;
