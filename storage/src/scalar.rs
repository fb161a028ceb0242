//! One value of a column, as a one-element Arrow array of the column's type: what predicates
//! compare columns with, and the bounds of a join filter.

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;

#[derive(Clone, Debug)]
pub struct Scalar(pub ArrayRef);

impl Scalar {
    /// The value for a comparison with an array of type `data_type`: a string value meets
    /// `Utf8View` columns (rowsets decode strings into views) as a view.
    pub(crate) fn datum_of(
        &self,
        data_type: &DataType,
    ) -> Result<arrow::array::Scalar<ArrayRef>, arrow::error::ArrowError> {
        match self.0.data_type() == data_type {
            true => Ok(arrow::array::Scalar::new(self.0.clone())),
            false => arrow::compute::cast(&self.0, data_type).map(arrow::array::Scalar::new),
        }
    }
}
