//! Nyala's session settings, `SET nyala.<name> = <value>` (a DataFusion config extension, so
//! they live in each session's config next to DataFusion's own), and PostgreSQL's name for the
//! one clients set without a prefix: `SET statement_timeout = '30s'`.
//!
//! A bad value is refused when it is set, with what is accepted, rather than stored and
//! ignored later.

use std::time::Duration;

use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::extensions_options;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{SetVariable, Statement};

extensions_options! {
    /// Nyala's session settings (`SET nyala.<name> = <value>`).
    pub struct NyalaOptions {
        /// Runtime filters from hash joins into table scans: `off`, `minmax` or `bloom`.
        pub runtime_filters: String, default = "bloom".to_string()
        /// How long a statement may run before it is cancelled (`30s`, `500ms`, `2min`, a
        /// number of milliseconds; `0`: no limit). Empty: the server's default.
        pub statement_timeout: String, default = String::new()
        /// Whether queries run distributed over a cluster's tablet servers: `auto` (with more
        /// than one tablet server, for queries that scan many rows), `on` or `off`.
        pub distributed: String, default = "auto".to_string()
    }
}

impl ConfigExtension for NyalaOptions {
    const PREFIX: &'static str = "nyala";
}

/// What `nyala.runtime_filters` asks of hash joins over Nyala scans (see
/// [`crate::exec::runtime_filter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeFilterMode {
    Off,
    MinMax,
    Bloom,
}

impl RuntimeFilterMode {
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "off" | "false" | "none" => Some(Self::Off),
            "minmax" | "min_max" => Some(Self::MinMax),
            "bloom" | "on" | "true" => Some(Self::Bloom),
            _ => None,
        }
    }

    pub fn of(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<NyalaOptions>()
            .and_then(|o| Self::parse(&o.runtime_filters))
            .unwrap_or(Self::Bloom)
    }
}

/// What `nyala.distributed` asks of a cluster's queries (see [`crate::distributed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistributedMode {
    Auto,
    On,
    Off,
}

impl DistributedMode {
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "auto" => Some(Self::Auto),
            "on" | "true" => Some(Self::On),
            "off" | "false" => Some(Self::Off),
            _ => None,
        }
    }

    pub fn of(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<NyalaOptions>()
            .and_then(|o| Self::parse(&o.distributed))
            .unwrap_or(Self::Auto)
    }
}

/// Settings known by another name (PostgreSQL's) too.
const ALIASES: [(&str, &str); 1] = [("statement_timeout", "nyala.statement_timeout")];

/// The setting `name` stands for: an alias resolved, in lower case.
pub fn canonical_name(name: &str) -> String {
    let name = name.to_ascii_lowercase();
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical.to_string())
}

/// A `SET` with its setting's canonical name, its value checked.
pub fn checked_set(statement: &Statement) -> Result<Statement> {
    let Statement::SetVariable(set) = statement else {
        return Ok(statement.clone());
    };
    let variable = canonical_name(&set.variable);
    let invalid = |expected: &str| {
        DataFusionError::Plan(format!(
            "invalid value '{}' for {variable}: expected {expected}",
            set.value
        ))
    };
    match variable.as_str() {
        "nyala.runtime_filters" if RuntimeFilterMode::parse(&set.value).is_none() => {
            return Err(invalid("off, minmax or bloom"));
        }
        "nyala.distributed" if DistributedMode::parse(&set.value).is_none() => {
            return Err(invalid("auto, on or off"));
        }
        "nyala.statement_timeout" if parse_duration(&set.value).is_none() => {
            return Err(invalid(
                "a duration such as 30s, 500ms or 2min, or 0 for none",
            ));
        }
        _ => {}
    }
    Ok(Statement::SetVariable(SetVariable {
        variable,
        value: set.value.clone(),
    }))
}

/// The statement timeout a session's settings give (None: none), `server` when unset.
pub fn statement_timeout(config: &ConfigOptions, server: Option<Duration>) -> Option<Duration> {
    let set = config
        .extensions
        .get::<NyalaOptions>()
        .map(|o| o.statement_timeout.trim())
        .filter(|v| !v.is_empty());
    match set {
        None => server,
        Some(value) => parse_duration(value).filter(|d| !d.is_zero()),
    }
}

/// `30s`, `500ms`, `2min`, `1h`, or a whole number of milliseconds (PostgreSQL's units).
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim().trim_matches('\'').trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let millis = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => number,
        "s" | "sec" | "secs" => number.checked_mul(1_000)?,
        "min" | "mins" => number.checked_mul(60_000)?,
        "h" => number.checked_mul(3_600_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_postgresql_units() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("'500ms'"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2min"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("99999999999999999999h"), None);
    }
}
