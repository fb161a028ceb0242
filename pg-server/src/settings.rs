//! PostgreSQL's session parameters, which clients set and read as they connect and work:
//! `SET extra_float_digits = 3`, `SET DateStyle = 'ISO'`, `SHOW transaction_isolation`,
//! `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`, ... They are the connection's (kept with
//! its startup parameters, where the result encoders read DateStyle, IntervalStyle,
//! bytea_output and extra_float_digits); Nyala's own settings (`nyala.*`, `datafusion.*`,
//! `statement_timeout`) are the session's, set and shown by the session as over Flight SQL.
//!
//! Transactions run at REPEATABLE READ (snapshot isolation). A client asking for READ
//! COMMITTED gets REPEATABLE READ, which never shows it less; SERIALIZABLE is refused.

use datafusion::sql::sqlparser::ast::{
    Expr, Set, Statement, TransactionIsolationLevel, TransactionMode, Value,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use nyala_server::ServerError;
use nyala_sql::SqlError;

/// A statement about a PostgreSQL session parameter, answered by the front end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParameterStatement {
    Set {
        name: String,
        value: String,
    },
    Show(String),
    /// `SET [SESSION CHARACTERISTICS AS] TRANSACTION ...` at an isolation Nyala gives.
    SetTransaction,
}

/// The parameters clients may set (lower case); SHOW answers them too, and those below.
const SETTABLE: &[&str] = &[
    "application_name",
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "timezone",
    "extra_float_digits",
    "search_path",
    "bytea_output",
    "client_min_messages",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "standard_conforming_strings",
    "default_transaction_read_only",
    "idle_in_transaction_session_timeout",
    "lock_timeout",
    "jit",
    "escape_string_warning",
    "synchronous_commit",
];

/// What SHOW says of a parameter the connection did not set.
fn default_value(name: &str) -> Option<&'static str> {
    Some(match name {
        "server_version" => "16.6",
        "server_version_num" => "160006",
        "server_encoding" | "client_encoding" => "UTF8",
        "datestyle" => "ISO, MDY",
        "intervalstyle" => "postgres",
        "timezone" => "Etc/UTC",
        "integer_datetimes" | "standard_conforming_strings" => "on",
        "transaction_isolation" | "default_transaction_isolation" => "repeatable read",
        "transaction_read_only" | "default_transaction_read_only" => "off",
        "search_path" => "public",
        "extra_float_digits" => "1",
        "bytea_output" => "hex",
        "max_identifier_length" => "63",
        "is_superuser" => "off",
        "application_name" => "",
        "client_min_messages" => "notice",
        "lc_messages" | "lc_monetary" | "lc_numeric" | "lc_time" => "C",
        "idle_in_transaction_session_timeout" | "lock_timeout" => "0",
        "jit" => "off",
        "escape_string_warning" | "synchronous_commit" => "on",
        _ => return None,
    })
}

/// The value SHOW gives for `name`, from what the connection set (`set`) or the default.
pub(crate) fn shown(name: &str, set: Option<&String>) -> Result<String, ServerError> {
    match (set, default_value(name)) {
        (Some(value), _) => Ok(value.clone()),
        (None, Some(value)) => Ok(value.to_string()),
        (None, None) => Err(unknown(name)),
    }
}

fn unknown(name: &str) -> ServerError {
    ServerError::invalid(format!("unrecognized configuration parameter \"{name}\""))
}

