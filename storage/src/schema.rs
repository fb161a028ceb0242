//! Table schemas: columns in the order the user declared them, plus the primary key as a list of
//! column indexes in key order. Key columns are NOT NULL and of a type with a total order that
//! the key encoding preserves (no FLOAT, DOUBLE or BOOL, as in Kudu).

use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::StorageError;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColumnType {
    Int8,
    Int16,
    Int32,
    Int64,
    Float,
    Double,
    Bool,
    String,
    Binary,
    /// Microseconds since the Unix epoch, UTC.
    Timestamp,
    /// Days since the Unix epoch.
    Date,
    /// A string of at most `length` characters (1 to 65 535).
    Varchar {
        length: u32,
    },
    /// Exact decimal of `precision` digits (1 to 38), `scale` of them after the point.
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// A JSON document, checked when written and kept as its text (an Arrow `Utf8` column
    /// marked with the canonical `arrow.json` extension).
    Json,
    /// A one-dimensional array of values of a scalar type (any but JSON), each of which may be
    /// NULL: an Arrow `List`, a Parquet list in DiskRowSets.
    Array(Box<ColumnType>),
}

/// The Arrow field metadata key of a column's extension type, and the canonical JSON one.
pub const EXTENSION_NAME: &str = "ARROW:extension:name";
pub const JSON_EXTENSION: &str = "arrow.json";

impl ColumnType {
    pub fn arrow_type(&self) -> DataType {
        match self {
            ColumnType::Int8 => DataType::Int8,
            ColumnType::Int16 => DataType::Int16,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float => DataType::Float32,
            ColumnType::Double => DataType::Float64,
            ColumnType::Bool => DataType::Boolean,
            ColumnType::String | ColumnType::Varchar { .. } | ColumnType::Json => DataType::Utf8,
            ColumnType::Binary => DataType::Binary,
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ColumnType::Date => DataType::Date32,
            ColumnType::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            ColumnType::Array(element) => {
                DataType::List(Arc::new(Field::new_list_field(element.arrow_type(), true)))
            }
        }
    }

    /// Whether values of the type are arrays.
    pub fn is_array(&self) -> bool {
        matches!(self, ColumnType::Array(_))
    }

    /// The column type that stores values of an Arrow type (after a lossless cast), if any.
    pub fn from_arrow(data_type: &DataType) -> Option<ColumnType> {
        Some(match data_type {
            DataType::Int8 => ColumnType::Int8,
            DataType::Int16 | DataType::UInt8 => ColumnType::Int16,
            DataType::Int32 | DataType::UInt16 => ColumnType::Int32,
            DataType::Int64 | DataType::UInt32 => ColumnType::Int64,
            DataType::Float16 | DataType::Float32 => ColumnType::Float,
            DataType::Float64 => ColumnType::Double,
            DataType::Boolean => ColumnType::Bool,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => ColumnType::Binary,
            DataType::Timestamp(_, _) => ColumnType::Timestamp,
            DataType::Date32 | DataType::Date64 => ColumnType::Date,
            DataType::Decimal128(precision, scale) if *scale >= 0 => ColumnType::Decimal {
                precision: *precision,
                scale: *scale,
            },
            DataType::List(element)
            | DataType::LargeList(element)
            | DataType::ListView(element)
            | DataType::LargeListView(element)
            | DataType::FixedSizeList(element, _) => {
                let element = ColumnType::from_arrow(element.data_type())?;
                if element.is_array() {
                    return None;
                }
                ColumnType::Array(Box::new(element))
            }
            _ => return None,
        })
    }

    pub fn sql_name(&self) -> String {
        let name = match self {
            ColumnType::Int8 => "INT8",
            ColumnType::Int16 => "INT16",
            ColumnType::Int32 => "INT32",
            ColumnType::Int64 => "INT64",
            ColumnType::Float => "FLOAT",
            ColumnType::Double => "DOUBLE",
            ColumnType::Bool => "BOOL",
            ColumnType::String => "STRING",
            ColumnType::Binary => "BINARY",
            ColumnType::Timestamp => "TIMESTAMP",
            ColumnType::Date => "DATE",
            ColumnType::Decimal { precision, scale } => {
                return format!("DECIMAL({precision}, {scale})")
            }
            ColumnType::Varchar { length } => return format!("VARCHAR({length})"),
            ColumnType::Json => "JSON",
            ColumnType::Array(element) => return format!("ARRAY<{}>", element.sql_name()),
        };
        name.to_string()
    }

