//! Nyala's tables as PostgreSQL's catalog names them: each table under an OID that stays the
//! same in every session and across restarts (derived from its table id, which a rename keeps),
//! and its primary key as an index `<table>_pkey` with a constraint of the same name — what
//! drivers read to find primary keys (pgjdbc's getPrimaryKeys, psqlODBC's SQLPrimaryKeys,
//! SQLAlchemy's reflection, psql's `\d`).

use std::sync::{Arc, Weak};

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int32Type};
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use nyala_engine::TableHandle;
use nyala_server::ClientSession;

/// OIDs below this are PostgreSQL's own (and those `datafusion-pg-catalog` hands out from a
/// counter); Nyala's tables take theirs above it.
const FIRST_TABLE_OID: u32 = 1 << 24;
/// Each table owns this many consecutive OIDs: the table, its key's index, its key's constraint.
const OIDS_PER_TABLE: u32 = 4;
/// How many tables fit between [`FIRST_TABLE_OID`] and `i32::MAX`.
const TABLE_SLOTS: u32 = (1 << 29) / OIDS_PER_TABLE;

/// One of the users' tables, as the PostgreSQL catalog describes it.
#[derive(Debug, Clone)]
pub(crate) struct Relation {
    pub table: TableHandle,
}

impl Relation {
    /// The table's `pg_class.oid`: a hash of its table id, so that a client that keeps OIDs
    /// across connections (pgjdbc's and psqlODBC's metadata caches) finds the same table.
    /// Two tables whose ids hash alike would share an OID; with 2^27 slots that takes tens of
    /// thousands of tables to become likely.
    pub fn oid(&self) -> i32 {
        // FNV-1a: fixed across builds and platforms, unlike std's hasher.
        let hash = self.table.id.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
            (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
        });
        (FIRST_TABLE_OID + (hash % TABLE_SLOTS) * OIDS_PER_TABLE) as i32
    }

    pub fn index_oid(&self) -> i32 {
        self.oid() + 1
    }

    pub fn constraint_oid(&self) -> i32 {
        self.oid() + 2
    }

    pub fn name(&self) -> &str {
        &self.table.name
    }

    /// The name of the primary key's index and constraint, as PostgreSQL would name them.
    pub fn key_name(&self) -> String {
        format!("{}_pkey", self.table.name)
    }

    /// The key's columns by `pg_attribute.attnum` (1-based), in key order.
    pub fn key_attnums(&self) -> Vec<i16> {
        let key = self.table.schema.key_columns().iter();
        key.map(|&column| column as i16 + 1).collect()
    }

    /// The key's column names, in key order.
    fn key_names(&self) -> Vec<&str> {
        let columns = self.table.schema.columns();
        let key = self.table.schema.key_columns().iter();
        key.map(|&column| columns[column].name.as_str()).collect()
    }

    /// `pg_get_constraintdef` of the key's constraint.
    fn constraint_definition(&self) -> String {
        format!("PRIMARY KEY ({})", quoted_list(&self.key_names()))
    }

    /// `pg_get_indexdef` of the key's index: all of it (`column` 0) or one column's name.
    fn index_definition(&self, column: i32) -> Option<String> {
        let names = self.key_names();
        match column {
            0 => Some(format!(
                "CREATE UNIQUE INDEX {} ON {}.{} USING btree ({})",
                quoted(&self.key_name()),
                nyala_sql::SCHEMA_NAME,
                quoted(self.name()),
                quoted_list(&names)
            )),
            n => names
                .get(usize::try_from(n - 1).ok()?)
                .map(|name| quoted(name)),
        }
    }
}

/// The tables a PostgreSQL session sees. It holds its session weakly: the session's own
/// catalog holds this.
#[derive(Debug, Clone)]
pub(crate) struct Relations {
    session: Weak<ClientSession>,
}

impl Relations {
    pub fn new(session: &Arc<ClientSession>) -> Self {
        Self {
            session: Arc::downgrade(session),
        }
    }

    /// The tables the session's user may see, sorted by name.
    pub fn list(&self) -> Vec<Relation> {
        let Some(session) = self.session.upgrade() else {
            return Vec::new();
        };
        let tables = session.sql().visible_tables().into_iter();
        tables.map(|table| Relation { table }).collect()
    }

    /// The tables that have a key, with the OID of their key's index or constraint as
    /// `oid_of` gives it.
    fn by_oid(&self, oid_of: fn(&Relation) -> i32) -> std::collections::HashMap<i32, Relation> {
        let list = self.list().into_iter();
        list.map(|relation| (oid_of(&relation), relation)).collect()
    }

    /// `pg_get_constraintdef(oid [, pretty])` for the keys' constraints ('' for others, as
    /// `datafusion-pg-catalog`'s has it).
    pub fn constraintdef_udf(&self) -> ScalarUDF {
        ScalarUDF::from(Definitions {
            name: "pg_get_constraintdef",
            signature: Signature::variadic_any(Volatility::Stable),
            relations: self.clone(),
        })
    }

    /// `pg_get_indexdef(oid [, column, pretty])` for the keys' indexes (NULL for others).
    pub fn indexdef_udf(&self) -> ScalarUDF {
        ScalarUDF::from(Definitions {
            name: "pg_get_indexdef",
            signature: Signature::variadic_any(Volatility::Stable),
            relations: self.clone(),
        })
    }
}

/// `pg_get_constraintdef` and `pg_get_indexdef`: the definitions of the keys' constraints
/// and indexes, by OID.
#[derive(Debug)]
struct Definitions {
    name: &'static str,
    signature: Signature,
    relations: Relations,
}

impl PartialEq for Definitions {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Definitions {}

impl std::hash::Hash for Definitions {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for Definitions {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let args = ColumnarValue::values_to_arrays(&args.args)?;
        let Some(oids) = args.first() else {
            return exec_err!("{} needs an OID", self.name);
        };
        let oids = cast(oids, &DataType::Int32)?;
        let oids = oids.as_primitive::<Int32Type>();
        let columns = match (self.name, args.get(1)) {
            ("pg_get_indexdef", Some(columns)) => Some(cast(columns, &DataType::Int32)?),
            _ => None,
        };
        let columns = columns.as_ref().map(|c| c.as_primitive::<Int32Type>());
        let indexes = self.name == "pg_get_indexdef";
        let relations = match indexes {
            true => self.relations.by_oid(Relation::index_oid),
            false => self.relations.by_oid(Relation::constraint_oid),
        };
        // Arguments given as constants come as arrays of one row.
        let at = |array: &dyn Array, row: usize| if array.len() == 1 { 0 } else { row };
        let mut out = StringBuilder::new();
        for row in 0..rows {
            let oid_row = at(oids, row);
            let oid = oids.is_valid(oid_row).then(|| oids.value(oid_row));
            let relation = oid.and_then(|oid| relations.get(&oid));
            match (relation, indexes) {
                (Some(relation), true) => {
                    let column = columns.map_or(0, |c| c.value(at(c, row)));
                    out.append_option(relation.index_definition(column));
                }
                (Some(relation), false) => out.append_value(relation.constraint_definition()),
                (None, true) => out.append_null(),
                (None, false) => out.append_value(""),
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish()) as ArrayRef))
    }
}

/// `name`, double-quoted where PostgreSQL would quote it.
fn quoted(name: &str) -> String {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    match plain {
        true => name.to_string(),
        false => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

fn quoted_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| quoted(name)).collect();
    quoted.join(", ")
}
