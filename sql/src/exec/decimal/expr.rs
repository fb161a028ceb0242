//! [`DecimalArithmetic`]: a `Decimal128` `+`, `-`, `*`, `/` or `%` that computes `+`, `-` and `*`
//! without a check per value when the batch cannot overflow.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Array};
use arrow::buffer::NullBuffer;
use arrow::compute::kernels::numeric::{add_wrapping, div, mul_wrapping, rem, sub_wrapping};
use arrow::datatypes::{DataType, Decimal128Type, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::datum::apply;
use datafusion::physical_expr_common::physical_expr::fmt_sql;

/// `left op right` over two `Decimal128` operands, with the result type DataFusion planned
/// (`result`); evaluates as DataFusion's `BinaryExpr` does but for the fast path (module
/// documentation).
#[derive(Debug, Clone, Eq)]
pub(crate) struct DecimalArithmetic {
    left: Arc<dyn PhysicalExpr>,
    op: Operator,
    right: Arc<dyn PhysicalExpr>,
    result: DataType,
}

// Written out for `Arc<dyn PhysicalExpr>` fields, as DataFusion's `BinaryExpr` does.
impl PartialEq for DecimalArithmetic {
    fn eq(&self, other: &Self) -> bool {
        self.left.eq(&other.left)
            && self.op == other.op
            && self.right.eq(&other.right)
            && self.result == other.result
    }
}

impl Hash for DecimalArithmetic {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.left.hash(state);
        self.op.hash(state);
        self.right.hash(state);
        self.result.hash(state);
    }
}

impl DecimalArithmetic {
    /// `left op right`, whose result is `result` (a `Decimal128` type); `op` one of `+`, `-`,
    /// `*`, `/`, `%`.
    pub(crate) fn new(
        left: Arc<dyn PhysicalExpr>,
        op: Operator,
        right: Arc<dyn PhysicalExpr>,
        result: DataType,
    ) -> Self {
        Self {
            left,
            op,
            right,
            result,
        }
    }

    /// The result computed with wrapping arithmetic, if bounds on the operands' magnitudes show
    /// that no value of it can overflow; None otherwise (and for `/` and `%`, for two scalars, a
    /// NULL scalar or a result scale that is not the operation's).
    fn without_checks(&self, lhs: &ColumnarValue, rhs: &ColumnarValue) -> Option<ArrayRef> {
        let DataType::Decimal128(precision, scale) = self.result else {
            return None;
        };
        let (l, l_scale) = Operand::of(lhs)?;
        let (r, r_scale) = Operand::of(rhs)?;
        if matches!((&l, &r), (Operand::Value(_), Operand::Value(_))) {
            return None;
        }
        let fits = |bound: Option<u128>| bound.is_some_and(|b| b <= i128::MAX as u128);
        let (values, nulls) = match self.op {
            Operator::Multiply => {
                if scale != l_scale.checked_add(r_scale)? || !fits(l.bound().checked_mul(r.bound()))
                {
                    return None;
                }
                zip(&l, &r, |a, b| a.wrapping_mul(b))
            }
            Operator::Plus | Operator::Minus => {
                if scale != l_scale.max(r_scale) {
                    return None;
                }
                // Each operand rescaled to the result's scale, as arrow's kernel does.
                // (Scales differ by up to 166 with negative ones: widened before subtracting.)
                let rescale = |from: i8| {
                    let digits = u32::try_from(i16::from(scale) - i16::from(from)).ok()?;
                    10i128.checked_pow(digits)
                };
                let (l_mul, r_mul) = (rescale(l_scale)?, rescale(r_scale)?);
                let l_bound = l.bound().checked_mul(l_mul as u128);
                let r_bound = r.bound().checked_mul(r_mul as u128);
                if !fits(l_bound.zip(r_bound).and_then(|(a, b)| a.checked_add(b))) {
                    return None;
                }
                match self.op {
                    Operator::Plus => zip(&l, &r, |a, b| {
                        a.wrapping_mul(l_mul).wrapping_add(b.wrapping_mul(r_mul))
                    }),
                    _ => zip(&l, &r, |a, b| {
                        a.wrapping_mul(l_mul).wrapping_sub(b.wrapping_mul(r_mul))
                    }),
                }
            }
            _ => return None,
        };
        let array = Decimal128Array::new(values.into(), nulls)
            .with_precision_and_scale(precision, scale)
            .ok()?;
        Some(Arc::new(array))
    }
}