    fn can_be_key(&self) -> bool {
        !matches!(
            self,
            ColumnType::Float
                | ColumnType::Double
                | ColumnType::Bool
                | ColumnType::Json
                | ColumnType::Array(_)
        )
    }

    /// Why a column cannot have this type, if it cannot: arrays have one dimension and scalar
    /// elements.
    fn unstorable(&self) -> Option<String> {
        match self {
            ColumnType::Array(element) if matches!(**element, ColumnType::Array(_)) => {
                Some("arrays have one dimension: an ARRAY cannot hold ARRAYs".into())
            }
            ColumnType::Array(element) if **element == ColumnType::Json => {
                Some("an ARRAY cannot hold JSON values (a JSON array can)".into())
            }
            _ => None,
        }
    }
}

/// How a column's values are encoded in DiskRowSets (Kudu's names; see [`ColumnEncoding::parse`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnEncoding {
    /// Dictionary encoding, falling back to plain for columns with many distinct values.
    #[default]
    Auto,
    Plain,
    Dictionary,
    /// Run-length encoding: of the values for BOOL, of dictionary indexes for other types.
    Rle,
    /// Byte-stream split (the bytes of each value stored in separate streams), for numbers.
    BitShuffle,
    /// Delta of consecutive values, bit-packed, for integers, dates and timestamps.
    Delta,
    /// Shared prefixes of consecutive values stored once, for strings and binary.
    Prefix,
}

impl ColumnEncoding {
    pub const NAMES: &'static str = "AUTO_ENCODING, PLAIN_ENCODING, DICT_ENCODING, RLE, \
        BIT_SHUFFLE, DELTA (GROUP_VARINT), PREFIX_ENCODING";

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "AUTO_ENCODING" | "AUTO" => Self::Auto,
            "PLAIN_ENCODING" | "PLAIN" => Self::Plain,
            "DICT_ENCODING" | "DICTIONARY" => Self::Dictionary,
            "RLE" => Self::Rle,
            "BIT_SHUFFLE" => Self::BitShuffle,
            "DELTA" | "GROUP_VARINT" => Self::Delta,
            "PREFIX_ENCODING" | "PREFIX" => Self::Prefix,
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Auto => "AUTO_ENCODING",
            Self::Plain => "PLAIN_ENCODING",
            Self::Dictionary => "DICT_ENCODING",
            Self::Rle => "RLE",
            Self::BitShuffle => "BIT_SHUFFLE",
            Self::Delta => "DELTA",
            Self::Prefix => "PREFIX_ENCODING",
        }
    }

    /// Whether this encoding can store values of `column_type`.
    pub fn supports(&self, column_type: &ColumnType) -> bool {
        use ColumnType as C;
        if column_type.is_array() {
            return matches!(self, Self::Auto | Self::Plain | Self::Dictionary);
        }
        let integer = matches!(
            column_type,
            C::Int8 | C::Int16 | C::Int32 | C::Int64 | C::Date | C::Timestamp
        );
        match self {
            Self::Auto | Self::Plain | Self::Dictionary => true,
            Self::Rle => integer || *column_type == C::Bool,
            Self::BitShuffle => integer || matches!(column_type, C::Float | C::Double),
            Self::Delta => integer,
            Self::Prefix => matches!(column_type, C::String | C::Varchar { .. } | C::Binary),
        }
    }
}

/// How a column's pages are compressed in DiskRowSets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnCompression {
    /// LZ4, but none for plain values that LZ4 does not shrink (decided for each rowset).
    #[default]
    Default,
    None,
    Lz4,
    Zstd,
}

