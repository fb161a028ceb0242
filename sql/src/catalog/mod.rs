//! Nyala's tables as DataFusion sees them: the schema providers that look tables and views up
//! in the master's catalog at planning time ([`schema`], and `nyala.sys`, [`sys`]), the `TableProvider` of one table
//! ([`table::NyalaTable`]), and the filters it pushes into tablet scans ([`predicate`]).

pub(crate) mod hidden;
pub(crate) mod predicate;
pub(crate) mod schema;
pub(crate) mod sys;
pub(crate) mod table;
