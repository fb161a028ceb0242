//! Parameters: values bound to a statement's placeholders (`$1`, `$2`, ...; the parser numbers
//! `?`), typed by what the statement implies for each.
//!
//! Clients send parameter values in whatever type they have (often strings); binding casts each
//! to the type its place in the statement needs, so a prepared lookup by a BIGINT key accepts
//! `'7'` as well as `7`, and a value that cannot be that type is an error naming the parameter.

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::LogicalPlan;

use crate::{Result, SqlError};

/// The types of a plan's positional parameters `$1..$n` (None where nothing implies one).
pub(crate) fn parameter_types(plan: &LogicalPlan) -> Result<Vec<Option<DataType>>> {
    let types = plan.get_parameter_types()?;
    let mut numbered = Vec::with_capacity(types.len());
    for i in 1..=types.len() {
        match types.get(&format!("${i}")) {
            Some(t) => numbered.push(t.clone()),
            None => {
                return Err(SqlError::Invalid(format!(
                    "parameters must be numbered $1 to ${} without gaps (or all be '?')",
                    types.len()
                )))
            }
        }
    }
    Ok(numbered)
}

/// Replaces the plan's placeholders by `params`, cast to the types the statement implies.
pub(crate) fn bind(plan: LogicalPlan, params: &[ScalarValue]) -> Result<LogicalPlan> {
    let types = parameter_types(&plan)?;
    if types.is_empty() && params.is_empty() {
        return Ok(plan);
    }
    Ok(plan.with_param_values(cast_params(&types, params)?)?)
}

/// `params` cast to `types`, the types a statement implies for its parameters (None: any).
pub(crate) fn cast_params(
    types: &[Option<DataType>],
    params: &[ScalarValue],
) -> Result<Vec<ScalarValue>> {
    if types.len() != params.len() {
        return Err(SqlError::Invalid(format!(
            "the statement has {} parameter(s) but {} value(s) were bound",
            types.len(),
            params.len()
        )));
    }
    params
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (value, expected))| match expected {
            Some(t) if value.data_type() != *t => value.cast_to(t).map_err(|_| {
                SqlError::Invalid(format!(
                    "parameter ${} = {value} cannot be used as {t}",
                    i + 1
                ))
            }),
            _ => Ok(value.clone()),
        })
        .collect()
}
