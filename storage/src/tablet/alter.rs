//! Schema changes (Kudu's AlterSchema): columns are added, dropped or renamed, never retyped,
//! and the primary key stays as it is.
//!
//! Columns are matched by id, not by name or position, so a rename moves no data and a dropped
//! and re-added name is a new column. The change rewrites every rowset with its whole history
//! in the new layout (an added column takes its DEFAULT, or NULL, in every version) and switches
//! to the new schema and files with one metadata write, so a tablet never holds files of two
//! schemas.

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast, take};

use super::metadata::Metadata;
use super::rewrite::{Carry, Output, Snapshot};
use super::Tablet;
use crate::history;
use crate::{Schema, StorageError};

impl Tablet {
    /// Changes the schema as log entry `index`: flushes, rewrites every rowset and its history
    /// with the new columns (values found by column id; an added column takes its DEFAULT or
    /// NULL), then switches to the new schema and files with one metadata write. A crash before
    /// that write leaves the old schema and files, and replaying the log applies the change again.
    /// (Writes wait meanwhile: they come in log order after this entry.)
    pub fn alter_schema(&self, index: u64, schema: &Schema) -> Result<(), StorageError> {
        let _rewriting = self.rewriting.lock();
        let old = self.schema();
        if schema.same_columns(&old) {
            return self.alter_options(index, schema);
        }
        if self.state.read().has_pending() {
            return Err(StorageError::TxnState(
                "the table has transactions in progress; change its schema again when they end"
                    .into(),
            ));
        }
        let sources = schema.sources_in(&old);
        let key_ids = |s: &Schema| -> Vec<u32> {
            let ids = s.ids();
            s.key_columns().iter().map(|&k| ids[k]).collect()
        };
        if key_ids(schema) != key_ids(&old) {
            return Err(StorageError::InvalidSchema(
                "a schema change cannot change the primary key".into(),
            ));
        }
        for (column, source) in schema.columns().iter().zip(&sources) {
            if let Some(o) = source {
                if old.columns()[*o].column_type != column.column_type {
                    return Err(StorageError::InvalidSchema(format!(
                        "a schema change cannot change the type of column '{}'",
                        column.name
                    )));
                }
            }
        }
        self.flush_rewriting()?;
        let snapshot = Snapshot::of(&self.state.read());
        let ancient = self.ancient_history_mark();
        let table = history::nullable(&schema.arrow_schema());
        self.rewrite(
            &snapshot,
            schema,
            index,
            Carry::Compaction,
            |snap, files| {
                let mut out = Vec::new();
                for (rowset, history) in snap.rowsets.iter().zip(&snap.deltas) {
                    let mut images = Vec::new();
                    let chains =
                        history::rowset_chains(rowset, history, old.columns().len(), &mut images)?;
                    let images = images
                        .iter()
                        .map(|batch| {
                            let columns = schema
                                .columns()
                                .iter()
                                .zip(&sources)
                                .map(|(column, source)| match source {
                                    Some(o) => Ok(batch.column(*o).clone()),
                                    None => default_column(column, batch.num_rows()),
                                })
                                .collect::<Result<Vec<_>, StorageError>>()?;
                            Ok(RecordBatch::try_new(table.clone(), columns)?)
                        })
                        .collect::<Result<Vec<_>, StorageError>>()?;
                    let refs: Vec<&RecordBatch> = images.iter().collect();
                    let rows = rowset.num_rows().max(1);
                    for new in history::write_chains(files, schema, &refs, chains, ancient, rows)? {
                        out.push(Output::new(new));
                    }
                }
                Ok(out)
            },
        )?;
        self.keep_history_of(schema);
        Ok(())
    }

    /// A schema change of the table's options alone (its history retention): the metadata
    /// takes the new schema, no file changes. Entries after the metadata's durable index are
    /// replayed under it after a crash, the same columns as before.
    fn alter_options(&self, index: u64, schema: &Schema) -> Result<(), StorageError> {
        let mut state = self.state.write();
        self.write_metadata(&Metadata {
            position_base: state.position_base,
            requests: state.requests.persisted(state.durable_index),
            ..Metadata::of(
                schema,
                &state.rowsets,
                &state.deltas,
                state.next_rowset_id,
                state.durable_index,
                state.next_auto_id,
                state.txns_file,
            )
        })?;
        state.schema = std::sync::Arc::new(schema.clone());
        state.last_applied = state.last_applied.max(index);
        drop(state);
        self.keep_history_of(schema);
        Ok(())
    }
}

/// `n` copies of `column`'s DEFAULT, or NULLs without one.
fn default_column(column: &crate::ColumnSchema, n: usize) -> Result<ArrayRef, StorageError> {
    let data_type = column.column_type.arrow_type();
    let Some(text) = &column.default else {
        return Ok(new_null_array(&data_type, n));
    };
    let one = cast(&StringArray::from(vec![text.as_str()]), &data_type)?;
    if one.is_null(0) {
        return Err(StorageError::InvalidSchema(format!(
            "DEFAULT '{text}' of column '{}' is not a {}",
            column.name,
            column.column_type.sql_name()
        )));
    }
    Ok(take(&one, &UInt32Array::from(vec![0u32; n]), None)?)
}
