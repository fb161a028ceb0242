//! Statements answered or applied against the catalog without a DataFusion plan: DDL as the
//! parser produced it ([`apply`]) and SHOW / DESCRIBE ([`show`]).

pub(crate) mod apply;
pub(crate) mod show;
