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

/// The most parameters a statement may have (PostgreSQL's protocol counts them in 16 bits).
const MAX_PARAMETERS: usize = 65_535;

/// The types of a plan's positional parameters `$1..$n`, `$n` the highest it uses (None where
/// nothing implies one, or the statement does not use it: as in PostgreSQL, a value may be
/// bound to a parameter the statement leaves out).
pub(crate) fn parameter_types(plan: &LogicalPlan) -> Result<Vec<Option<DataType>>> {
    let types = plan.get_parameter_types()?;
    let mut numbered: Vec<Option<DataType>> = Vec::with_capacity(types.len());
    for (name, data_type) in types {
        let index = (name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=MAX_PARAMETERS).contains(n))
            .ok_or_else(|| {
                SqlError::Invalid(format!(
                    "parameter {name}: a statement has at most {MAX_PARAMETERS} parameters, \
                     numbered from $1 (or all '?')"
                ))
            })?;
        if numbered.len() < index {
            numbered.resize(index, None);
        }
        numbered[index - 1] = data_type;
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
