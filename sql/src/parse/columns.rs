//! Column definitions: SQL's words for a column (type, NULL, DEFAULT, COMMENT, Kudu's ENCODING
//! and COMPRESSION) turned into the storage's [`ColumnSchema`].
//!
//! CREATE TABLE and ALTER TABLE ADD COLUMN define columns with the same grammar, so both come
//! here with sqlparser's column definitions, and a column means the same in either. Everything a
//! table cannot store is refused here, with the column named, before the catalog is touched.

use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, ArrayElemTypeDef, CharacterLength, ColumnDef, ColumnOption, DataType,
    ExactNumberInfo, Expr, TableConstraint, TimezoneInfo,
};
use nyala_engine::ColumnChange;
use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnSchema, ColumnType, Schema};

use crate::parse::dialect::StorageOption;
use crate::parse::statement::{normalize_ident, ColumnAlteration};
use crate::{Result, SqlError};

/// The storage schema of `CREATE TABLE name (columns, constraints)`; `non_unique`: the key was
/// declared `NON UNIQUE PRIMARY KEY`.
pub(crate) fn table_schema(
    name: &str,
    definitions: &[ColumnDef],
    constraints: &[TableConstraint],
    non_unique: bool,
) -> Result<Schema> {
    let mut columns = Vec::new();
    let mut key: Vec<String> = Vec::new();
    let mut position: Option<String> = None;
    for def in definitions {
        let (column, primary_key) = column_schema(def)?;
        if primary_key {
            key.push(column.name.clone());
        }
        if is_position(def) {
            if let Some(first) = position.replace(column.name.clone()) {
                return Err(SqlError::Invalid(format!(
                    "a table has at most one POSITION column ('{first}', '{}')",
                    column.name
                )));
            }
        }
        columns.push(column);
    }
    for constraint in constraints {
        let names = primary_key_names(constraint)?;
        if !key.is_empty() {
            return Err(SqlError::Invalid(
                "the primary key is declared twice".into(),
            ));
        }
        key = names;
    }
    if columns.is_empty() {
        return Err(SqlError::Invalid(format!(
            "table '{name}' needs columns: CREATE TABLE {name} (column type, ...)"
        )));
    }
    if key.is_empty() {
        // Keyed by the hidden auto_incrementing_id alone.
        if let Some(position) = position {
            return Err(SqlError::Invalid(format!(
                "queue table '{name}' needs a primary key (the queue's columns, then \
                 '{position}')"
            )));
        }
        if non_unique {
            return Err(SqlError::Invalid(
                "NON UNIQUE PRIMARY KEY needs columns".into(),
            ));
        }
        return Schema::without_declared_key(columns).map_err(|e| SqlError::Invalid(e.to_string()));
    }
    let mut key_indexes = Vec::with_capacity(key.len());
    for k in &key {
        let Some(i) = columns.iter().position(|c| &c.name == k) else {
            return Err(SqlError::Invalid(format!(
                "primary key column '{k}' is not a column"
            )));
        };
        if key_indexes.contains(&i) {
            return Err(SqlError::Invalid(format!(
                "primary key column '{k}' is listed twice"
            )));
        }
        // Key columns are implicitly NOT NULL, as in Kudu.
        columns[i].nullable = false;
        key_indexes.push(i);
    }
    let mut schema =
        Schema::new(columns, key_indexes).map_err(|e| SqlError::Invalid(e.to_string()))?;
    if let Some(position) = position {
        let column = schema.column_index(&position).unwrap_or(usize::MAX);
        schema = (schema.with_position(column)).map_err(|e| SqlError::Invalid(e.to_string()))?;
    }
    match non_unique {
        true => schema
            .with_auto_increment()
            .map_err(|e| SqlError::Invalid(e.to_string())),
        false => Ok(schema),
    }
}

/// The column names of a `PRIMARY KEY (a, b)` table constraint; any other constraint is refused.
pub(crate) fn primary_key_names(constraint: &TableConstraint) -> Result<Vec<String>> {
    let TableConstraint::PrimaryKey(pk) = constraint else {
        return Err(SqlError::NotSupported(format!(
            "table constraint {constraint}"
        )));
    };
    pk.columns
        .iter()
        .map(|column| match &column.column.expr {
            Expr::Identifier(ident) => Ok(normalize_ident(ident)),
            other => Err(SqlError::Invalid(format!(
                "primary key columns must be column names, got {other}"
            ))),
        })
        .collect()
}

/// Whether a column definition says `GENERATED ALWAYS AS POSITION`.
fn is_position(def: &ColumnDef) -> bool {
    (def.options.iter())
        .any(|o| StorageOption::from_column_option(&o.option) == Some(StorageOption::Position))
}