impl ColumnCompression {
    pub const NAMES: &'static str = "DEFAULT_COMPRESSION, NO_COMPRESSION, LZ4, ZSTD";

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "DEFAULT_COMPRESSION" | "DEFAULT" => Self::Default,
            "NO_COMPRESSION" | "NONE" => Self::None,
            "LZ4" => Self::Lz4,
            "ZSTD" => Self::Zstd,
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Default => "DEFAULT_COMPRESSION",
            Self::None => "NO_COMPRESSION",
            Self::Lz4 => "LZ4",
            Self::Zstd => "ZSTD",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnSchema {
    pub name: String,
    pub column_type: ColumnType,
    pub nullable: bool,
    /// The value an INSERT that leaves the column out gives it, as text of the column's type.
    #[serde(default)]
    pub default: Option<String>,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub encoding: ColumnEncoding,
    #[serde(default)]
    pub compression: ColumnCompression,
}

impl ColumnSchema {
    /// A column without DEFAULT or COMMENT, with the default encoding and compression.
    pub fn new(name: impl Into<String>, column_type: ColumnType, nullable: bool) -> Self {
        Self {
            name: name.into(),
            column_type,
            nullable,
            default: None,
            comment: None,
            encoding: ColumnEncoding::Auto,
            compression: ColumnCompression::Default,
        }
    }
}

/// A table's columns and primary key. Every column has a stable id (its position when the
/// table was created, then the next free number for each added column), so a schema change can
/// say where each column's values come from however columns were renamed or dropped.
///
/// A schema read back (tablet metadata, the catalog) is checked as [`Schema::new`] checks one:
/// damaged bytes are an error there, not a panic wherever the schema is used.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "StoredSchema")]
pub struct Schema {
    columns: Vec<ColumnSchema>,
    key_columns: Vec<usize>,
    /// Parallel to `columns`; empty in schemas written before ids existed (ids = positions).
    #[serde(default)]
    column_ids: Vec<u32>,
    #[serde(default)]
    next_column_id: u32,
    /// A NON UNIQUE PRIMARY KEY: the last key column is [`AUTO_INCREMENT_COLUMN`], whose values
    /// the tablet's leader assigns.
    #[serde(default)]
    auto_increment: bool,
    /// The id of the column `GENERATED ALWAYS AS POSITION` (a queue table's): a BIGINT key
    /// column whose values each tablet assigns from its log (see [`Schema::position_column`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    position: Option<u32>,
    /// How long the table keeps its history (Kudu's per-table `history_max_age_sec`); None:
    /// the server's retention ([`crate::TabletOptions::history_max_age`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_max_age_secs: Option<u64>,
    #[serde(skip)]
    arrow: OnceLock<SchemaRef>,
    #[serde(skip)]
    views: OnceLock<SchemaRef>,
}

/// The hidden key column of a table with a NON UNIQUE PRIMARY KEY (Kudu 1.17's name).
pub const AUTO_INCREMENT_COLUMN: &str = "auto_incrementing_id";

/// The fields of a [`Schema`] as stored, before they are checked.
#[derive(Deserialize)]
struct StoredSchema {
    columns: Vec<ColumnSchema>,
    key_columns: Vec<usize>,
    #[serde(default)]
    column_ids: Vec<u32>,
    #[serde(default)]
    next_column_id: u32,
    #[serde(default)]
    auto_increment: bool,
    #[serde(default)]
    position: Option<u32>,
    #[serde(default)]
    history_max_age_secs: Option<u64>,
}

impl TryFrom<StoredSchema> for Schema {
    type Error = StorageError;

