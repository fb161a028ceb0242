//! The physical operators Nyala adds to DataFusion's plans: the tablet scan ([`scan`]), the
//! runtime filters joins hand to it ([`runtime_filter`]), decimal arithmetic without a check
//! per value ([`decimal`]), the conditional writes of UPDATE and DELETE ([`mutation`]), rows a
//! statement's step keeps for the next ([`staged`]).

pub(crate) mod decimal;
pub(crate) mod mutation;
pub(crate) mod probe_slices;
pub mod runtime_filter;
pub(crate) mod scan;
pub(crate) mod sink;
pub(crate) mod staged;
pub(crate) mod tail;
