//! Runtime filters: when a hash join's build side is small, the min/max and a bloom filter of
//! its join keys are pushed into the Nyala scans of the probe side, so tablets skip rowsets,
//! row groups and rows that cannot match instead of shipping the whole table to the join
//! (`kudu-bloom-filter-predicate.txt`).
//!
//! [`RuntimeFilterRule`] (a physical optimizer rule) finds hash joins (collecting their build
//! side, `PartitionMode::CollectLeft`, or hash-partitioning both, `Partitioned`) whose
//! probe-side join keys are columns of a Nyala table reached through projections, filters,
//! repartitioning, aggregates grouping by them and other hash joins (into a side whose values
//! reach the join's output unchanged and whose rows the filter may drop). It wraps the build
//! side in a [`RuntimeFilterBuildExec`], which passes the build rows through to the join and,
//! when those of every partition are seen, publishes one [`KeyFilter`] per key into a shared
//! [`FilterSlot`]. Each probe-side [`NyalaScanExec`] waits for the slot before it starts its
//! tablet scan and adds the filters to the scan's predicates. A join partition polls its probe
//! side only after its build side is complete, and build sides never read the probe side, so
//! the wait never holds anything up (a scan a `CoalescePartitionsExec` starts at once, below a
//! lower join's build side, waits for the upper join's build side, which does not need it). A
//! plan run again (each step of a recursive query) empties the slot first: its scans wait for
//! that run's keys.
//!
//! DataFusion's own dynamic filters (a hash join's keys, a TopK's threshold) reach the scans
//! through DataFusion's filter pushdown, which in DataFusion 55 finds a filter's column in an
//! operator's input by *name*. Where a schema names two columns alike (`b.id` and `c.id` after
//! a join) a filter on the second lands on the first (apache/datafusion#25244, #25296): a scan
//! would drop rows by another column's values, even on the side an outer join preserves. So
//! the rule first follows each dynamic filter down by column position and takes it from the
//! scans it did not reach that way (`keep_routed_dynamic_filters`).
//!
//! The filters are an optimisation only: the join still matches every row exactly, so a filter
//! may be skipped (unsupported types, a bloom filter that switched itself off) at any point.
//! `SET nyala.runtime_filters = 'off' | 'minmax' | 'bloom'` chooses what is built (default
//! `bloom`: min/max and bloom); `off` also ignores DataFusion's own dynamic filters.
//!
//! - [`filter`]: the filters and the slot a build side publishes them into;
//! - [`build`]: [`RuntimeFilterBuildExec`], which builds them from the build rows;
//! - [`rule`]: [`RuntimeFilterRule`], which places the build operator and the scans' filters;
//! - `routing`: DataFusion's dynamic filters kept on the columns they were made for;
//! - `tablet_keys`: a filter's listed keys narrowed to the tablet a scan reads.

pub mod build;
pub mod filter;
mod routing;
pub mod rule;
pub(crate) mod tablet_keys;

pub use crate::session::settings::RuntimeFilterMode;
pub use build::RuntimeFilterBuildExec;
pub use filter::{FilterSlot, KeyFilter, RuntimeFilter};
pub use rule::RuntimeFilterRule;
