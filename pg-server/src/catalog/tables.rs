//! `pg_catalog` as a PostgreSQL session reads it: `datafusion-pg-catalog`'s tables, except
//! that Nyala's tables appear in `pg_class` and `pg_attribute` under their stable OIDs
//! ([`Relation::oid`]), each primary key appears there too as an index, and `pg_index` and
//! `pg_constraint` list the keys.
//!
//! The four tables are built when a query scans them, not when it is planned: the library's
//! `pg_class` asks every schema, this one included, for its tables' schemas while it scans.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int16Array, Int32Array, ListArray, RecordBatch,
    StringArray, UInt32Array,
};
use arrow::compute::{cast, concat_batches, take_record_batch};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Int16Type, Int32Type, Schema, SchemaRef,
};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::{exec_datafusion_err, Result};
use datafusion::datasource::{MemTable, TableType};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion_pg_catalog::pg_catalog::oid_field::{kind, oid_field, OID_ALIAS_KEY};

use super::relations::{Relation, Relations};
use crate::results::{INT2VECTOR, PG_TYPE_KEY};

/// PostgreSQL's access method for B-tree indexes (`pg_am`), which a primary key's index is.
const BTREE: i32 = 403;

/// `datafusion-pg-catalog`'s `pg_catalog` with Nyala's tables and keys in it.
#[derive(Debug)]
pub(crate) struct PgCatalog {
    pub library: Arc<dyn SchemaProvider>,
    pub relations: Relations,
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        self.library.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let (kind, schema) = match name.to_ascii_lowercase().as_str() {
            "pg_class" | "pg_attribute" => {
                let Some(table) = self.library.table(name).await? else {
                    return Ok(None);
                };
                match name.eq_ignore_ascii_case("pg_class") {
                    true => (Kind::Class, with_class_options(&oid_typed(&table.schema()))),
                    false => (Kind::Attribute, Arc::new(oid_typed(&table.schema()))),
                }
            }
            "pg_index" => (Kind::Index, index_rows(&[])?.schema()),
            "pg_constraint" => (Kind::Constraint, constraint_rows(&[], 0)?.schema()),
            _ => return self.library.table(name).await,
        };
        let library = self.library.clone();
        let relations = self.relations.clone();
        Ok(Some(Arc::new(CatalogTable {
            kind,
            schema,
            library,
            relations,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.library.table_exist(name)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Class,
    Attribute,
    Index,
    Constraint,
}

/// One of the four tables this module builds.
#[derive(Debug)]
struct CatalogTable {
    kind: Kind,
    schema: SchemaRef,
    library: Arc<dyn SchemaProvider>,
    relations: Relations,
}

/// A table of the users' in the library's `pg_class`, and which it is.
struct Listed {
    row: usize,
    library_oid: i32,
    relation: Relation,
}

#[async_trait]
impl TableProvider for CatalogTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let rows = match self.kind {
            Kind::Class => self.classes(state).await?,
            Kind::Attribute => self.attributes(state).await?,
            Kind::Index => index_rows(&self.relations.list())?,
            Kind::Constraint => {
                let namespace = self.public_namespace(state).await?;
                constraint_rows(&self.relations.list(), namespace)?
            }
        };
        let rows = RecordBatch::try_new(self.schema.clone(), rows.columns().to_vec())?;
        let table = MemTable::try_new(self.schema.clone(), vec![vec![rows]])?;
        table.scan(state, projection, filters, limit).await
    }
}

impl CatalogTable {
    /// All rows of the library's table `name`, in one batch.
    async fn library_rows(&self, state: &dyn Session, name: &str) -> Result<RecordBatch> {
        let table = (self.library.table(name).await?)
            .ok_or_else(|| exec_datafusion_err!("pg_catalog has no {name}"))?;
        let plan = table.scan(state, None, &[], None).await?;
        let batches = collect(plan, state.task_ctx()).await?;
        Ok(concat_batches(&table.schema(), &batches)?)
    }

    /// The OID of the schema `public`, where Nyala's tables are.
    async fn public_namespace(&self, state: &dyn Session) -> Result<i32> {
        let namespaces = self.library_rows(state, "pg_namespace").await?;
        let names = strings(&namespaces, "nspname")?;
        let oids = int32s(&namespaces, "oid")?;
        let public = names
            .iter()
            .position(|n| n.as_deref() == Some(nyala_sql::SCHEMA_NAME));
        Ok(public.and_then(|row| oids[row]).unwrap_or(0))
    }

    /// The library's `pg_class`, and the users' tables in it.
    async fn listed(&self, state: &dyn Session) -> Result<(RecordBatch, Vec<Listed>)> {
        let public = self.public_namespace(state).await?;
        let classes = self.library_rows(state, "pg_class").await?;
        let (oids, names) = (int32s(&classes, "oid")?, strings(&classes, "relname")?);
        let (namespaces, kinds) = (
            int32s(&classes, "relnamespace")?,
            strings(&classes, "relkind")?,
        );
        let mut relations: HashMap<String, Relation> = (self.relations.list().into_iter())
            .map(|relation| (relation.name().to_string(), relation))
            .collect();
        let mut listed = Vec::new();
        for row in 0..classes.num_rows() {
            let table = namespaces[row] == Some(public) && kinds[row].as_deref() == Some("r");
            let relation = names[row]
                .as_ref()
                .filter(|_| table)
                .and_then(|n| relations.remove(n));
            if let (Some(relation), Some(library_oid)) = (relation, oids[row]) {
                listed.push(Listed {
                    row,
                    library_oid,
                    relation,
                });
            }
        }
        Ok((classes, listed))
    }

    /// `pg_class`: the users' tables under their own OIDs, and their keys' indexes.
    async fn classes(&self, state: &dyn Session) -> Result<RecordBatch> {
        let (classes, listed) = self.listed(state).await?;
        let mut oids = int32s(&classes, "oid")?;
        let mut has_index = bools(&classes, "relhasindex")?;
        for table in &listed {
            oids[table.row] = Some(table.relation.oid());
            has_index[table.row] = Some(!table.relation.key_attnums().is_empty());
        }
        let oids: ArrayRef = Arc::new(Int32Array::from(oids));
        let classes = replaced(
            classes,
            [
                ("oid", oids.clone()),
                ("relfilenode", oids),
                ("relhasindex", Arc::new(BooleanArray::from(has_index))),
            ],
        )?;
        let keyed: Vec<&Listed> = (listed.iter())
            .filter(|table| !table.relation.key_attnums().is_empty())
            .collect();
        let rows = UInt32Array::from_iter_values(keyed.iter().map(|table| table.row as u32));
        let index_oids: ArrayRef = Arc::new(Int32Array::from_iter_values(
            keyed.iter().map(|table| table.relation.index_oid()),
        ));
        let n = keyed.len();
        let indexes = replaced(
            take_record_batch(&classes, &rows)?,
            [
                ("oid", index_oids.clone()),
                ("relfilenode", index_oids),
                (
                    "relname",
                    Arc::new(StringArray::from_iter_values(
                        keyed.iter().map(|table| table.relation.key_name()),
                    )),
                ),
                ("relkind", Arc::new(StringArray::from(vec!["i"; n]))),
                ("relam", Arc::new(Int32Array::from(vec![BTREE; n]))),
                ("reltype", Arc::new(Int32Array::from(vec![0; n]))),
                ("relhasindex", Arc::new(BooleanArray::from(vec![false; n]))),
                (
                    "relnatts",
                    Arc::new(Int16Array::from_iter_values(
                        keyed
                            .iter()
                            .map(|table| table.relation.key_attnums().len() as i16),
                    )),
                ),
            ],
        )?;
        let classes = concat_batches(&classes.schema(), [&classes, &indexes])?;
        let rows = classes.num_rows();
        let mut columns = classes.columns().to_vec();
        columns.extend(CLASS_OPTIONS.map(|name| null_column(name, DataType::Utf8, rows).1));
        Ok(RecordBatch::try_new(
            with_class_options(&classes.schema()),
            columns,
        )?)
    }

    /// `pg_attribute`: the users' tables' columns under the tables' own OIDs, and their keys'
    /// indexes' columns (numbered by their place in the key).
    async fn attributes(&self, state: &dyn Session) -> Result<RecordBatch> {
        let (_, listed) = self.listed(state).await?;
        let attributes = self.library_rows(state, "pg_attribute").await?;
        let by_library_oid: HashMap<i32, &Relation> = (listed.iter())
            .map(|table| (table.library_oid, &table.relation))
            .collect();
        let relids: Vec<Option<i32>> = (int32s(&attributes, "attrelid")?.into_iter())
            .map(|relid| relid.map(|r| by_library_oid.get(&r).map_or(r, |t| t.oid())))
            .collect();
        let attnums = int16s(&attributes, "attnum")?;
        let rows_by_column: HashMap<(Option<i32>, Option<i16>), usize> = (0..relids.len())
            .map(|row| ((relids[row], attnums[row]), row))
            .collect();
        let (mut rows, mut index_relids, mut index_attnums) = (vec![], vec![], vec![]);
        for table in &listed {
            for (position, attnum) in table.relation.key_attnums().into_iter().enumerate() {
                let column = (Some(table.relation.oid()), Some(attnum));
                if let Some(&row) = rows_by_column.get(&column) {
                    rows.push(row as u32);
                    index_relids.push(table.relation.index_oid());
                    index_attnums.push(position as i16 + 1);
                }
            }
        }
        let attributes = replaced(
            attributes,
            [("attrelid", Arc::new(Int32Array::from(relids)) as ArrayRef)],
        )?;
        let indexes = replaced(
            take_record_batch(&attributes, &UInt32Array::from(rows))?,
            [
                (
                    "attrelid",
                    Arc::new(Int32Array::from(index_relids)) as ArrayRef,
                ),
                ("attnum", Arc::new(Int16Array::from(index_attnums))),
            ],
        )?;
        Ok(concat_batches(
            &attributes.schema(),
            [&attributes, &indexes],
        )?)
    }
}

/// Columns of `pg_class` that the library's lacks and clients read (SQLAlchemy's index
/// reflection): no table has options or an access-control list.
const CLASS_OPTIONS: [&str; 2] = ["reloptions", "relacl"];

/// `schema` with its OID columns typed `oid`, as PostgreSQL types them: the library types
/// some as `regclass`, `regtype` or `regnamespace`, which drivers read as names (psycopg
/// returns `pg_constraint.conrelid` as a string, and SQLAlchemy then matches no table).
fn oid_typed(schema: &Schema) -> Schema {
    let fields = schema.fields().iter().map(|field| {
        let mut metadata = field.metadata().clone();
        if let Some(kind) = metadata.get_mut(OID_ALIAS_KEY) {
            *kind = kind::OID.to_string();
        }
        field.as_ref().clone().with_metadata(metadata)
    });
    Schema::new_with_metadata(fields.collect::<Vec<_>>(), schema.metadata().clone())
}

/// The library's `pg_class` schema with [`CLASS_OPTIONS`].
fn with_class_options(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.extend(CLASS_OPTIONS.map(|name| Field::new(name, DataType::Utf8, true)));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `pg_index`: one unique index per table with a key.
fn index_rows(relations: &[Relation]) -> Result<RecordBatch> {
    let keyed: Vec<&Relation> = (relations.iter())
        .filter(|relation| !relation.key_attnums().is_empty())
        .collect();
    let n = keyed.len();
    let lengths = || keyed.iter().map(|relation| relation.key_attnums().len());
    let natts = || Int16Array::from_iter_values(lengths().map(|len| len as i16));
    let flag = |value: bool| Arc::new(BooleanArray::from(vec![value; n])) as ArrayRef;
    let zeros = |element: DataType| zero_lists(element, lengths());
    let mut columns: Vec<(Field, ArrayRef)> = vec![
        (
            oid_field("indexrelid", kind::OID, false),
            Arc::new(Int32Array::from_iter_values(
                keyed.iter().map(|r| r.index_oid()),
            )),
        ),
        (
            oid_field("indrelid", kind::OID, false),
            Arc::new(Int32Array::from_iter_values(keyed.iter().map(|r| r.oid()))),
        ),
        (
            Field::new("indnatts", DataType::Int16, false),
            Arc::new(natts()),
        ),
        (
            Field::new("indnkeyatts", DataType::Int16, false),
            Arc::new(natts()),
        ),
    ];
    for (name, value) in [
        ("indisunique", true),
        ("indnullsnotdistinct", false),
        ("indisprimary", true),
        ("indisexclusion", false),
        ("indimmediate", true),
        ("indisclustered", false),
        ("indisvalid", true),
        ("indcheckxmin", false),
        ("indisready", true),
        ("indislive", true),
        ("indisreplident", false),
    ] {
        columns.push((Field::new(name, DataType::Boolean, false), flag(value)));
    }
    columns.extend([
        int2vector_column("indkey", key_lists(keyed.iter().copied())),
        list_column("indcollation", zeros(DataType::Int32)),
        list_column("indclass", zeros(DataType::Int32)),
        int2vector_column("indoption", zeros(DataType::Int16)),
        null_column("indexprs", DataType::Utf8, n),
        null_column("indpred", DataType::Utf8, n),
    ]);
    batch(columns)
}

/// `pg_constraint`: one primary-key constraint per table with a key, in schema `namespace`.
fn constraint_rows(relations: &[Relation], namespace: i32) -> Result<RecordBatch> {
    let keyed: Vec<&Relation> = (relations.iter())
        .filter(|relation| !relation.key_attnums().is_empty())
        .collect();
    let n = keyed.len();
    let oids = |oid: fn(&Relation) -> i32| {
        Arc::new(Int32Array::from_iter_values(keyed.iter().map(|r| oid(r)))) as ArrayRef
    };
    let constant = |value: i32| Arc::new(Int32Array::from(vec![value; n])) as ArrayRef;
    let text = |value: &str| Arc::new(StringArray::from(vec![value; n])) as ArrayRef;
    let flag = |value: bool| Arc::new(BooleanArray::from(vec![value; n])) as ArrayRef;
    let int16_list = DataType::List(Arc::new(Field::new_list_field(DataType::Int16, true)));
    let oid_list = DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true)));
    let columns: Vec<(Field, ArrayRef)> = vec![
        (
            oid_field("oid", kind::OID, false),
            oids(Relation::constraint_oid),
        ),
        (
            Field::new("conname", DataType::Utf8, false),
            Arc::new(StringArray::from_iter_values(
                keyed.iter().map(|r| r.key_name()),
            )),
        ),
        (
            oid_field("connamespace", kind::OID, false),
            constant(namespace),
        ),
        (Field::new("contype", DataType::Utf8, false), text("p")),
        (
            Field::new("condeferrable", DataType::Boolean, false),
            flag(false),
        ),
        (
            Field::new("condeferred", DataType::Boolean, false),
            flag(false),
        ),
        (
            Field::new("convalidated", DataType::Boolean, false),
            flag(true),
        ),
        (oid_field("conrelid", kind::OID, false), oids(Relation::oid)),
        (oid_field("contypid", kind::OID, false), constant(0)),
        (
            oid_field("conindid", kind::OID, false),
            oids(Relation::index_oid),
        ),
        (oid_field("conparentid", kind::OID, false), constant(0)),
        (oid_field("confrelid", kind::OID, false), constant(0)),
        (Field::new("confupdtype", DataType::Utf8, false), text(" ")),
        (Field::new("confdeltype", DataType::Utf8, false), text(" ")),
        (
            Field::new("confmatchtype", DataType::Utf8, false),
            text(" "),
        ),
        (
            Field::new("conislocal", DataType::Boolean, false),
            flag(true),
        ),
        (
            Field::new("coninhcount", DataType::Int16, false),
            Arc::new(Int16Array::from(vec![0; n])),
        ),
        (
            Field::new("connoinherit", DataType::Boolean, false),
            flag(true),
        ),
        list_column("conkey", key_lists(keyed.iter().copied())),
        null_column("confkey", int16_list.clone(), n),
        null_column("conpfeqop", oid_list.clone(), n),
        null_column("conppeqop", oid_list.clone(), n),
        null_column("conffeqop", oid_list.clone(), n),
        null_column("confdelsetcols", int16_list, n),
        null_column("conexclop", oid_list, n),
        null_column("conbin", DataType::Utf8, n),
    ];
    batch(columns)
}

