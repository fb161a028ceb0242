//! Decimal arithmetic without a check per value.
//!
//! Arrow's `Decimal128` kernels multiply, add and subtract `i128`s with an overflow check on
//! every value — `mul_checked`, a call into the compiler's 128-bit overflow routine for each
//! row's product and again for rescaling an operand to the result's scale — which made decimal
//! arithmetic the largest cost of TPC-H q01 (`sum(l_extendedprice * (1 - l_discount) * (1 +
//! l_tax))`). No value of the result can overflow when bounds on the operands' magnitudes
//! cannot: [`DecimalArithmetic`](expr::DecimalArithmetic) checks that once per batch and then
//! computes with wrapping `i128` arithmetic, which is exact under that bound. Batches that could
//! overflow, and `/` and `%`, go to arrow's kernels as DataFusion's `BinaryExpr` would, so
//! results, types and errors are the same either way.
//!
//! - [`expr`]: `DecimalArithmetic`, the expression;
//! - [`rule`]: [`DecimalArithmeticRule`], the physical optimizer rule that puts it in place of
//!   each decimal `+`, `-`, `*`, `/` and `%` (all five, so that EXPLAIN's parentheses come out
//!   as DataFusion's) in projections, filters and aggregates' arguments — not in plans split
//!   into stages across servers, whose codec cannot carry it.

pub(crate) mod expr;
pub(crate) mod rule;

pub use rule::DecimalArithmeticRule;
