//! Primary-key lookups without the query engine's fixed costs.
//!
//! A prepared query that returns columns of one row picked by its whole primary key
//! (`SELECT a, b FROM t WHERE k1 = $1 AND k2 = $2`) is what serving workloads run most. Planning
//! it with DataFusion at every execution (optimizer rules, physical planning, an operator
//! pipeline with its own threads and channels) costs far more than reading the row. Such a
//! statement is recognised once, when it is prepared, from its optimized logical plan; each
//! execution binds the key, finds the one tablet that can hold it (the partitioning of the key
//! columns), reads that tablet at its own safe snapshot and returns the row as it is stored.
//!
//! The fast path is taken only where it gives exactly DataFusion's answer: the plan is a
//! projection of plain columns over a filter over a Nyala table scan (no `AS OF`, no LIMIT), the
//! filter is a conjunction of `key column = parameter or literal` covering every key column, and
//! the bound values convert losslessly to the key columns' types (then storage evaluates the
//! predicates exactly). Anything else, including a value that would need a lossy conversion, is
//! planned by DataFusion as before.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::datasource::source_as_provider;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};
use nyala_engine::{Client, TableHandle};
use nyala_storage::{PredicateOp, ScanSpec, Timestamp, WriteKind};

use crate::catalog::predicate::to_predicates;
use crate::catalog::table::NyalaTable;
use crate::exec::mutation::{pause, MAX_RESTARTS};
use crate::exec::sink::{NyalaSink, Outcome};
use crate::plan::params::cast_params;
use crate::results::stream_of;
use crate::session::transaction::OpenTxn;
use crate::{Result, SqlError};

/// A prepared query recognised as a lookup by the whole primary key.
#[derive(Clone)]
pub(crate) struct KeyLookup {
    table: TableHandle,
    /// The WHERE clause: one equality per key column, with the statement's placeholders.
    filter: Expr,
    /// The types the statement implies for its parameters `$1..$n`.
    parameters: Vec<Option<DataType>>,
    /// Table columns returned, in order.
    columns: Vec<usize>,
    /// The result schema promised to the client (the statement's).
    schema: SchemaRef,
}

/// One execution of a [`KeyLookup`], its key bound.
pub(crate) struct BoundLookup {
    table: TableHandle,
    spec: ScanSpec,
    /// The tablet that can hold the key; None when no tablet can (a range partition missing).
    tablet: Option<usize>,
    schema: SchemaRef,
}

/// A scan of one Nyala table filtered to one key: the shape under a key lookup's projection.
struct KeyedScan {
    table: TableHandle,
    /// One equality per key column, with placeholders.
    filter: Expr,
    /// The scan's own projection (table columns), if it has one.
    projection: Option<Vec<usize>>,
}

impl KeyedScan {
    /// `plan` (optimized) as a scan of a Nyala table whose filter pins every key column.
    fn recognise(plan: &LogicalPlan) -> Option<Self> {
        let (mut conjuncts, input) = match plan {
            LogicalPlan::Filter(f) => (split_conjunction(&f.predicate), f.input.as_ref()),
            other => (Vec::new(), other),
        };
        let LogicalPlan::TableScan(scan) = input else {
            return None;
        };
        if scan.fetch.is_some() {
            return None;
        }
        conjuncts.extend(scan.filters.iter().flat_map(split_conjunction));
        let provider = source_as_provider(&scan.source).ok()?;
        let (table, as_of) = provider.downcast_ref::<NyalaTable>()?.handle();
        if as_of {
            return None;
        }
        // Every conjunct compares a key column with a value; together they cover the key.
        let mut keyed = BTreeSet::new();
        let mut filter: Vec<Expr> = Vec::new();
        for conjunct in conjuncts {
            if filter.contains(conjunct) {
                continue; // the filter above the scan repeats the filters pushed into it
            }
            let Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) = conjunct
            else {
                return None;
            };
            let value = |e: &Expr| matches!(e, Expr::Placeholder(_) | Expr::Literal(..));
            let key = match (column_of(&table, left), column_of(&table, right)) {
                (Some(c), None) if value(right) => c,
                (None, Some(c)) if value(left) => c,
                _ => return None,
            };
            if !table.schema.is_key_column(key) {
                return None;
            }
            keyed.insert(key);
            filter.push(conjunct.clone());
        }
        let whole_key = table.schema.key_columns().iter().all(|k| keyed.contains(k));
        let filter = filter.into_iter().reduce(Expr::and)?;
        whole_key.then(|| KeyedScan {
            table,
            filter,
            projection: scan.projection.clone(),
        })
    }
}