    fn try_from(stored: StoredSchema) -> Result<Schema, StorageError> {
        let mut schema = Schema::new(stored.columns, stored.key_columns)?;
        let ids = &stored.column_ids;
        let distinct = ids.iter().enumerate().all(|(i, id)| !ids[..i].contains(id));
        if !(ids.is_empty() || ids.len() == schema.columns.len() && distinct) {
            return Err(StorageError::InvalidSchema(format!(
                "column ids {ids:?} do not fit {} columns",
                schema.columns.len()
            )));
        }
        let last_key = schema.key_columns.last().map(|&k| &schema.columns[k]);
        if stored.auto_increment && last_key.is_none_or(|c| c.name != AUTO_INCREMENT_COLUMN) {
            return Err(StorageError::InvalidSchema(format!(
                "the last key column of a NON UNIQUE PRIMARY KEY must be {AUTO_INCREMENT_COLUMN}"
            )));
        }
        schema.history_max_age_secs = stored.history_max_age_secs;
        schema.column_ids = stored.column_ids;
        schema.next_column_id = stored.next_column_id;
        schema.auto_increment = stored.auto_increment;
        if let Some(id) = stored.position {
            let column = schema.ids().iter().position(|&i| i == id).ok_or_else(|| {
                StorageError::InvalidSchema(format!("position column id {id} is not a column"))
            })?;
            schema.check_position(column)?;
            schema.position = Some(id);
        }
        Ok(schema)
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.columns == other.columns
            && self.key_columns == other.key_columns
            && self.ids() == other.ids()
            && self.auto_increment == other.auto_increment
            && self.position == other.position
            && self.history_max_age_secs == other.history_max_age_secs
    }
}

impl Schema {
    pub fn new(
        columns: Vec<ColumnSchema>,
        key_columns: Vec<usize>,
    ) -> Result<Schema, StorageError> {
        let invalid = |m: String| Err(StorageError::InvalidSchema(m));
        if columns.is_empty() {
            return invalid("a table needs at least one column".into());
        }
        for (i, c) in columns.iter().enumerate() {
            if c.name.is_empty() {
                return invalid("column names cannot be empty".into());
            }
            if columns[..i].iter().any(|o| o.name == c.name) {
                return invalid(format!("column '{}' is declared twice", c.name));
            }
            if let Some(reason) = c.column_type.unstorable() {
                return invalid(format!("column '{}': {reason}", c.name));
            }
            if !c.encoding.supports(&c.column_type) {
                return invalid(format!(
                    "encoding {} cannot store column '{}' of type {}",
                    c.encoding.name(),
                    c.name,
                    c.column_type.sql_name()
                ));
            }
        }
        if key_columns.is_empty() {
            return invalid("a table needs a primary key".into());
        }
        for (i, &k) in key_columns.iter().enumerate() {
            let Some(c) = columns.get(k) else {
                return invalid(format!("key column #{k} does not exist"));
            };
            if key_columns[..i].contains(&k) {
                return invalid(format!("key column '{}' is listed twice", c.name));
            }
            if c.nullable {
                return invalid(format!("key column '{}' must be NOT NULL", c.name));
            }
            if !c.column_type.can_be_key() {
                return invalid(format!(
                    "column '{}' of type {} cannot be part of the primary key",
                    c.name,
                    c.column_type.sql_name()
                ));
            }
        }
        let n = columns.len() as u32;
        Ok(Schema {
            columns,
            key_columns,
            column_ids: (0..n).collect(),
            next_column_id: n,
            auto_increment: false,
            position: None,
            history_max_age_secs: None,
            arrow: OnceLock::new(),
            views: OnceLock::new(),
        })
    }

    /// This schema with column `column` as its position column (`GENERATED ALWAYS AS
    /// POSITION`): a BIGINT primary-key column whose values each tablet assigns, increasing in
    /// the order its log applies inserts.
    pub fn with_position(&self, column: usize) -> Result<Schema, StorageError> {
        self.check_position(column)?;
        let mut schema = self.clone();
        schema.position = Some(self.ids()[column]);
        schema.arrow = OnceLock::new();
        schema.views = OnceLock::new();
        Ok(schema)
    }

