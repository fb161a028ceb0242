//! Restoring a backup: the chain of backups followed back to the full one and checked, the
//! tables created as they were, and each key's newest row across the chain loaded.

use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use datafusion::logical_expr::JoinType;
use datafusion::prelude::{
    ident, lit, DataFrame, ParquetReadOptions, SessionConfig, SessionContext,
};
use futures::TryStreamExt;
use nyala_storage::CHANGE_COLUMN;

use crate::backup::manifest::{Manifest, TableBackup};
use crate::backup::{blocking, stopped, Progress};
use crate::ingest::{IngestMode, IngestTarget};
use crate::parse::statement::{CreateTableSpec, Ddl, RestoreSpec};
use crate::session::Session;
use crate::{Result, SqlError};

/// Something a restore made, dropped again if it fails.
enum Made {
    Table(String),
    View(String),
}

impl Session {
    /// Restores what `spec` asks from the backup it names, reporting each table and view to
    /// `progress`. Nothing is created unless every file of the chain is there and intact; a
    /// failure (or the statement stopped) drops what was made.
    pub(super) async fn restore_backup(&self, spec: RestoreSpec, progress: Progress) -> Result<()> {
        let dir = std::path::absolute(&spec.path)
            .map_err(|e| crate::backup::manifest::io_error(Path::new(&spec.path), "find", e))?;
        let chain = blocking(move || Manifest::chain(&dir)).await?;
        let (newest_dir, newest) = chain.last().expect("a chain holds its newest backup");
        // (the backup's table, the name it is restored as)
        let tables: Vec<(&TableBackup, String)> = match &spec.table {
            Some((name, restored_as)) => {
                let table = newest.table(name).ok_or_else(|| {
                    SqlError::Invalid(format!(
                        "the backup in {} holds no table '{name}'",
                        newest_dir.display()
                    ))
                })?;
                vec![(table, restored_as.clone())]
            }
            None => newest.tables.iter().map(|t| (t, t.name.clone())).collect(),
        };
        let views = match spec.table {
            Some(_) => &[][..],
            None => &newest.views[..],
        };
        for (table, _) in &tables {
            for (dir, manifest) in &chain {
                if manifest.table(&table.name).is_none_or(|t| t.id != table.id) {
                    return Err(SqlError::Invalid(format!(
                        "the backup in {} does not hold table '{}' that {} continues",
                        dir.display(),
                        table.name,
                        newest_dir.display()
                    )));
                }
            }
        }
        let client = &self.db.client;
        let names = tables
            .iter()
            .map(|(_, name)| name)
            .chain(views.iter().map(|v| &v.name));
        for name in names {
            if client.table(name).is_ok() || client.view(name).is_some() {
                return Err(SqlError::Invalid(format!(
                    "'{name}' already exists; drop it, or restore the table under another name \
                     (RESTORE TABLE t FROM '...' AS other)"
                )));
            }
        }
        let files: Vec<_> = (chain.iter())
            .flat_map(|(dir, manifest)| {
                (tables.iter())
                    .filter_map(|(t, _)| manifest.table(&t.name))
                    .flat_map(|t| t.files.iter().map(|f| (dir.clone(), f.clone())))
            })
            .collect();
        blocking(move || files.iter().try_for_each(|(dir, file)| file.verify(dir))).await?;

        let steps = (tables.len() + views.len()) as u64;
        let mut made = Vec::new();
        let restored = async {
            let mut step = 0;
            for (table, name) in &tables {
                Ddl::CreateTable(CreateTableSpec {
                    name: name.clone(),
                    if_not_exists: false,
                    replicas: table.replicas,
                    schema: table.schema.clone(),
                    partition: table.partition.clone(),
                })
                .apply(client, self.user())
                .await?;
                made.push(Made::Table(name.clone()));
                let rows = self.load(&chain, table, name, &progress).await?;
                step += 1;
                progress.restored(step, steps, name, "table", rows).await?;
            }
            for view in views {
                Ddl::CreateView {
                    name: view.name.clone(),
                    sql: view.sql.clone(),
                    or_replace: false,
                }
                .apply(client, self.user())
                .await?;
                made.push(Made::View(view.name.clone()));
                step += 1;
                progress
                    .restored(step, steps, &view.name, "view", 0)
                    .await?;
            }
            Ok::<_, SqlError>(())
        }
        .await;
        if let Err(e) = restored {
            for made in made.into_iter().rev() {
                let drop = match made {
                    Made::Table(name) => Ddl::DropTable {
                        name,
                        if_exists: true,
                    },
                    Made::View(name) => Ddl::DropView {
                        name,
                        if_exists: true,
                    },
                };
                if let Err(drop_error) = drop.apply(client, None).await {
                    tracing::warn!("a failed restore could not drop what it made: {drop_error}");
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Loads into the new table `name` each key's newest row across `chain` (oldest first):
    /// the rows of the newest backup holding the key, unless it was deleted there. Returns the
    /// rows loaded.
    async fn load(
        &self,
        chain: &[(PathBuf, Manifest)],
        table: &TableBackup,
        name: &str,
        progress: &Progress,
    ) -> Result<u64> {
        let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
        let ctx =
            SessionContext::new_with_config(SessionConfig::new().with_target_partitions(parallel));
        let schema = &table.schema;
        let column = |i: usize| schema.columns()[i].name.clone();
        let keys: Vec<String> = schema.key_columns().iter().map(|&i| column(i)).collect();
        let all: Vec<String> = (0..schema.columns().len()).map(column).collect();
        let mut parts: Vec<DataFrame> = Vec::new();
        // The keys the backups newer than the one being read hold, as `__key_<i>`.
        let mut newer: Option<DataFrame> = None;
        for (level, (dir, manifest)) in chain.iter().enumerate().rev() {
            let files = &manifest.table(&table.name).expect("checked").files;
            if files.is_empty() {
                continue; // an incremental backup of a table where nothing changed
            }
            let paths: Vec<String> = files
                .iter()
                .map(|f| path_text(&dir.join(&f.path)))
                .collect();
            let rows = (ctx
                .read_parquet(paths, ParquetReadOptions::default())
                .await?)
                .alias(&format!("backup_{level}"))?;
            let incremental = manifest.parent.is_some();
            let mut live = rows.clone();
            if incremental {
                live = live.filter(ident(CHANGE_COLUMN).not_eq(lit("delete")))?;
            }
            if let Some(newer) = &newer {
                let on = keys
                    .iter()
                    .enumerate()
                    .map(|(i, k)| ident(k).eq(ident(format!("__key_{i}"))));
                live = live.join_on(newer.clone(), JoinType::LeftAnti, on)?;
            }
            parts.push(live.select(all.iter().map(ident))?);
            if incremental {
                let keys_here = rows.select(
                    keys.iter()
                        .enumerate()
                        .map(|(i, k)| ident(k).alias(format!("__key_{i}"))),
                )?;
                newer = Some(match newer {
                    Some(newer) => newer.union(keys_here)?,
                    None => keys_here,
                });
            }
        }
        let mut parts = parts.into_iter();
        let mut rows = parts.next().expect("a chain holds a full backup");
        for part in parts {
            rows = rows.union(part)?;
        }
        // A queue's rows go in the order of their positions, which the new table assigns again.
        if let Some(position) = schema.position_column() {
            rows = rows.sort(vec![ident(column(position)).sort(true, true)])?;
        }
        // The columns the database assigns (positions, auto_incrementing_id) are left out.
        let assigned = [schema.position_column(), schema.auto_increment_column()];
        let loaded: Vec<String> = (0..all.len())
            .filter(|i| !assigned.contains(&Some(*i)))
            .map(column)
            .collect();
        let rows = rows.select(loaded.iter().map(ident))?;
        let target = IngestTarget {
            table: name.to_string(),
            mode: IngestMode::Append,
            primary_key: Vec::new(),
            buckets: 1,
        };
        let loads = rows
            .execute_stream_partitioned()
            .await?
            .into_iter()
            .map(|stream| {
                let schema = stream.schema();
                let declared = schema.clone();
                let batches = stream.map_err(SqlError::from).and_then(move |batch| {
                    // A union's batches keep their own input's NULL-ability; the load checks
                    // them against the stream's.
                    let batch = RecordBatch::try_new(declared.clone(), batch.columns().to_vec());
                    async move {
                        match progress.is_closed() {
                            true => Err(stopped()),
                            false => Ok(batch?),
                        }
                    }
                });
                self.ingest(&target, schema, batches)
            });
        Ok(futures::future::try_join_all(loads)
            .await?
            .into_iter()
            .sum())
    }
}

/// A path as DataFusion's file listing takes it.
fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