/// The table column `e` is, if it is a plain column.
fn column_of(table: &TableHandle, e: &Expr) -> Option<usize> {
    match e {
        Expr::Column(c) => table.schema.column_index(&c.name),
        _ => None,
    }
}

/// `plan` split into its top projection's expressions (if it has one) and its input.
fn projection_of(plan: &LogicalPlan) -> (Option<&Vec<Expr>>, &LogicalPlan) {
    match plan {
        LogicalPlan::Projection(p) => (Some(&p.expr), p.input.as_ref()),
        other => (None, other),
    }
}

impl KeyLookup {
    /// `plan` (an optimized query plan with result schema `schema`) as a key lookup, if it is one.
    pub(crate) fn recognise(
        plan: &LogicalPlan,
        schema: &SchemaRef,
        parameters: &[Option<DataType>],
    ) -> Option<Self> {
        let (projection, input) = projection_of(plan);
        let scan = KeyedScan::recognise(input)?;
        let table = &scan.table;
        let columns: Vec<usize> = match (projection, &scan.projection) {
            (Some(exprs), _) => (exprs.iter())
                .map(|e| column_of(table, e))
                .collect::<Option<_>>()?,
            (None, Some(projection)) => projection.clone(),
            (None, None) => (0..table.schema.columns().len()).collect(),
        };
        let stored = table.schema.arrow_schema();
        let same_types = schema.fields().len() == columns.len()
            && (schema.fields().iter().zip(&columns))
                .all(|(field, &c)| field.data_type() == stored.field(c).data_type());
        same_types.then(|| KeyLookup {
            filter: scan.filter,
            table: scan.table,
            parameters: parameters.to_vec(),
            columns,
            schema: schema.clone(),
        })
    }

    /// The lookup of the key `params` give, or None where the values do not convert losslessly
    /// to the key's types (DataFusion plans that execution instead).
    pub(crate) fn bind(&self, params: &[ScalarValue]) -> Result<Option<BoundLookup>> {
        self.bind_values(&cast_params(&self.parameters, params)?)
    }

    /// [`KeyLookup::bind`] with the parameters cast to the statement's types already.
    fn bind_values(&self, values: &[ScalarValue]) -> Result<Option<BoundLookup>> {
        let bound = bind_placeholders(self.filter.clone(), values)?;
        let schema = &self.table.schema;
        let Some(predicates) = to_predicates(schema, &bound) else {
            return Ok(None);
        };
        let exact = predicates
            .iter()
            .all(|p| matches!(p.op, PredicateOp::Eq(_)) && schema.is_key_column(p.column));
        if !exact || predicates.len() < schema.key_columns().len() {
            return Ok(None);
        }
        let tablet = self
            .table
            .partition
            .prune(schema, &predicates)
            .first()
            .copied();
        Ok(Some(BoundLookup {
            table: self.table.clone(),
            spec: ScanSpec {
                projection: Some(self.columns.clone()),
                predicates,
                snapshot: Timestamp(0), // the tablet's safe snapshot, when run
                limit: None,
                batch_size: 1024,
                string_views: false,
                changes_since: None,
            },
            tablet,
            schema: self.schema.clone(),
        }))
    }
}

impl BoundLookup {
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Reads the row (none or one) at the tablet's safe snapshot, which includes every write
    /// this client saw acknowledged; in a transaction `txn`, at its snapshot, where its own
    /// version of the key (written or deleted) replaces the stored one.
    pub(crate) async fn run(
        &self,
        client: &Client,
        txn: Option<&OpenTxn>,
    ) -> Result<Vec<RecordBatch>> {
        let Some(txn) = txn.filter(|_| self.tablet.is_some()) else {
            return match self.snapshot(client).await? {
                Some(snapshot) => self.read_at(client, snapshot).await,
                None => Ok(Vec::new()),
            };
        };
        let snapshot = txn.snapshot_for(&self.table).await?;
        let Some(overlay) = txn.overlay(&self.table.id) else {
            return self.read_at(client, snapshot).await;
        };
        let (spec, asked) = overlay.widen(&self.table, self.spec.clone());
        let mut rows = Vec::new();
        for stored in self.read(client, spec, snapshot).await? {
            rows.push(self.renamed(&overlay.hide_replaced(&self.table, stored, asked)?)?);
        }
        rows.extend(overlay.rows_matching(&self.table, &self.spec, &self.schema)?);
        Ok(rows.into_iter().filter(|b| b.num_rows() > 0).collect())
    }