    fn check_position(&self, column: usize) -> Result<(), StorageError> {
        let c = self.columns.get(column).ok_or_else(|| {
            StorageError::InvalidSchema(format!("position column {column} does not exist"))
        })?;
        if c.column_type != ColumnType::Int64 {
            return Err(StorageError::InvalidSchema(format!(
                "column '{}' is GENERATED ALWAYS AS POSITION, so it must be BIGINT",
                c.name
            )));
        }
        if !self.key_columns.contains(&column) {
            return Err(StorageError::InvalidSchema(format!(
                "column '{}' is GENERATED ALWAYS AS POSITION, so it must be part of the primary key",
                c.name
            )));
        }
        if self.auto_increment {
            return Err(StorageError::InvalidSchema(
                "a NON UNIQUE PRIMARY KEY cannot have a POSITION column".into(),
            ));
        }
        Ok(())
    }

    /// How long the table keeps its history, if it says (else the server's retention).
    pub fn history_max_age_secs(&self) -> Option<u64> {
        self.history_max_age_secs
    }

    /// This schema with the table's history retention `secs` (None: the server's).
    pub fn with_history_max_age_secs(mut self, secs: Option<u64>) -> Schema {
        self.history_max_age_secs = secs;
        self
    }

    /// Whether `other` has the same columns and key (it may differ in table options).
    pub fn same_columns(&self, other: &Schema) -> bool {
        Schema {
            history_max_age_secs: other.history_max_age_secs,
            ..self.clone()
        } == *other
    }

    /// The column `GENERATED ALWAYS AS POSITION`, in a queue table.
    pub fn position_column(&self) -> Option<usize> {
        let id = self.position?;
        self.ids().iter().position(|&i| i == id)
    }

    /// This schema with a NON UNIQUE primary key: [`AUTO_INCREMENT_COLUMN`] (BIGINT) is added
    /// as the last column and the last key column, so rows with equal key values can coexist.
    pub fn with_auto_increment(&self) -> Result<Schema, StorageError> {
        if self.column_index(AUTO_INCREMENT_COLUMN).is_some() {
            return Err(StorageError::InvalidSchema(format!(
                "'{AUTO_INCREMENT_COLUMN}' is the name of the column a NON UNIQUE PRIMARY KEY adds"
            )));
        }
        let mut columns = self.columns.clone();
        columns.push(ColumnSchema {
            comment: Some("assigned by the database".into()),
            encoding: ColumnEncoding::Delta,
            ..ColumnSchema::new(AUTO_INCREMENT_COLUMN, ColumnType::Int64, false)
        });
        let mut key_columns = self.key_columns.clone();
        key_columns.push(columns.len() - 1);
        let mut schema = Schema::new(columns, key_columns)?;
        schema.auto_increment = true;
        Ok(schema)
    }

    /// The schema of a table declared without a primary key: `columns`, keyed by an
    /// [`AUTO_INCREMENT_COLUMN`] added after them alone (Kudu's non-unique primary key with no
    /// columns of the user's).
    pub fn without_declared_key(columns: Vec<ColumnSchema>) -> Result<Schema, StorageError> {
        if columns.iter().any(|c| c.name == AUTO_INCREMENT_COLUMN) {
            return Err(StorageError::InvalidSchema(format!(
                "'{AUTO_INCREMENT_COLUMN}' is the name of the column a table without a primary \
                 key is keyed by"
            )));
        }
        let mut columns = columns;
        columns.push(ColumnSchema {
            comment: Some("assigned by the database".into()),
            encoding: ColumnEncoding::Delta,
            ..ColumnSchema::new(AUTO_INCREMENT_COLUMN, ColumnType::Int64, false)
        });
        let key = columns.len() - 1;
        let mut schema = Schema::new(columns, vec![key])?;
        schema.auto_increment = true;
        Ok(schema)
    }

    /// Whether the table was declared without a primary key: keyed by its
    /// [`AUTO_INCREMENT_COLUMN`] alone.
    pub fn is_keyless(&self) -> bool {
        self.auto_increment && self.key_columns.len() == 1
    }

    /// The position of [`AUTO_INCREMENT_COLUMN`] in a table with a NON UNIQUE PRIMARY KEY.
    pub fn auto_increment_column(&self) -> Option<usize> {
        match self.auto_increment {
            true => self.column_index(AUTO_INCREMENT_COLUMN),
            false => None,
        }
    }

