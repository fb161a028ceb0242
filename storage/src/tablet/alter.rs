//! Schema changes (Kudu's AlterSchema): columns are added, dropped or renamed, never retyped,
//! and the primary key stays as it is.
//!
//! Columns are matched by id, not by name or position, so a rename moves no data and a dropped
//! and re-added name is a new column. A change rewrites no file: the tablet flushes what it
//! holds in memory (rows in memory have the old columns), and every file keeps the columns it
//! was written with, read as the new schema's (see [`crate::column_map`]): an added column
//! takes its DEFAULT, or NULL, in every version of every row written before; a dropped one is
//! no longer read. Compactions rewrite files in the new columns as they come to them. The
//! switch is one metadata write, whatever the table's size.

use std::sync::Arc;

use super::metadata::Metadata;
use super::Tablet;
use crate::column_map::default_column;
use crate::{Schema, StorageError};

impl Tablet {
    /// Changes the schema as log entry `index`: flushes the MemRowSet and the delta stores,
    /// then switches to the new schema with one metadata write, the files kept as they are and
    /// read as the new schema's columns. A crash before that write leaves the old schema, and
    /// replaying the log applies the change again. (Writes wait meanwhile: they come in log
    /// order after this entry.)
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
            match source {
                Some(o) if old.columns()[*o].column_type != column.column_type => {
                    return Err(StorageError::InvalidSchema(format!(
                        "a schema change cannot change the type of column '{}'",
                        column.name
                    )));
                }
                Some(_) => {}
                // Rows written before read its DEFAULT: it must be one.
                None => {
                    default_column(column, 1)?;
                }
            }
        }
        self.flush_rewriting()?;
        let table = Arc::new(schema.clone());
        let mut state = self.state.write();
        let rowsets = (state.rowsets.iter())
            .map(|r| r.for_table(&old, &table).map(Arc::new))
            .collect::<Result<Vec<_>, StorageError>>()?;
        let deltas: Vec<_> = (state.deltas.iter())
            .map(|d| d.for_table(&old, &table))
            .collect();
        // Everything before this entry is in the files the flush wrote.
        self.write_metadata(&Metadata {
            position_base: state.position_base,
            requests: state.requests.persisted(index),
            ..Metadata::of(
                schema,
                &rowsets,
                &deltas,
                state.next_rowset_id,
                index,
                state.next_auto_id,
                state.txns_file,
            )
        })?;
        state.rowsets = rowsets;
        state.deltas = deltas;
        state.schema = table;
        state.durable_index = state.durable_index.max(index);
        state.last_applied = state.last_applied.max(index);
        drop(state);
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
