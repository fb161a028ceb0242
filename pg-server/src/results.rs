//! Arrow results as PostgreSQL sends them. `arrow-pg` encodes most columns as they are; two
//! are changed first:
//! - TINYINT becomes SMALLINT: PostgreSQL has no one-byte integer, and the encoder would send
//!   its binary form as one byte where clients read the two of an `int2`;
//! - a list marked as an `int2vector` ([`INT2VECTOR`], as `pg_index.indkey` is) is sent as
//!   one, in text: `1 2`. Drivers read it so (psqlODBC's SQLStatistics parses it into a
//!   vector and crashes on an array's `{1,2}`). Its columns are described as `int2vector`
//!   ([`pg_fields`]) and encoded as the text they hold ([`encoded_as`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringBuilder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow_pg::datatypes::arrow_schema_to_pg_fields;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::types::format::FormatOptions;

use nyala_server::ServerError;
use pgwire::api::portal::Format;

/// Field metadata naming the PostgreSQL type a column has where Arrow's type does not say it.
pub(crate) const PG_TYPE_KEY: &str = "nyala.pg_type";
/// [`PG_TYPE_KEY`]'s value for PostgreSQL's `int2vector`.
pub(crate) const INT2VECTOR: &str = "int2vector";

fn is_int2vector(field: &Field) -> bool {
    field.metadata().get(PG_TYPE_KEY).map(String::as_str) == Some(INT2VECTOR)
}

/// A JSON column (the canonical `arrow.json` extension): PostgreSQL's `json`, sent as its text.
fn is_json(field: &Field) -> bool {
    field
        .metadata()
        .get(nyala_sql::EXTENSION_NAME)
        .map(String::as_str)
        == Some(nyala_sql::JSON_EXTENSION)
}

/// What `field` becomes in the columns sent.
fn sent_field(field: &FieldRef) -> FieldRef {
    match field.data_type() {
        DataType::Int8 => Arc::new(field.as_ref().clone().with_data_type(DataType::Int16)),
        _ if is_int2vector(field) => {
            Arc::new(field.as_ref().clone().with_data_type(DataType::Utf8))
        }
        _ => field.clone(),
    }
}

/// `schema` as its columns are sent.
pub(crate) fn sent_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<FieldRef> = schema.fields().iter().map(sent_field).collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `batch` as its columns are sent (see [`sent_schema`]).
pub(crate) fn sent_batch(batch: RecordBatch) -> Result<RecordBatch, nyala_sql::SqlError> {
    let schema = batch.schema();
    if schema
        .fields()
        .iter()
        .all(|field| Arc::ptr_eq(field, &sent_field(field)))
    {
        return Ok(batch);
    }
    let columns = (schema.fields().iter())
        .zip(batch.columns())
        .map(|(field, column)| match field.data_type() {
            DataType::Int8 => Ok(cast(column, &DataType::Int16)?),
            _ if is_int2vector(field) => int2vector_text(column),
            _ => Ok(column.clone()),
        })
        .collect::<Result<Vec<_>, nyala_sql::SqlError>>()?;
    Ok(RecordBatch::try_new(sent_schema(&schema), columns)?)
}

/// Each list of `column` as `int2vector` writes it: its elements separated by spaces.
fn int2vector_text(column: &ArrayRef) -> Result<ArrayRef, nyala_sql::SqlError> {
    let Some(lists) = column.as_list_opt::<i32>() else {
        return Ok(cast(column, &DataType::Utf8)?);
    };
    let mut text = StringBuilder::new();
    for row in 0..lists.len() {
        if lists.is_null(row) {
            text.append_null();
            continue;
        }
        let elements = cast(&lists.value(row), &DataType::Utf8)?;
        let elements = elements.as_string::<i32>();
        let words: Vec<&str> = elements.iter().map(|e| e.unwrap_or("0")).collect();
        text.append_value(words.join(" "));
    }
    Ok(Arc::new(text.finish()))
}

/// The columns of `schema` as PostgreSQL describes them, as they are sent.
pub(crate) fn pg_fields(
    schema: &SchemaRef,
    format: &Format,
    options: Arc<FormatOptions>,
) -> Result<Vec<FieldInfo>, ServerError> {
    let sent = sent_schema(schema);
    let fields = arrow_schema_to_pg_fields(&sent, format, Some(options.clone()))
        .map_err(|e| ServerError::invalid(format!("a result column cannot be sent: {e}")))?;
    let described = (schema.fields().iter()).zip(fields).map(|(field, info)| {
        if is_int2vector(field) {
            retyped(&info, Type::INT2_VECTOR).with_format_options(options.clone())
        } else if is_json(field) {
            retyped(&info, Type::JSON).with_format_options(options.clone())
        } else {
            info
        }
    });
    Ok(described.collect())
}

/// The last result description made for a connection's handler, reused while the schema (the
/// same prepared statement run again), the result formats asked for and the client's format
/// settings stay the same: describing a result costs more than a key lookup's row.
#[derive(Default)]
pub(crate) struct LastFields(parking_lot::Mutex<Option<Described>>);

struct Described {
    schema: SchemaRef,
    format: Format,
    options: Arc<FormatOptions>,
    /// What [`pg_fields`] made, and [`encoded_as`] of it.
    fields: (Arc<Vec<FieldInfo>>, Arc<Vec<FieldInfo>>),
}

impl LastFields {
    /// [`pg_fields`] and [`encoded_as`] of `schema`, made again only if something changed.
    pub(crate) fn describe(
        &self,
        schema: &SchemaRef,
        format: &Format,
        options: Arc<FormatOptions>,
    ) -> Result<(Arc<Vec<FieldInfo>>, Arc<Vec<FieldInfo>>), ServerError> {
        let mut last = self.0.lock();
        if let Some(d) = last.as_ref().filter(|d| {
            Arc::ptr_eq(&d.schema, schema) && same_format(&d.format, format) && d.options == options
        }) {
            return Ok(d.fields.clone());
        }
        let fields = Arc::new(pg_fields(schema, format, options.clone())?);
        let fields = (fields.clone(), encoded_as(&fields));
        *last = Some(Described {
            schema: schema.clone(),
            format: format.clone(),
            options,
            fields: fields.clone(),
        });
        Ok(fields)
    }
}

fn same_format(a: &Format, b: &Format) -> bool {
    match (a, b) {
        (Format::UnifiedText, Format::UnifiedText) => true,
        (Format::UnifiedBinary, Format::UnifiedBinary) => true,
        (Format::Individual(a), Format::Individual(b)) => a == b,
        _ => false,
    }
}

/// `fields` as the encoder writes them: an `int2vector` or `json` column as the text it holds.
pub(crate) fn encoded_as(fields: &Arc<Vec<FieldInfo>>) -> Arc<Vec<FieldInfo>> {
    let as_text = |field: &FieldInfo| {
        field.datatype() == &Type::INT2_VECTOR || field.datatype() == &Type::JSON
    };
    if !fields.iter().any(as_text) {
        return fields.clone();
    }
    let encoded = fields.iter().map(|field| match as_text(field) {
        true => retyped(field, Type::TEXT),
        false => field.clone(),
    });
    Arc::new(encoded.collect())
}

/// `field` as a text column of type `datatype`.
fn retyped(field: &FieldInfo, datatype: Type) -> FieldInfo {
    let name = field.name().to_string();
    FieldInfo::new(
        name,
        field.table_id(),
        field.column_id(),
        datatype,
        FieldFormat::Text,
    )
    .with_format_options(field.format_options().clone())
}