/// `sql` as a statement about a PostgreSQL parameter; None for other statements (Nyala's own
/// settings among them, which `is_nyala` recognises).
pub(crate) fn recognise(
    sql: &str,
    is_nyala: impl Fn(&str) -> bool,
) -> Result<Option<ParameterStatement>, ServerError> {
    let lower = sql.trim_start().to_ascii_lowercase();
    if !(lower.starts_with("set") || lower.starts_with("show")) {
        return Ok(None);
    }
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Ok(None);
    };
    if statements.len() != 1 {
        return Ok(None);
    }
    let name_of = |parts: Vec<String>| parts.join(".").to_ascii_lowercase();
    Ok(match statements.remove(0) {
        // Nyala's own SHOW statements (`SHOW PARTITIONS t`, `SHOW GRANTS`), which PostgreSQL's
        // grammar reads as parameters: the session layer answers them.
        Statement::ShowVariable { variable }
            if variable.first().is_some_and(|w| {
                w.value.eq_ignore_ascii_case("partitions") && variable.len() > 1
                    || w.value.eq_ignore_ascii_case("grants") && variable.len() == 1
            }) =>
        {
            None
        }
        Statement::ShowVariable { variable } => {
            let name = name_of(variable.iter().map(|i| i.value.clone()).collect());
            let name = match name.as_str() {
                "transaction.isolation.level" => "transaction_isolation".to_string(),
                "time.zone" => "timezone".to_string(),
                _ => name,
            };
            (!is_nyala(&name)).then_some(ParameterStatement::Show(name))
        }
        Statement::Set(Set::SingleAssignment {
            variable, values, ..
        }) => {
            let name = name_of(variable.0.iter().map(|p| p.to_string()).collect());
            if is_nyala(&name) {
                return Ok(None);
            }
            if !SETTABLE.contains(&name.as_str()) {
                return Err(unknown(&name));
            }
            let value = values.iter().map(text_of).collect::<Vec<_>>().join(", ");
            Some(ParameterStatement::Set { name, value })
        }
        Statement::Set(Set::SetTimeZone { value, .. }) => Some(ParameterStatement::Set {
            name: "timezone".into(),
            value: text_of(&value),
        }),
        Statement::Set(Set::SetNames { charset_name, .. }) => Some(ParameterStatement::Set {
            name: "client_encoding".into(),
            value: charset_name.value,
        }),
        Statement::Set(Set::SetTransaction { modes, .. }) => {
            for mode in modes {
                if let TransactionMode::IsolationLevel(TransactionIsolationLevel::Serializable) =
                    mode
                {
                    return Err(SqlError::NotSupported(
                        "ISOLATION LEVEL SERIALIZABLE: transactions run at REPEATABLE READ \
                         (snapshot isolation)"
                            .into(),
                    )
                    .into());
                }
            }
            Some(ParameterStatement::SetTransaction)
        }
        _ => None,
    })
}

/// A SET value as text: `'ISO'` and `ISO` alike.
fn text_of(value: &Expr) -> String {
    match value {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        Expr::Identifier(ident) => ident.value.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recognised(sql: &str) -> Option<ParameterStatement> {
        recognise(sql, |name| {
            name.starts_with("nyala.") || name == "statement_timeout"
        })
        .unwrap()
    }

    #[test]
    fn clients_parameters_are_recognised_and_nyalas_left_to_the_session() {
        assert_eq!(
            recognised("SET extra_float_digits = 3"),
            Some(ParameterStatement::Set {
                name: "extra_float_digits".into(),
                value: "3".into()
            })
        );
        assert_eq!(
            recognised("SET DateStyle TO 'ISO'"),
            Some(ParameterStatement::Set {
                name: "datestyle".into(),
                value: "ISO".into()
            })
        );
        assert_eq!(
            recognised("SHOW TRANSACTION ISOLATION LEVEL"),
            Some(ParameterStatement::Show("transaction_isolation".into()))
        );
        assert_eq!(
            recognised("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED"),
            Some(ParameterStatement::SetTransaction)
        );
        assert_eq!(recognised("SET statement_timeout = '5s'"), None);
        assert_eq!(recognised("SHOW PARTITIONS metrics"), None);
        assert_eq!(recognised("SHOW GRANTS"), None);
        assert_eq!(recognised("SELECT 1"), None);
        let refused = |sql| recognise(sql, |_| false).is_err();
        assert!(refused("SET no_such_thing = 1"));
        assert!(refused("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"));
    }
}