    /// The key columns a user declared (without [`AUTO_INCREMENT_COLUMN`]).
    pub fn declared_key_columns(&self) -> &[usize] {
        match self.auto_increment {
            true => &self.key_columns[..self.key_columns.len().saturating_sub(1)],
            false => &self.key_columns,
        }
    }

    /// The column ids, parallel to [`Schema::columns`].
    pub fn ids(&self) -> Vec<u32> {
        match self.column_ids.len() == self.columns.len() {
            true => self.column_ids.clone(),
            false => (0..self.columns.len() as u32).collect(),
        }
    }

    /// This schema's key and options with `columns` (of ids `ids`): a changed schema, or the
    /// columns of a file written under an older one.
    pub(crate) fn with_columns(
        &self,
        columns: Vec<ColumnSchema>,
        ids: Vec<u32>,
    ) -> Result<Schema, StorageError> {
        let key_ids: Vec<u32> = self.key_columns.iter().map(|&k| self.ids()[k]).collect();
        let key_columns = key_ids
            .iter()
            .map(|id| ids.iter().position(|i| i == id))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                StorageError::InvalidSchema("a primary key column cannot be dropped".into())
            })?;
        let next = self.next_column_id.max(self.columns.len() as u32);
        let mut schema = Schema::new(columns, key_columns)?;
        schema.auto_increment = self.auto_increment;
        schema.position = self.position;
        schema.next_column_id = ids.iter().map(|&i| i + 1).max().unwrap_or(0).max(next);
        schema.column_ids = ids;
        Ok(schema)
    }

    /// This schema with `column` added at the end. Rows that exist get its DEFAULT (or NULL),
    /// so a NOT NULL column needs a DEFAULT.
    pub fn with_column_added(&self, column: ColumnSchema) -> Result<Schema, StorageError> {
        if !column.nullable && column.default.is_none() {
            return Err(StorageError::InvalidSchema(format!(
                "column '{}' is NOT NULL, so the rows that exist need a DEFAULT for it",
                column.name
            )));
        }
        let mut columns = self.columns.clone();
        columns.push(column);
        let mut ids = self.ids();
        ids.push(self.next_column_id.max(self.columns.len() as u32));
        self.with_columns(columns, ids)
    }

    /// This schema without column `name` (not a key column).
    pub fn with_column_dropped(&self, name: &str) -> Result<Schema, StorageError> {
        let i = self.existing(name)?;
        if self.is_key_column(i) {
            return Err(StorageError::InvalidSchema(format!(
                "column '{name}' is part of the primary key and cannot be dropped"
            )));
        }
        if self.columns.len() == 1 {
            return Err(StorageError::InvalidSchema(
                "a table needs at least one column".into(),
            ));
        }
        let mut columns = self.columns.clone();
        let mut ids = self.ids();
        columns.remove(i);
        ids.remove(i);
        self.with_columns(columns, ids)
    }

    /// This schema with column `name` called `new_name`.
    pub fn with_column_renamed(&self, name: &str, new_name: &str) -> Result<Schema, StorageError> {
        let i = self.existing(name)?;
        let mut columns = self.columns.clone();
        columns[i].name = new_name.to_string();
        self.with_columns(columns, self.ids())
    }

    fn existing(&self, name: &str) -> Result<usize, StorageError> {
        self.column_index(name)
            .ok_or_else(|| StorageError::InvalidSchema(format!("column '{name}' does not exist")))
    }

    /// For each column of this schema, the position in `old` of the column with the same id
    /// (None: a column `old` does not have).
    pub fn sources_in(&self, old: &Schema) -> Vec<Option<usize>> {
        let old_ids = old.ids();
        self.ids()
            .iter()
            .map(|id| old_ids.iter().position(|o| o == id))
            .collect()
    }

    pub fn columns(&self) -> &[ColumnSchema] {
        &self.columns
    }

    pub fn key_columns(&self) -> &[usize] {
        &self.key_columns
    }

    /// The names of `columns`, comma-separated: `a, b`.
    pub fn column_list(&self, columns: &[usize]) -> String {
        columns
            .iter()
            .map(|&c| self.columns[c].name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    pub fn is_key_column(&self, idx: usize) -> bool {
        self.key_columns.contains(&idx)
    }

    pub fn arrow_schema(&self) -> SchemaRef {
        self.arrow
            .get_or_init(|| {
                Arc::new(ArrowSchema::new(
                    self.columns
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            // Left out of INSERTs (NULL), then assigned by the tablet.
                            let assigned = (self.auto_increment && c.name == AUTO_INCREMENT_COLUMN)
                                || self.position_column() == Some(i);
                            let field = Field::new(
                                &c.name,
                                c.column_type.arrow_type(),
                                c.nullable || assigned,
                            );
                            match c.column_type {
                                ColumnType::Json => field.with_metadata(
                                    [(EXTENSION_NAME.to_string(), JSON_EXTENSION.to_string())]
                                        .into(),
                                ),
                                _ => field,
                            }
                        })
                        .collect::<Vec<_>>(),
                ))
            })
            .clone()
    }

    /// [`Self::arrow_schema`] with string columns as `Utf8View`: what a scan returns when its
    /// [`crate::ScanSpec::string_views`] is set (the query engine's string type).
    pub fn arrow_view_schema(&self) -> SchemaRef {
        self.views
            .get_or_init(|| {
                let arrow = self.arrow_schema();
                let fields = arrow.fields().iter().map(|f| match f.data_type() {
                    DataType::Utf8 => {
                        Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8View))
                    }
                    _ => f.clone(),
                });
                Arc::new(ArrowSchema::new(fields.collect::<Vec<_>>()))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, t: ColumnType, nullable: bool) -> ColumnSchema {
        ColumnSchema::new(name, t, nullable)
    }

    #[test]
    fn column_ids_follow_columns_through_changes() {
        let s = Schema::new(
            vec![
                col("a", ColumnType::Int32, true),
                col("k", ColumnType::Int64, false),
                col("b", ColumnType::Int32, true),
            ],
            vec![1],
        )
        .unwrap();
        let t = s
            .with_column_dropped("a")
            .unwrap()
            .with_column_renamed("b", "c")
            .unwrap()
            .with_column_added(col("a", ColumnType::Int32, true))
            .unwrap();
        assert_eq!(t.ids(), vec![1, 2, 3]);
        assert_eq!(t.key_columns(), &[0]);
        assert_eq!(t.sources_in(&s), vec![Some(1), Some(2), None]);
        let json = serde_json::to_string(&t).unwrap();
        let back: Schema = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert_eq!(
            back.with_column_added(col("d", ColumnType::Int8, true))
                .unwrap()
                .ids(),
            vec![1, 2, 3, 4]
        );
        for (result, needle) in [
            (s.with_column_dropped("k"), "primary key"),
            (s.with_column_dropped("z"), "'z' does not exist"),
            (s.with_column_renamed("a", "b"), "twice"),
            (
                s.with_column_added(col("n", ColumnType::Int8, false)),
                "DEFAULT",
            ),
        ] {
            let e = result.unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn validation_errors_name_the_problem() {
        let cases = [
            (
                Schema::new(vec![col("a", ColumnType::Int32, false)], vec![]),
                "primary key",
            ),
            (
                Schema::new(vec![col("a", ColumnType::Double, false)], vec![0]),
                "DOUBLE",
            ),
            (
                Schema::new(vec![col("a", ColumnType::Int32, true)], vec![0]),
                "NOT NULL",
            ),
            (
                Schema::new(
                    vec![
                        col("a", ColumnType::Int32, false),
                        col("a", ColumnType::Int8, true),
                    ],
                    vec![0],
                ),
                "twice",
            ),
            (
                Schema::new(vec![col("a", ColumnType::Int32, false)], vec![3]),
                "#3",
            ),
        ];
        for (result, needle) in cases {
            let e = result.unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