/// The keys' columns (`pg_attribute.attnum`s), one list per table.
fn key_lists<'a>(relations: impl Iterator<Item = &'a Relation>) -> ListArray {
    ListArray::from_iter_primitive::<Int16Type, _, _>(
        relations.map(|relation| Some(relation.key_attnums().into_iter().map(Some))),
    )
}

/// Lists of zeros (of `element`'s type), of the given lengths.
fn zero_lists(element: DataType, lengths: impl Iterator<Item = usize>) -> ListArray {
    let lengths: Vec<usize> = lengths.collect();
    let int16 = || {
        ListArray::from_iter_primitive::<Int16Type, _, _>(
            lengths.iter().map(|&len| Some(vec![Some(0); len])),
        )
    };
    let int32 = || {
        ListArray::from_iter_primitive::<Int32Type, _, _>(
            lengths.iter().map(|&len| Some(vec![Some(0); len])),
        )
    };
    match element {
        DataType::Int16 => int16(),
        _ => int32(),
    }
}

fn list_column(name: &str, list: ListArray) -> (Field, ArrayRef) {
    (
        Field::new(name, list.data_type().clone(), false),
        Arc::new(list),
    )
}

/// A column of PostgreSQL's `int2vector`: lists of `attnum`s, sent as `int2vector` is.
fn int2vector_column(name: &str, list: ListArray) -> (Field, ArrayRef) {
    let (field, list) = list_column(name, list);
    let metadata = [(PG_TYPE_KEY.to_string(), INT2VECTOR.to_string())];
    (field.with_metadata(metadata.into()), list)
}