/// One operand of a fast-path operation: an array's values, or one value for every row.
enum Operand<'a> {
    Array(&'a Decimal128Array),
    Value(i128),
}

impl<'a> Operand<'a> {
    /// `value` as an operand, with its scale; None if it is not a `Decimal128` or is a NULL
    /// scalar.
    fn of(value: &'a ColumnarValue) -> Option<(Self, i8)> {
        match value {
            ColumnarValue::Array(array) => match array.data_type() {
                DataType::Decimal128(_, scale) => Some((
                    Operand::Array(array.as_primitive_opt::<Decimal128Type>()?),
                    *scale,
                )),
                _ => None,
            },
            ColumnarValue::Scalar(ScalarValue::Decimal128(Some(v), _, scale)) => {
                Some((Operand::Value(*v), *scale))
            }
            ColumnarValue::Scalar(_) => None,
        }
    }

    /// A bound on the values' magnitudes (NULL slots included: whatever they hold): the
    /// smallest power of two at least as large as each. (An OR of the values' bits, cheaper
    /// than their maximum.)
    fn bound(&self) -> u128 {
        // `v ^ (v >> 127)` is `v` for a positive `v`, `-v - 1` for a negative one: below 2^b
        // exactly when |v| <= 2^b.
        let bits = match self {
            Operand::Array(array) => {
                (array.values().iter()).fold(0u128, |m, &v| m | (v ^ (v >> 127)) as u128)
            }
            &Operand::Value(v) => (v ^ (v >> 127)) as u128,
        };
        1 << (128 - bits.leading_zeros())
    }
}

/// `f` of each row's two operands, and the rows where either is NULL.
fn zip(
    l: &Operand,
    r: &Operand,
    f: impl Fn(i128, i128) -> i128,
) -> (Vec<i128>, Option<NullBuffer>) {
    match (l, r) {
        (Operand::Array(a), Operand::Array(b)) => (
            (a.values().iter().zip(b.values().iter()))
                .map(|(&x, &y)| f(x, y))
                .collect(),
            NullBuffer::union(a.nulls(), b.nulls()),
        ),
        (Operand::Array(a), &Operand::Value(y)) => (
            a.values().iter().map(|&x| f(x, y)).collect(),
            a.nulls().cloned(),
        ),
        (&Operand::Value(x), Operand::Array(b)) => (
            b.values().iter().map(|&y| f(x, y)).collect(),
            b.nulls().cloned(),
        ),
        (Operand::Value(_), Operand::Value(_)) => unreachable!("two scalars take arrow's path"),
    }
}

/// The precedence of `expr`'s operator if it is a binary operation (for parentheses).
fn precedence(expr: &dyn PhysicalExpr) -> Option<u8> {
    match expr.downcast_ref::<BinaryExpr>() {
        Some(binary) => Some(binary.op().precedence()),
        None => (expr.downcast_ref::<DecimalArithmetic>()).map(|d| d.op.precedence()),
    }
}

impl DecimalArithmetic {
    /// Writes the operation as `BinaryExpr` does: a child operation in parentheses when its
    /// operator binds less tightly; each child with `child`.
    fn write(
        &self,
        f: &mut fmt::Formatter,
        child: impl Fn(&mut fmt::Formatter, &dyn PhysicalExpr) -> fmt::Result,
    ) -> fmt::Result {
        let outer = self.op.precedence();
        let side = |f: &mut fmt::Formatter, expr: &Arc<dyn PhysicalExpr>| match precedence(
            expr.as_ref(),
        ) {
            Some(p) if p == 0 || p < outer => {
                write!(f, "(")?;
                child(f, expr.as_ref())?;
                write!(f, ")")
            }
            _ => child(f, expr.as_ref()),
        };
        side(f, &self.left)?;
        write!(f, " {} ", self.op)?;
        side(f, &self.right)
    }
}

impl fmt::Display for DecimalArithmetic {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.write(f, |f, expr| write!(f, "{expr}"))
    }
}

