//! Functions Nyala registers in every session: the table functions `nyala_as_of` ([`as_of`],
//! what `AS OF` becomes), `tail` ([`tail`], a queue's long poll) and `changes` ([`changes`], a
//! table's change stream), and DataFusion's scalar functions whose result size the arguments
//! choose, bounded ([`bounded`]); [`parameters`]: a parameter where a table function needs a
//! constant.

pub(crate) mod as_of;
pub(crate) mod bounded;
pub(crate) mod changes;
pub(crate) mod parameters;
pub(crate) mod tail;