/// A column definition; true if it says PRIMARY KEY.
fn column_schema(def: &ColumnDef) -> Result<(ColumnSchema, bool)> {
    let column_name = normalize_ident(&def.name);
    let column_type = column_type(&def.data_type)?;
    let mut column = ColumnSchema::new(column_name.clone(), column_type.clone(), true);
    let mut primary_key = false;
    for option in &def.options {
        if let Some(storage) = StorageOption::from_column_option(&option.option) {
            apply_storage(&mut column, storage)?;
            continue;
        }
        match &option.option {
            ColumnOption::Null => column.nullable = true,
            ColumnOption::NotNull => column.nullable = false,
            ColumnOption::PrimaryKey(_) => {
                primary_key = true;
                column.nullable = false;
            }
            ColumnOption::Default(expr) => {
                column.default = default_value(expr, &column_type, &column_name)?;
            }
            ColumnOption::Comment(text) => column.comment = Some(text.clone()),
            other => {
                return Err(SqlError::NotSupported(format!(
                    "column option {other} (column '{column_name}')"
                )))
            }
        }
    }
    Ok((column, primary_key))
}

/// Kudu's `ENCODING e` / `COMPRESSION c` on `column`; an unknown name is an error naming the
/// column. Whether the encoding suits the column's type is the storage's to say.
fn apply_storage(column: &mut ColumnSchema, storage: StorageOption) -> Result<()> {
    match storage {
        // The table's schema marks it (see `table_schema`).
        StorageOption::Position => {}
        StorageOption::Encoding(name) => {
            column.encoding = ColumnEncoding::parse(&name).ok_or_else(|| {
                SqlError::Invalid(format!(
                    "unknown encoding {name} (column '{}'); use one of {}",
                    column.name,
                    ColumnEncoding::NAMES
                ))
            })?;
        }
        StorageOption::Compression(name) => {
            column.compression = ColumnCompression::parse(&name).ok_or_else(|| {
                SqlError::Invalid(format!(
                    "unknown compression {name} (column '{}'); use one of {}",
                    column.name,
                    ColumnCompression::NAMES
                ))
            })?;
        }
    }
    Ok(())
}

/// `ALTER TABLE t ADD [COLUMN] [IF NOT EXISTS] c TYPE ..., DROP [COLUMN] [IF EXISTS] c,
/// RENAME COLUMN c TO d`, in order.
pub(crate) fn alter_columns(operations: &[AlterTableOperation]) -> Result<Vec<ColumnAlteration>> {
    let mut changes = Vec::new();
    for operation in operations {
        match operation {
            AlterTableOperation::AddColumn {
                if_not_exists,
                column_def,
                column_position: None,
                ..
            } => {
                let (column, primary_key) = column_schema(column_def)?;
                if primary_key || is_position(column_def) {
                    return Err(SqlError::Invalid(format!(
                        "column '{}': a column added to a table cannot join its primary key",
                        column.name
                    )));
                }
                changes.push(ColumnAlteration {
                    change: ColumnChange::Add(column),
                    if_exists: *if_not_exists,
                });
            }
            AlterTableOperation::DropColumn {
                column_names,
                if_exists,
                drop_behavior: None,
                ..
            } => changes.extend(column_names.iter().map(|c| ColumnAlteration {
                change: ColumnChange::Drop(normalize_ident(c)),
                if_exists: *if_exists,
            })),
            AlterTableOperation::RenameColumn {
                old_column_name,
                new_column_name,
            } => changes.push(ColumnAlteration {
                change: ColumnChange::Rename {
                    name: normalize_ident(old_column_name),
                    new_name: normalize_ident(new_column_name),
                },
                if_exists: false,
            }),
            other => {
                return Err(SqlError::NotSupported(format!(
                    "ALTER TABLE ... {other} (supported: RENAME TO, ADD/DROP/RENAME COLUMN, \
                     ADD/DROP RANGE PARTITION)"
                )))
            }
        }
    }
    Ok(changes)
}

/// The text of a `DEFAULT` literal, checked against the column's type (None for NULL).
fn default_value(expr: &Expr, column_type: &ColumnType, column: &str) -> Result<Option<String>> {
    use datafusion::sql::sqlparser::ast::{UnaryOperator, Value};
    let text = match expr {
        Expr::Value(v) => match &v.value {
            Value::Null => return Ok(None),
            Value::Number(n, _) => n.clone(),
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            Value::Boolean(b) => b.to_string(),
            _ => String::new(),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => format!("-{n}"),
                _ => String::new(),
            },
            _ => String::new(),
        },
        _ => String::new(),
    };
    let invalid = || {
        SqlError::Invalid(format!(
            "DEFAULT {expr} of column '{column}' is not a {} literal",
            column_type.sql_name()
        ))
    };
    if text.is_empty()
        && !matches!(
            column_type,
            ColumnType::String | ColumnType::Varchar { .. } | ColumnType::Binary
        )
    {
        return Err(invalid());
    }
    if let ColumnType::Varchar { length } = column_type {
        if u32::try_from(text.chars().count()).map_or(true, |n| n > *length) {
            return Err(invalid());
        }
    }
    datafusion::common::ScalarValue::try_from_string(text.clone(), &column_type.arrow_type())
        .ok()
        .filter(|v| !v.is_null())
        .ok_or_else(invalid)?;
    Ok(Some(text))
}

