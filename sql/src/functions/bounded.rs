//! Scalar functions whose result size the arguments choose (`repeat('x', 2000000000)`,
//! `lpad(s, 1e9)`), bounded: DataFusion's implementations allocate whatever is asked, and an
//! allocation the machine cannot satisfy aborts the whole server. [`Bounded`] wraps such a
//! function and refuses a call whose result would exceed [`MAX_VALUE_BYTES`] per value or
//! [`MAX_RESULT_BYTES`] per batch before the function runs (constant folding runs it while
//! planning, so a constant call is refused before the statement starts).

use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::compute::kernels::aggregate::max;
use arrow::compute::kernels::length::length;
use arrow::compute::{cast, CastOptions};
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};
use datafusion::prelude::SessionContext;

/// Most bytes of one value a bounded function may make.
pub const MAX_VALUE_BYTES: i64 = 64 << 20;
/// Most bytes of all values one call (one batch of rows) of a bounded function may make.
pub const MAX_RESULT_BYTES: i64 = 1 << 30;

/// How a bounded function's result size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: the length of `s` times `n`.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters, up to 4 bytes each.
    Pad,
    /// `range(start, stop [, step])`, `generate_series`: a list of (stop - start) / step
    /// integers (when its arguments are integers).
    Range,
    /// `array_repeat(x, n)`: a list of `n` elements, at least 8 bytes each.
    ArrayRepeat,
}

/// Replaces the session's functions that grow their result with [`Bounded`] ones.
pub fn bound_growing_functions(ctx: &SessionContext) {
    for (name, growth) in [
        ("repeat", Growth::Repeat),
        ("lpad", Growth::Pad),
        ("rpad", Growth::Pad),
        ("range", Growth::Range),
        ("generate_series", Growth::Range),
        ("array_repeat", Growth::ArrayRepeat),
    ] {
        if let Ok(inner) = ctx.udf(name) {
            ctx.register_udf(ScalarUDF::new_from_impl(Bounded { inner, growth }));
        }
    }
}

/// A function whose result size is checked before it runs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Bounded {
    inner: Arc<ScalarUDF>,
    growth: Growth,
}

impl Bounded {
    /// The largest value (bytes) a call would make for one row, and for all its rows.
    fn result_bytes(&self, args: &ScalarFunctionArgs) -> Result<(i64, i64)> {
        let arg = |i: usize| args.args.get(i);
        let per_value = match (self.growth, arg(0), arg(1)) {
            (Growth::Repeat, Some(s), Some(n)) => max_length(s)?.saturating_mul(max_i64(n)?),
            (Growth::Pad | Growth::ArrayRepeat, _, Some(n)) => max_i64(n)?.saturating_mul(4),
            (Growth::Range, Some(start), Some(stop)) => {
                let step = match arg(2) {
                    Some(step) => min_abs_i64(step)?,
                    None => Some(1),
                };
                match (min_i64(start)?, max_i64(stop)?, step) {
                    (Some(start), stop, Some(step)) if step != 0 => {
                        (stop.saturating_sub(start) / step).saturating_mul(8)
                    }
                    _ => 0,
                }
            }
            // One argument: `range(stop)` counts from 0.
            (Growth::Range, Some(stop), None) => max_i64(stop)?.saturating_mul(8),
            _ => 0,
        };
        let per_value = per_value.max(0);
        let rows = i64::try_from(args.number_rows.max(1)).unwrap_or(i64::MAX);
        Ok((per_value, per_value.saturating_mul(rows)))
    }
}

/// An argument's values as integers (None: not integers, e.g. dates and intervals).
fn ints(arg: &ColumnarValue) -> Result<Option<arrow::array::ArrayRef>> {
    let array = arg.to_array(1)?;
    Ok(array
        .data_type()
        .is_integer()
        .then(|| cast(&array, &DataType::Int64))
        .transpose()?)
}

/// The largest value of an integer argument (0 if none, or not integers).
fn max_i64(arg: &ColumnarValue) -> Result<i64> {
    Ok(ints(arg)?
        .and_then(|a| max(a.as_primitive::<Int64Type>()))
        .unwrap_or(0))
}

/// The smallest value of an integer argument (None if none, or not integers).
fn min_i64(arg: &ColumnarValue) -> Result<Option<i64>> {
    Ok(ints(arg)?
        .and_then(|a| arrow::compute::kernels::aggregate::min(a.as_primitive::<Int64Type>())))
}

/// The smallest magnitude of an integer argument (None if none, or not integers).
fn min_abs_i64(arg: &ColumnarValue) -> Result<Option<i64>> {
    Ok(ints(arg)?.and_then(|a| {
        a.as_primitive::<Int64Type>()
            .iter()
            .flatten()
            .map(i64::unsigned_abs)
            .min()
            .map(|m| i64::try_from(m).unwrap_or(i64::MAX))
    }))
}

/// The longest string (in bytes) of a string argument (0 if none).
fn max_length(arg: &ColumnarValue) -> Result<i64> {
    let array = arg.to_array(1)?;
    let options = CastOptions::default();
    let array = match array.data_type() {
        DataType::Utf8View => arrow::compute::cast_with_options(&array, &DataType::Utf8, &options)?,
        _ => array,
    };
    let lengths = cast(&length(&array)?, &DataType::Int64)?;
    Ok(max(lengths.as_primitive::<Int64Type>()).unwrap_or(0))
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (per_value, total) = self.result_bytes(&args)?;
        if per_value > MAX_VALUE_BYTES || total > MAX_RESULT_BYTES {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{}(...) would make {} MiB (at most {} MiB per value and {} MiB per batch of \
                 rows)",
                self.name(),
                total.max(per_value) >> 20,
                MAX_VALUE_BYTES >> 20,
                MAX_RESULT_BYTES >> 20
            )));
        }
        self.inner.invoke_with_args(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(ctx: &SessionContext, sql: &str) -> Result<String> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(arrow::util::pretty::pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn huge_results_are_refused_small_ones_made() {
        let ctx = SessionContext::new();
        bound_growing_functions(&ctx);
        for sql in [
            "SELECT repeat('x', 2000000000)",
            "SELECT lpad('x', 1000000000)",
            "SELECT repeat(s, 100000) FROM (VALUES (repeat('y', 1000))) AS t(s)",
            "SELECT array_length(range(1, 3000000000))",
            "SELECT generate_series(1, 3000000000, 1)",
            "SELECT array_repeat(1, 1000000000)",
        ] {
            let refused = run(&ctx, sql).await.unwrap_err().to_string();
            assert!(refused.contains("would make"), "{sql}: {refused}");
        }
        let text = run(
            &ctx,
            "SELECT lpad('a', 5, '-'), repeat('ab', 3), array_length(range(1, 10, 3)), \
             range(DATE '2024-01-01', DATE '2024-01-03', INTERVAL '1' DAY)",
        )
        .await
        .unwrap();
        assert!(text.contains("----a") && text.contains("ababab"), "{text}");
        assert!(
            text.contains("| 3 ") && text.contains("2024-01-02"),
            "{text}"
        );
    }
}
