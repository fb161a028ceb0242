//! Table options: `CREATE TABLE ... WITH (...)` and `ALTER TABLE ... SET (...)`.

use datafusion::sql::sqlparser::ast::{Expr, SqlOption, Value, ValueWithSpan};

use crate::parse::statement::TableOptions;
use crate::{Result, SqlError};

/// A table's options, from `CREATE TABLE ... WITH (...)` or (`altering`) `ALTER TABLE ... SET
/// (...)`: `replicas = n` (CREATE only; whether the deployment can place n replicas is the
/// engine's to say) and `history_max_age_secs = n`.
pub(crate) fn table_options(options: &[SqlOption], altering: bool) -> Result<TableOptions> {
    let mut out = TableOptions::default();
    let supported = match altering {
        true => "history_max_age_secs = n",
        false => "replicas = n, history_max_age_secs = n",
    };
    for option in options {
        let whole = |value: &Expr, name: &str| -> Result<u64> {
            match value {
                Expr::Value(ValueWithSpan {
                    value: Value::Number(n, _),
                    ..
                }) => n.parse::<u64>().ok().filter(|&n| n >= 1),
                _ => None,
            }
            .ok_or_else(|| {
                SqlError::Invalid(format!("{name} must be a whole number from 1, got {value}"))
            })
        };
        match option {
            SqlOption::KeyValue { key, value }
                if !altering
                    && key.quote_style.is_none()
                    && key.value.eq_ignore_ascii_case("replicas") =>
            {
                let n = whole(value, "replicas")?;
                out.replicas = usize::try_from(n).map_err(|_| {
                    SqlError::Invalid(format!(
                        "replicas must be a whole number from 1, got {value}"
                    ))
                })?;
            }
            SqlOption::KeyValue { key, value }
                if key.quote_style.is_none()
                    && key.value.eq_ignore_ascii_case("history_max_age_secs") =>
            {
                let secs = whole(value, "history_max_age_secs")?;
                // A retention beyond a century is a mistake (and overflows microseconds).
                if secs > 100 * 365 * 24 * 3600 {
                    return Err(SqlError::Invalid(format!(
                        "history_max_age_secs must be at most a century, got {secs}"
                    )));
                }
                out.history_max_age_secs = Some(secs);
            }
            other => {
                return Err(SqlError::NotSupported(format!(
                    "table option '{other}' (supported: {supported})"
                )))
            }
        }
    }
    Ok(out)
}