/// SQL type → Nyala column type. Kudu's names (INT8..INT64, STRING) and the usual SQL synonyms.
fn column_type(data_type: &DataType) -> Result<ColumnType> {
    use ColumnType as C;
    Ok(match data_type {
        // INT8 is Kudu's 1-byte integer here, not PostgreSQL's 8-byte one.
        DataType::Int8(_) | DataType::TinyInt(_) => C::Int8,
        DataType::Int16 | DataType::SmallInt(_) | DataType::Int2(_) => C::Int16,
        DataType::Int32 | DataType::Int(_) | DataType::Integer(_) | DataType::Int4(_) => C::Int32,
        DataType::Int64 | DataType::BigInt(_) => C::Int64,
        DataType::Float(_) | DataType::Real | DataType::Float4 | DataType::Float32 => C::Float,
        DataType::Double(ExactNumberInfo::None)
        | DataType::DoublePrecision
        | DataType::Float8
        | DataType::Float64 => C::Double,
        DataType::Bool | DataType::Boolean => C::Bool,
        DataType::Varchar(Some(length))
        | DataType::CharVarying(Some(length))
        | DataType::CharacterVarying(Some(length)) => {
            let length = match length {
                CharacterLength::IntegerLength { length, .. } => *length,
                CharacterLength::Max => 65_535,
            };
            match u32::try_from(length) {
                Ok(length @ 1..=65_535) => C::Varchar { length },
                _ => {
                    return Err(SqlError::Invalid(format!(
                        "VARCHAR({length}): the length must be 1 to 65535"
                    )))
                }
            }
        }
        DataType::String(_)
        | DataType::Text
        | DataType::Varchar(None)
        | DataType::CharVarying(None)
        | DataType::CharacterVarying(None) => C::String,
        DataType::JSON | DataType::JSONB => C::Json,
        // ARRAY<T>, T[] (a size, as in T[3], is not kept: PostgreSQL does not enforce it).
        DataType::Array(
            ArrayElemTypeDef::AngleBracket(element)
            | ArrayElemTypeDef::SquareBracket(element, _)
            | ArrayElemTypeDef::Parenthesis(element),
        ) => C::Array(Box::new(column_type(element)?)),
        DataType::Binary(_) | DataType::Varbinary(_) | DataType::Bytea | DataType::Blob(_) => {
            C::Binary
        }
        DataType::Timestamp(None | Some(6), TimezoneInfo::None | TimezoneInfo::WithTimeZone)
        | DataType::Datetime(None) => C::Timestamp,
        DataType::Date => C::Date,
        DataType::Decimal(info) | DataType::Numeric(info) | DataType::Dec(info) => {
            let (precision, scale) =
                match info {
                    ExactNumberInfo::Precision(p) => (*p, 0),
                    ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
                    ExactNumberInfo::None => return Err(SqlError::Invalid(
                        "DECIMAL needs a precision: DECIMAL(p) or DECIMAL(p, s), p from 1 to 38"
                            .into(),
                    )),
                };
            let checked = u8::try_from(precision)
                .ok()
                .filter(|p| (1..=38).contains(p))
                .and_then(|p| {
                    let s = i8::try_from(scale).ok()?;
                    (0..=p).contains(&u8::try_from(s).ok()?).then_some((p, s))
                });
            let Some((precision, scale)) = checked else {
                return Err(SqlError::Invalid(format!(
                    "DECIMAL({precision}, {scale}): the precision must be 1 to 38 and the scale 0 to the precision"
                )));
            };
            C::Decimal { precision, scale }
        }
        DataType::Custom(name, args) if args.is_empty() => {
            match name.to_string().to_ascii_uppercase().as_str() {
                "INT8" => C::Int8,
                "INT16" => C::Int16,
                "INT32" => C::Int32,
                "INT64" => C::Int64,
                "BINARY" => C::Binary,
                other => return Err(SqlError::NotSupported(format!("column type {other}"))),
            }
        }
        other => return Err(SqlError::NotSupported(format!("column type {other}"))),
    })
}