fn null_column(name: &str, data_type: DataType, rows: usize) -> (Field, ArrayRef) {
    let nulls = arrow::array::new_null_array(&data_type, rows);
    (Field::new(name, data_type, true), nulls)
}

fn batch(columns: Vec<(Field, ArrayRef)>) -> Result<RecordBatch> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// `batch` with the named columns replaced (each cast to the column's type).
fn replaced<const N: usize>(
    batch: RecordBatch,
    columns: [(&str, ArrayRef); N],
) -> Result<RecordBatch> {
    let schema = batch.schema();
    let mut arrays = batch.columns().to_vec();
    for (name, values) in columns {
        let index = schema.index_of(name)?;
        arrays[index] = cast(&values, schema.field(index).data_type())?;
    }
    Ok(RecordBatch::try_new(schema, arrays)?)
}

fn column(batch: &RecordBatch, name: &str, as_type: &DataType) -> Result<ArrayRef> {
    let index = batch.schema().index_of(name)?;
    Ok(cast(batch.column(index), as_type)?)
}

fn int32s(batch: &RecordBatch, name: &str) -> Result<Vec<Option<i32>>> {
    primitives::<Int32Type>(batch, name)
}

fn int16s(batch: &RecordBatch, name: &str) -> Result<Vec<Option<i16>>> {
    primitives::<Int16Type>(batch, name)
}

/// The values of column `name` of `batch`, as `T`'s.
fn primitives<T: ArrowPrimitiveType>(
    batch: &RecordBatch,
    name: &str,
) -> Result<Vec<Option<T::Native>>> {
    let values = column(batch, name, &T::DATA_TYPE)?;
    Ok(values.as_primitive::<T>().iter().collect())
}

fn bools(batch: &RecordBatch, name: &str) -> Result<Vec<Option<bool>>> {
    let values = column(batch, name, &DataType::Boolean)?;
    Ok(values
        .as_any()
        .downcast_ref::<BooleanArray>()
        .map_or(vec![], |a| a.iter().collect()))
}

fn strings(batch: &RecordBatch, name: &str) -> Result<Vec<Option<String>>> {
    let values = column(batch, name, &DataType::Utf8)?;
    let values = values.as_any().downcast_ref::<StringArray>();
    Ok(values.map_or(vec![], |a| {
        a.iter().map(|s| s.map(str::to_string)).collect()
    }))
}
