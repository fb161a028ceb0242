//! Functions PostgreSQL clients call that `datafusion-pg-catalog` does not define, or defines
//! otherwise than Nyala answers.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, ListArray, StructArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{exec_err, Result, ScalarValue};
use datafusion::logical_expr::{
    create_udf, ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// What `version()` says to PostgreSQL clients.
const VERSION: &str = concat!(
    "PostgreSQL 16.6 (Nyala ",
    env!("CARGO_PKG_VERSION"),
    ") on x86_64-pc-linux-gnu"
);

pub(super) fn all() -> Vec<ScalarUDF> {
    vec![
        version(),
        type_is_visible(),
        ScalarUDF::from(ExpandArray::new()),
    ]
}

/// `version()` as PostgreSQL's (clients such as SQLAlchemy read the server's version from it).
fn version() -> ScalarUDF {
    let version = |_: &[ColumnarValue]| {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            VERSION.into(),
        ))))
    };
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(version),
    )
}

/// `pg_type_is_visible(oid)`: every type is (Nyala has one schema; clients list domains with
/// it, of which there are none).
fn type_is_visible() -> ScalarUDF {
    let visible = |args: &[ColumnarValue]| {
        let rows = match args.first() {
            Some(ColumnarValue::Array(array)) => array.len(),
            _ => return Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true)))),
        };
        let all = BooleanArray::from(vec![true; rows]);
        Ok(ColumnarValue::Array(Arc::new(all)))
    };
    create_udf(
        "pg_type_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(visible),
    )
}

/// `pg_expandarray(list)`: each list's elements with their positions, as a list of
/// `{x: element, n: position from 1}` — PostgreSQL's `information_schema._pg_expandarray`,
/// which returns them as rows; a rewritten query unnests the list (see `rewrite`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ExpandArray {
    signature: Signature,
}

impl ExpandArray {
    fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }

    fn fields() -> Fields {
        Fields::from(vec![
            Field::new("x", DataType::Int32, true),
            Field::new("n", DataType::Int32, false),
        ])
    }
}

impl ScalarUDFImpl for ExpandArray {
    fn name(&self) -> &str {
        "pg_expandarray"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        let element = Field::new_list_field(DataType::Struct(Self::fields()), true);
        Ok(DataType::List(Arc::new(element)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let args = ColumnarValue::values_to_arrays(&args.args)?;
        let Some(lists) = args.first().and_then(|a| a.as_list_opt::<i32>()) else {
            return exec_err!("pg_expandarray expects an array of integers");
        };
        let elements = cast(lists.values(), &DataType::Int32)?;
        let mut positions = vec![0; elements.len()];
        for window in lists.offsets().windows(2) {
            let (start, end) = (window[0] as usize, window[1] as usize);
            for (n, position) in positions[start..end].iter_mut().enumerate() {
                *position = n as i32 + 1;
            }
        }
        let positions: ArrayRef = Arc::new(Int32Array::from(positions));
        let rows = StructArray::try_new(Self::fields(), vec![elements, positions], None)?;
        let DataType::List(element) = self.return_type(&[])? else {
            return exec_err!("pg_expandarray returns a list");
        };
        let expanded = ListArray::try_new(
            element,
            lists.offsets().clone(),
            Arc::new(rows),
            lists.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(expanded)))
    }
}
