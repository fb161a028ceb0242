//! Catalog metadata for Flight SQL clients: SQL info, XDBC type info, tables, primary keys and
//! the (always empty) foreign-key listings. GUI tools and JDBC's DatabaseMetaData read these.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::{
    CommandGetPrimaryKeys, CommandGetTables, Nullable, Searchable, SqlInfo, SqlNullOrdering,
    SqlOuterJoinsSupportLevel, SqlSupportedCaseSensitivity, SqlTransactionIsolationLevel,
    XdbcDataType,
};
use nyala_sql::{Database, CATALOG_NAME, SCHEMA_NAME};
use tonic::Status;

use crate::internal;

/// What GetSqlInfo answers: only what is true of Nyala.
pub fn sql_info() -> anyhow::Result<SqlInfoData> {
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "Nyala");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    info.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    info.append(SqlInfo::FlightSqlServerReadOnly, false);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, false);
    // SQL_SUPPORTED_TRANSACTION_TRANSACTION: BeginTransaction / EndTransaction (no savepoints).
    info.append(SqlInfo::FlightSqlServerTransaction, 1i32);
    info.append(SqlInfo::FlightSqlServerCancel, true);
    info.append(SqlInfo::FlightSqlServerBulkIngestion, true);
    info.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, true);
    info.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    info.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    info.append(SqlInfo::SqlDdlCatalog, false);
    info.append(SqlInfo::SqlDdlSchema, false);
    info.append(SqlInfo::SqlDdlTable, true);
    info.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    info.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    info.append(SqlInfo::SqlAllTablesAreSelectable, true);
    // ASC puts NULLs last and DESC first: NULL sorts as the highest value.
    info.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    info.append(SqlInfo::SqlSearchStringEscape, "\\");
    info.append(SqlInfo::SqlExtraNameCharacters, "");
    info.append(SqlInfo::SqlSupportsColumnAliasing, true);
    info.append(SqlInfo::SqlNullPlusNullIsNull, true);
    info.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    info.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    info.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    info.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    info.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    info.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    info.append(SqlInfo::SqlSupportsIntegrityEnhancementFacility, false);
    info.append(
        SqlInfo::SqlOuterJoinsSupportLevel,
        SqlOuterJoinsSupportLevel::SqlFullOuterJoins as i32,
    );
    info.append(SqlInfo::SqlSchemaTerm, "schema");
    info.append(SqlInfo::SqlProcedureTerm, "procedure");
    info.append(SqlInfo::SqlCatalogTerm, "catalog");
    info.append(SqlInfo::SqlCatalogAtStart, true);
    info.append(SqlInfo::SqlSelectForUpdateSupported, false);
    info.append(SqlInfo::SqlStoredProceduresSupported, false);
    info.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    info.append(SqlInfo::SqlTransactionsSupported, true);
    // Transactions run at snapshot isolation, which JDBC and Flight SQL call REPEATABLE READ
    // (as PostgreSQL does); a statement outside one reads at READ COMMITTED.
    info.append(
        SqlInfo::SqlDefaultTransactionIsolation,
        SqlTransactionIsolationLevel::SqlTransactionRepeatableRead as i32,
    );
    info.append(
        SqlInfo::SqlSupportedTransactionsIsolationLevels,
        (1i32 << SqlTransactionIsolationLevel::SqlTransactionReadCommitted as i32)
            | (1i32 << SqlTransactionIsolationLevel::SqlTransactionRepeatableRead as i32),
    );
    info.append(SqlInfo::SqlDataDefinitionCausesTransactionCommit, false);
    info.append(SqlInfo::SqlDataDefinitionsInTransactionsIgnored, false);
    Ok(info.build()?)
}

/// The SQL types Nyala stores, for GetXdbcTypeInfo (JDBC `getTypeInfo`).
pub fn xdbc_types() -> anyhow::Result<XdbcTypeInfoData> {
    let mut builder = XdbcTypeInfoDataBuilder::new();
    let types: [(&str, XdbcDataType, Option<i32>, bool); 11] = [
        ("TINYINT", XdbcDataType::XdbcTinyint, Some(3), true),
        ("SMALLINT", XdbcDataType::XdbcSmallint, Some(5), true),
        ("INT", XdbcDataType::XdbcInteger, Some(10), true),
        ("BIGINT", XdbcDataType::XdbcBigint, Some(19), true),
        ("FLOAT", XdbcDataType::XdbcReal, Some(7), true),
        ("DOUBLE", XdbcDataType::XdbcDouble, Some(15), true),
        ("BOOLEAN", XdbcDataType::XdbcBit, Some(1), false),
        ("STRING", XdbcDataType::XdbcVarchar, None, false),
        ("BINARY", XdbcDataType::XdbcVarbinary, None, false),
        ("DATE", XdbcDataType::XdbcDate, Some(10), false),
        ("TIMESTAMP", XdbcDataType::XdbcTimestamp, Some(26), false),
    ];
    for (name, data_type, column_size, numeric) in types {
        let quoted = matches!(
            data_type,
            XdbcDataType::XdbcVarchar | XdbcDataType::XdbcDate | XdbcDataType::XdbcTimestamp
        );
        builder.append(XdbcTypeInfo {
            type_name: name.to_string(),
            data_type,
            column_size,
            literal_prefix: quoted.then(|| "'".to_string()),
            literal_suffix: quoted.then(|| "'".to_string()),
            create_params: None,
            nullable: Nullable::NullabilityNullable,
            case_sensitive: data_type == XdbcDataType::XdbcVarchar,
            searchable: Searchable::Full,
            unsigned_attribute: numeric.then_some(false),
            fixed_prec_scale: false,
            auto_increment: numeric.then_some(false),
            local_type_name: Some(name.to_string()),
            minimum_scale: None,
            maximum_scale: None,
            sql_data_type: data_type,
            datetime_subcode: None,
            num_prec_radix: numeric.then_some(10),
            interval_precision: None,
        });
    }
    Ok(builder.build()?)
}