impl PhysicalExpr for DecimalArithmetic {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(self.result.clone())
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        Ok(self.left.nullable(input_schema)? || self.right.nullable(input_schema)?)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let lhs = self.left.evaluate(batch)?;
        let rhs = self.right.evaluate(batch)?;
        if let Some(array) = self.without_checks(&lhs, &rhs) {
            return Ok(ColumnarValue::Array(array));
        }
        // Arrow's kernels, as `BinaryExpr` calls them (its decimal `*_wrapping` kernels check
        // for overflow all the same).
        match self.op {
            Operator::Plus => apply(&lhs, &rhs, add_wrapping),
            Operator::Minus => apply(&lhs, &rhs, sub_wrapping),
            Operator::Multiply => apply(&lhs, &rhs, mul_wrapping),
            Operator::Divide => apply(&lhs, &rhs, div),
            _ => apply(&lhs, &rhs, rem),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.left, &self.right]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [left, right]: [Arc<dyn PhysicalExpr>; 2] = children.try_into().map_err(|_| {
            datafusion::error::DataFusionError::Internal(
                "a decimal operation takes two children".into(),
            )
        })?;
        Ok(Arc::new(Self::new(
            left,
            self.op,
            right,
            self.result.clone(),
        )))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, |f, expr| write!(f, "{}", fmt_sql(expr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{col, lit};

    fn batch(columns: Vec<(&str, Decimal128Array)>) -> RecordBatch {
        let fields: Vec<Field> = (columns.iter())
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
            .collect();
        let arrays: Vec<ArrayRef> = columns.into_iter().map(|(_, a)| Arc::new(a) as _).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
    }

    fn decimals(values: &[Option<i128>], precision: u8, scale: i8) -> Decimal128Array {
        Decimal128Array::from(values.to_vec())
            .with_precision_and_scale(precision, scale)
            .unwrap()
    }

    /// `left op right` both ways: as `BinaryExpr` and as `DecimalArithmetic`, with whether the
    /// fast path took it.
    fn both(
        batch: &RecordBatch,
        left: Arc<dyn PhysicalExpr>,
        op: Operator,
        right: Arc<dyn PhysicalExpr>,
    ) -> (Result<ArrayRef>, Result<ArrayRef>, bool) {
        let schema = batch.schema();
        let binary = BinaryExpr::new(left.clone(), op, right.clone());
        let result = binary.data_type(&schema).unwrap();
        let decimal = DecimalArithmetic::new(left.clone(), op, right.clone(), result);
        let arrays = |expr: &dyn PhysicalExpr| {
            expr.evaluate(batch)
                .and_then(|v| v.into_array(batch.num_rows()))
        };
        let fast = decimal
            .without_checks(
                &left.evaluate(batch).unwrap(),
                &right.evaluate(batch).unwrap(),
            )
            .is_some();
        (arrays(&binary), arrays(&decimal), fast)
    }

    /// Both results alike: the same type, NULLs and values (what NULL slots hold aside), or
    /// the same error.
    fn assert_same(expected: Result<ArrayRef>, got: Result<ArrayRef>, label: &str) {
        match (expected, got) {
            (Ok(expected), Ok(got)) => {
                assert_eq!(expected.data_type(), got.data_type(), "{label}");
                assert_eq!(expected.nulls(), got.nulls(), "{label}");
                let (expected, got) = (
                    expected.as_primitive::<Decimal128Type>(),
                    got.as_primitive::<Decimal128Type>(),
                );
                for i in (0..expected.len()).filter(|&i| expected.is_valid(i)) {
                    assert_eq!(expected.value(i), got.value(i), "{label} row {i}");
                }
            }
            (Err(e), Err(g)) => assert_eq!(e.to_string(), g.to_string(), "{label}"),
            (e, g) => panic!("{label}: {e:?} against {g:?}"),
        }
    }

    #[test]
    fn results_match_arrows_kernels() {
        let big = 10i128.pow(37);
        let b = batch(vec![
            (
                "a",
                decimals(&[Some(1999), None, Some(-5), Some(0), Some(123_456)], 15, 2),
            ),
            (
                "b",
                decimals(&[Some(7), Some(3), None, Some(-12), Some(9)], 10, 0),
            ),
            (
                "c",
                decimals(&[Some(4), Some(1), Some(2), Some(3), Some(5)], 15, 4),
            ),
            (
                "huge",
                decimals(&[Some(big), Some(-big), Some(1), Some(2), Some(3)], 38, 0),
            ),
        ]);
        let schema = b.schema();
        let c = |name| col(name, &schema).unwrap();
        let one = lit(ScalarValue::Decimal128(Some(1), 20, 0));
        let cases: Vec<(Arc<dyn PhysicalExpr>, Operator, Arc<dyn PhysicalExpr>, bool)> = vec![
            (c("a"), Operator::Multiply, c("b"), true),
            (c("a"), Operator::Plus, c("c"), true),
            (c("c"), Operator::Minus, c("a"), true),
            (one.clone(), Operator::Minus, c("c"), true),
            (c("a"), Operator::Multiply, one.clone(), true),
            (c("a"), Operator::Divide, c("b"), false),
            (c("a"), Operator::Modulo, c("b"), false),
            // Could overflow: arrow's kernel decides (and errors where a value does).
            (c("huge"), Operator::Multiply, c("huge"), false),
            (c("huge"), Operator::Multiply, c("a"), false),
            (c("huge"), Operator::Minus, c("a"), false),
            // 2 * 10^37 is below i128's limit, and so are the bounds (2^124).
            (c("huge"), Operator::Plus, c("huge"), true),
            // 12 * 10^37 is too, but not the bounds (2^123 * 2^4): arrow's kernel computes it.
            (c("huge"), Operator::Multiply, c("b"), false),
        ];
        // Scales far apart (negative ones too): the fast path declines without overflowing
        // the scale arithmetic (arrow's own kernel is not asked: it panics on such scales).
        let n = ColumnarValue::Array(Arc::new(decimals(&[Some(5), Some(-7)], 10, -100)));
        let p = ColumnarValue::Array(Arc::new(decimals(&[Some(1), Some(2)], 38, 38)));
        let far = DecimalArithmetic::new(
            lit(ScalarValue::Decimal128(None, 10, -100)),
            Operator::Plus,
            lit(ScalarValue::Decimal128(None, 38, 38)),
            DataType::Decimal128(38, 38),
        );
        assert!(far.without_checks(&n, &p).is_none());
        for (left, op, right, fast) in cases {
            let label = format!("{left} {op} {right}");
            let (expected, got, took_fast) = both(&b, left, op, right);
            assert_eq!(took_fast, fast, "{label}");
            assert_same(expected, got, &label);
        }
    }

    #[test]
    fn random_values_agree_with_arrow() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut paths = [0; 2];
        for round in 0..200 {
            // Magnitudes from a few digits to near i128's limit, so both paths are taken.
            let digits = (next() % 38) as u32 + 1;
            let value = |n: u64| -> Option<i128> {
                (n % 11 != 0).then(|| {
                    let v = (n as i128 * 0x9e37_79b9) % 10i128.pow(digits);
                    if n % 3 == 0 {
                        -v
                    } else {
                        v
                    }
                })
            };
            let a: Vec<_> = (0..64).map(|_| value(next())).collect();
            let b: Vec<_> = (0..64).map(|_| value(next())).collect();
            let scales = ((next() % 5) as i8, (next() % 5) as i8);
            let input = batch(vec![
                ("a", decimals(&a, 38, scales.0)),
                ("b", decimals(&b, 38, scales.1)),
            ]);
            let schema = input.schema();
            for op in [Operator::Plus, Operator::Minus, Operator::Multiply] {
                let (expected, got, fast) = both(
                    &input,
                    col("a", &schema).unwrap(),
                    op,
                    col("b", &schema).unwrap(),
                );
                assert_same(expected, got, &format!("round {round} {op}"));
                paths[usize::from(fast)] += 1;
            }
        }
        assert!(paths[0] > 50 && paths[1] > 50, "rows by path: {paths:?}");
    }

    #[test]
    fn displays_as_binary_expr_does() {
        let b = batch(vec![
            ("a", decimals(&[Some(1)], 15, 2)),
            ("b", decimals(&[Some(1)], 15, 2)),
        ]);
        let schema = b.schema();
        let one = lit(ScalarValue::Decimal128(Some(1), 20, 0));
        let inner = BinaryExpr::new(one, Operator::Minus, col("b", &schema).unwrap());
        let result = inner.data_type(&schema).unwrap();
        let binary_inner: Arc<dyn PhysicalExpr> = Arc::new(inner.clone());
        let decimal_inner: Arc<dyn PhysicalExpr> = Arc::new(DecimalArithmetic::new(
            inner.left().clone(),
            Operator::Minus,
            inner.right().clone(),
            result,
        ));
        let a = col("a", &schema).unwrap();
        let binary = BinaryExpr::new(a.clone(), Operator::Multiply, binary_inner);
        let outer = binary.data_type(&schema).unwrap();
        let decimal = DecimalArithmetic::new(a, Operator::Multiply, decimal_inner, outer);
        assert_eq!(decimal.to_string(), binary.to_string());
        assert_eq!(fmt_sql(&decimal).to_string(), fmt_sql(&binary).to_string());
        assert_eq!(decimal.to_string(), "a@0 * (1 - b@1)");
    }
}
