//! SQL text → [`NyalaStatement`](statement::NyalaStatement): the first stop of every statement.
//!
//! [`parser::NyalaParser`] reads sqlparser's grammar with Nyala's added (its own statements in
//! `parser/`, syntax nested in sqlparser's statements through the hooks of
//! [`dialect::NyalaDialect`]); what it produces is [`statement`]'s vocabulary. Column
//! definitions become a storage schema in [`columns`], partitioning clauses a
//! [`partitioning::PartitionSpec`], table options [`table_options`]. Nothing here reads the
//! catalog.

pub(crate) mod columns;
pub(crate) mod dialect;
pub mod parser;
pub mod partitioning;
pub mod statement;
pub(crate) mod table_options;