/// GetTables: Nyala's tables (type TABLE) and views (type VIEW) in `nyala.public` that the
/// caller `sees`, with schemas if asked.
pub fn tables(
    db: &Database,
    views: &[(String, SchemaRef)],
    query: CommandGetTables,
    sees: impl Fn(&str) -> bool,
) -> Result<RecordBatch, Status> {
    let catalog_ok = query.catalog.as_deref().is_none_or(|c| c == CATALOG_NAME);
    let schema_ok = query
        .db_schema_filter_pattern
        .as_deref()
        .is_none_or(|p| like(SCHEMA_NAME, p));
    let wanted =
        |kind: &str| query.table_types.is_empty() || query.table_types.iter().any(|t| t == kind);
    let (tables_ok, views_ok) = (wanted("TABLE"), wanted("VIEW"));
    let pattern = query.table_name_filter_pattern.clone();
    let mut builder = query.into_builder();
    if catalog_ok && schema_ok {
        let tables = db
            .tables()
            .into_iter()
            .filter(|_| tables_ok)
            .map(|t| (t, "TABLE"));
        let views = views
            .iter()
            .filter(|_| views_ok)
            .cloned()
            .map(|v| (v, "VIEW"));
        for ((name, schema), kind) in tables.chain(views) {
            if pattern.as_deref().is_none_or(|p| like(&name, p)) && sees(&name) {
                builder
                    .append(CATALOG_NAME, SCHEMA_NAME, &name, kind, &schema)
                    .map_err(internal)?;
            }
        }
    }
    builder.build().map_err(internal)
}

/// GetPrimaryKeys: the key columns of one table in key order.
/// GetPrimaryKeys of a table the caller `sees` (else no rows).
pub fn primary_keys(
    db: &Database,
    query: &CommandGetPrimaryKeys,
    sees: impl Fn(&str) -> bool,
) -> Result<RecordBatch, Status> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ]));
    let columns = if query.catalog.as_deref().is_none_or(|c| c == CATALOG_NAME)
        && query.db_schema.as_deref().is_none_or(|s| s == SCHEMA_NAME)
        && sees(&query.table)
    {
        db.primary_key(&query.table).unwrap_or_default()
    } else {
        vec![]
    };
    let n = columns.len();
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![CATALOG_NAME; n])),
        Arc::new(StringArray::from(vec![SCHEMA_NAME; n])),
        Arc::new(StringArray::from(vec![query.table.as_str(); n])),
        Arc::new(StringArray::from(columns)),
        Arc::new(StringArray::from(vec![None::<&str>; n])),
        Arc::new(Int32Array::from((1..=n as i32).collect::<Vec<_>>())),
    ];
    RecordBatch::try_new(schema, arrays).map_err(internal)
}

/// The schema of GetExportedKeys, GetImportedKeys and GetCrossReference results. Nyala has no
/// foreign keys, so their results are always empty.
pub fn foreign_keys_schema() -> SchemaRef {
    let utf8 = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        utf8("pk_catalog_name", true),
        utf8("pk_db_schema_name", true),
        utf8("pk_table_name", false),
        utf8("pk_column_name", false),
        utf8("fk_catalog_name", true),
        utf8("fk_db_schema_name", true),
        utf8("fk_table_name", false),
        utf8("fk_column_name", false),
        Field::new("key_sequence", DataType::Int32, false),
        utf8("fk_key_name", true),
        utf8("pk_key_name", true),
        Field::new("update_rule", DataType::UInt8, false),
        Field::new("delete_rule", DataType::UInt8, false),
    ]))
}

/// SQL LIKE with `%` and `_`, as Flight SQL filter patterns use it. The pattern is the
/// client's: matched in a loop (no recursion, however long it is) that goes back only to the
/// last `%` (time at most the product of the lengths, however many `%` there are).
pub(crate) fn like(value: &str, pattern: &str) -> bool {
    let v: Vec<char> = value.chars().collect();
    let p: Vec<char> = pattern.chars().collect();
    let (mut i, mut j) = (0, 0);
    // The last `%` passed, and where in the value what follows it is being tried.
    let mut star: Option<(usize, usize)> = None;
    while i < v.len() {
        match p.get(j) {
            Some('%') => {
                star = Some((j, i));
                j += 1;
            }
            Some(&c) if c == '_' || c == v[i] => {
                i += 1;
                j += 1;
            }
            // A mismatch: the last `%` takes one more character, if there is one.
            _ => match star {
                Some((s, at)) => {
                    star = Some((s, at + 1));
                    i = at + 1;
                    j = s + 1;
                }
                None => return false,
            },
        }
    }
    p[j..].iter().all(|&c| c == '%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns() {
        assert!(like("orders", "ord%"));
        assert!(like("orders", "_rders"));
        assert!(!like("orders", "order"));
        assert!(like("", "%"));
        assert!(like("orders", "%"));
        assert!(like("orders", "o%s"));
        assert!(like("orders", "%r%r%"));
        assert!(!like("orders", "%r%r%r%"));
        assert!(like("aab", "%ab"));
        assert!(!like("", "_"));
        assert!(like("é", "_"));
        assert!(!like("order", "orders"));
    }

    #[test]
    fn metadata_builds() {
        sql_info().unwrap();
        xdbc_types().unwrap();
    }
}