    /// The safe snapshot of the tablet that can hold the key; None if no tablet can.
    async fn snapshot(&self, client: &Client) -> Result<Option<Timestamp>> {
        match self.tablet {
            Some(tablet) => Ok(Some(client.safe_snapshot_of(&self.table, &[tablet]).await?)),
            None => Ok(None),
        }
    }

    /// Reads the row (none or one) at `snapshot`.
    async fn read_at(&self, client: &Client, snapshot: Timestamp) -> Result<Vec<RecordBatch>> {
        let batches = self.read(client, self.spec.clone(), snapshot).await?;
        (batches.iter())
            .filter(|b| b.num_rows() > 0)
            .map(|b| self.renamed(b))
            .collect()
    }

    /// `batch`, with the table's column names, in the statement's schema (promised to the
    /// client).
    fn renamed(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            self.schema.clone(),
            batch.columns().to_vec(),
        )?)
    }

    /// The stored rows `spec` reads from the key's tablet at `snapshot`, as the scan gives
    /// them.
    async fn read(
        &self,
        client: &Client,
        spec: ScanSpec,
        snapshot: Timestamp,
    ) -> Result<Vec<RecordBatch>> {
        let Some(tablet) = self.tablet else {
            return Ok(Vec::new());
        };
        let ready = client.scan_tablet_if_ready(&self.table, tablet, spec.clone(), snapshot);
        Ok(match ready {
            // A tablet of this process with every write below the snapshot applied: the lookup
            // reads a few key-index and data pages, here rather than through a hand-off to the
            // blocking pool and back (which cost more than the lookup).
            Some(scan) => scan?
                .collect::<Result<Vec<_>, _>>()
                .map_err(nyala_engine::EngineError::from)?,
            None => {
                let (client, table) = (client.clone(), self.table.clone());
                // Opening a scan may wait for writes in flight below the snapshot.
                tokio::task::spawn_blocking(move || {
                    client
                        .scan_tablet(&table, tablet, spec, Some(snapshot))?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(nyala_engine::EngineError::from)
                })
                .await
                .map_err(|e| {
                    SqlError::DataFusion(format!("the key lookup did not finish: {e}"))
                })??
            }
        })
    }
}

/// A prepared UPDATE or DELETE of one row picked by its whole primary key, whose assignments
/// are parameters or constants (`UPDATE t SET a = $1, b = 'x' WHERE k = $2`): each execution
/// reads the key at the tablet's safe snapshot, writes the row on condition that it has not
/// changed since, and starts again at a newer snapshot if it has, as
/// [`crate::exec::mutation::ConditionalMutationExec`] does for every other UPDATE and DELETE.
#[derive(Clone)]
pub(crate) struct KeyMutation {
    /// Reads the key columns of the target row.
    lookup: KeyLookup,
    kind: WriteKind,
    /// The assigned columns (table column names) and their values.
    assignments: Vec<(String, Expr)>,
}

/// One execution of a [`KeyMutation`], its values bound.
pub(crate) struct BoundMutation {
    lookup: BoundLookup,
    kind: WriteKind,
    assignments: Vec<(String, ScalarValue)>,
}

impl KeyMutation {
    /// An UPDATE or DELETE (`kind`) of `table`, whose optimized input `input` yields the key
    /// columns of the target rows and the assigned values, as a key mutation if it is one.
    pub(crate) fn recognise(
        kind: WriteKind,
        input: &LogicalPlan,
        parameters: &[Option<DataType>],
    ) -> Option<Self> {
        if !matches!(kind, WriteKind::Update | WriteKind::Delete) {
            return None;
        }
        let (projection, below) = projection_of(input);
        let scan = KeyedScan::recognise(below)?;
        let table = &scan.table;
        let mut assignments = Vec::new();
        for expr in projection.map(Vec::as_slice).unwrap_or_default() {
            let (value, name) = match expr {
                Expr::Alias(alias) => (alias.expr.as_ref(), alias.name.clone()),
                other => (other, other.schema_name().to_string()),
            };
            let column = table.schema.column_index(&name)?;
            match table.schema.is_key_column(column) {
                true if column_of(table, value) == Some(column) => {}
                false if is_constant(value) => assignments.push((name, value.clone())),
                _ => return None,
            }
        }
        let keys = table.schema.key_columns().to_vec();
        let schema = Arc::new(table.schema.arrow_schema().project(&keys).ok()?);
        Some(KeyMutation {
            lookup: KeyLookup {
                filter: scan.filter,
                table: scan.table,
                parameters: parameters.to_vec(),
                columns: keys,
                schema,
            },
            kind,
            assignments,
        })
    }

