//! `COPY t [(columns)] FROM 'path or glob' [(options)]` and `COPY t | (query) TO 'path'
//! [(options)]`: copies between tables and files on the server ([`crate::copy`]). `COPY ...
//! FROM STDIN` and `TO STDOUT` are the PostgreSQL front end's.

use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget,
};

use crate::parse::statement::{
    copy_table_query, normalize_ident, object_name, CopyDirection, CopyFileSpec, FileFormat,
};
use crate::{Result, SqlError};

/// A COPY to or from a server file, from sqlparser's parts of it.
pub(crate) fn copy_file(
    source: CopySource,
    to: bool,
    target: CopyTarget,
    options: Vec<CopyOption>,
    legacy_options: Vec<CopyLegacyOption>,
) -> Result<CopyFileSpec> {
    let CopyTarget::File { filename: path } = target else {
        return Err(SqlError::NotSupported(format!(
            "COPY {} {target} (copy to or from a file on the server, or use the PostgreSQL \
             protocol's STDIN and STDOUT)",
            if to { "TO" } else { "FROM" }
        )));
    };
    let direction = match (to, source) {
        (
            false,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => CopyDirection::From {
            table: object_name(&table_name)?,
            columns: columns.iter().map(normalize_ident).collect(),
        },
        (false, CopySource::Query(_)) => {
            return Err(SqlError::Invalid(
                "COPY FROM loads a table, not a query".into(),
            ))
        }
        (
            true,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => CopyDirection::To {
            query: copy_table_query(&table_name, &columns),
        },
        (true, CopySource::Query(query)) => CopyDirection::To {
            query: query.to_string(),
        },
    };
    let mut format = None;
    let mut header = false;
    let mut delimiter = None;
    for option in options {
        match option {
            CopyOption::Format(name) => {
                format = Some(match name.value.to_ascii_lowercase().as_str() {
                    "parquet" => FileFormat::Parquet,
                    "csv" => FileFormat::Csv,
                    "json" => FileFormat::Json,
                    other => {
                        return Err(SqlError::Invalid(format!(
                            "COPY to or from a file: FORMAT {other} is not one of parquet, csv, \
                             json"
                        )))
                    }
                })
            }
            CopyOption::Header(h) => header = h,
            CopyOption::Delimiter(c) => delimiter = Some(c),
            other => {
                return Err(SqlError::NotSupported(format!(
                    "COPY option {other} with a file (FORMAT, HEADER and DELIMITER are)"
                )))
            }
        }
    }
    for option in legacy_options {
        match option {
            CopyLegacyOption::Delimiter(c) => delimiter = Some(c),
            CopyLegacyOption::Csv(csv) => {
                format = Some(FileFormat::Csv);
                for option in csv {
                    match option {
                        CopyLegacyCsvOption::Header => header = true,
                        other => {
                            return Err(SqlError::NotSupported(format!(
                                "COPY option {other} with a file"
                            )))
                        }
                    }
                }
            }
            other => {
                return Err(SqlError::NotSupported(format!(
                    "COPY option {other} with a file"
                )))
            }
        }
    }
    let format = match format {
        Some(format) => format,
        None => FileFormat::of_path(&path).ok_or_else(|| {
            SqlError::Invalid(format!(
                "COPY: say the format of '{path}': (FORMAT parquet | csv | json)"
            ))
        })?,
    };
    if format != FileFormat::Csv && (header || delimiter.is_some()) {
        return Err(SqlError::Invalid(
            "COPY: HEADER and DELIMITER go with FORMAT csv".into(),
        ));
    }
    let delimiter = match delimiter {
        None => b',',
        Some(c) if c.is_ascii() && c != '\n' && c != '\r' => c as u8,
        Some(c) => {
            return Err(SqlError::Invalid(format!(
                "COPY: DELIMITER {c:?} must be one ASCII character other than a line break"
            )))
        }
    };
    Ok(CopyFileSpec {
        direction,
        path,
        format,
        header,
        delimiter,
    })
}
