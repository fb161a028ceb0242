//! A parsed statement → a [`PlannedStatement`](planned::PlannedStatement): DataFusion's logical
//! plan with placeholders, bound and planned physically with Nyala's operators.

pub(crate) mod dml;
pub(crate) mod lookup;
pub(crate) mod params;
pub(crate) mod planned;
pub(crate) mod prepared;
pub(crate) mod update_from;