    /// The mutation with `params` bound, or None where the key's values do not convert
    /// losslessly to its types (DataFusion plans that execution instead).
    pub(crate) fn bind(&self, params: &[ScalarValue]) -> Result<Option<BoundMutation>> {
        let values = cast_params(&self.lookup.parameters, params)?;
        let Some(lookup) = self.lookup.bind_values(&values)? else {
            return Ok(None);
        };
        let mut assignments = Vec::with_capacity(self.assignments.len());
        for (name, expr) in &self.assignments {
            let Some(value) = evaluate_constant(bind_placeholders(expr.clone(), &values)?)? else {
                return Ok(None);
            };
            assignments.push((name.clone(), value));
        }
        Ok(Some(BoundMutation {
            lookup,
            kind: self.kind,
            assignments,
        }))
    }
}

impl BoundMutation {
    /// Writes the row if it exists; returns the number of rows changed (0 or 1).
    pub(crate) async fn run(&self, client: &Client) -> Result<u64> {
        let table = &self.lookup.table;
        let sink = |schema| NyalaSink::new(client.clone(), table.clone(), self.kind, schema);
        for restart in 0..=MAX_RESTARTS {
            let Some(snapshot) = self.lookup.snapshot(client).await? else {
                return Ok(0);
            };
            let keys = self.lookup.read_at(client, snapshot).await?;
            let Some(keys) = keys.first() else {
                return Ok(0);
            };
            let rows = self.rows(keys)?;
            let sink = sink(rows.schema());
            // Never in a transaction (the session plans those through DataFusion).
            let outside_transactions = TaskContext::default();
            let rows = stream_of(rows.schema(), vec![rows])?;
            match sink
                .write_statement(rows, Some(snapshot), &outside_transactions)
                .await?
            {
                Outcome::Written(rows) => return Ok(rows),
                Outcome::Conflict if restart == MAX_RESTARTS => break,
                Outcome::Conflict => tokio::time::sleep(pause(restart)).await,
            }
        }
        Err(SqlError::DataFusion(format!(
            "{} could not finish: the row it changes was changed by other statements {} times              in a row; run it again",
            sink(self.lookup.schema()).verb(),
            MAX_RESTARTS
        )))
    }

    /// The rows to write: the keys read, and for an UPDATE the assigned values (cast to the
    /// table's types by the sink).
    fn rows(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        let mut fields: Vec<FieldRef> = keys.schema().fields().iter().cloned().collect();
        let mut columns = keys.columns().to_vec();
        for (name, value) in &self.assignments {
            fields.push(Arc::new(Field::new(name, value.data_type(), true)));
            columns.push(value.to_array_of_size(keys.num_rows())?);
        }
        Ok(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns,
        )?)
    }
}

/// Whether `e` is built of parameters and literals only (casts of them included).
fn is_constant(e: &Expr) -> bool {
    match e {
        Expr::Placeholder(_) | Expr::Literal(..) => true,
        Expr::Cast(cast) => is_constant(&cast.expr),
        Expr::TryCast(cast) => is_constant(&cast.expr),
        _ => false,
    }
}

/// The value of a constant expression ([`is_constant`], its placeholders bound); None for
/// anything else.
fn evaluate_constant(e: Expr) -> Result<Option<ScalarValue>> {
    Ok(match e {
        Expr::Literal(value, _) => Some(value),
        Expr::Cast(cast) => match evaluate_constant(*cast.expr)? {
            Some(value) => Some(value.cast_to(cast.field.data_type())?),
            None => None,
        },
        Expr::TryCast(cast) => match evaluate_constant(*cast.expr)? {
            Some(value) => Some(
                value
                    .cast_to(cast.field.data_type())
                    .or_else(|_| ScalarValue::try_from(cast.field.data_type()))?,
            ),
            None => None,
        },
        _ => None,
    })
}

/// `expr` with each placeholder `$n` replaced by `values[n - 1]`.
fn bind_placeholders(expr: Expr, values: &[ScalarValue]) -> Result<Expr> {
    let bound = expr.transform(|e| match e {
        Expr::Placeholder(p) => {
            let value = (p.id.strip_prefix('$'))
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|n| values.get(n.checked_sub(1)?))
                .ok_or_else(|| {
                    DataFusionError::Plan(format!("no value bound for parameter {}", p.id))
                })?;
            Ok(Transformed::yes(Expr::Literal(value.clone(), None)))
        }
        other => Ok(Transformed::no(other)),
    })?;
    Ok(bound.data)
}
