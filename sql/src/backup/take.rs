//! Taking a backup: every tablet of the tables read at one snapshot (or, for an incremental
//! backup, diff-scanned from its parent's) into a Parquet file of its own, then the manifest.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use futures::{StreamExt, TryStreamExt};
use nyala_engine::{Client, TableHandle};
use nyala_storage::{change_fields, ScanSpec, Timestamp};
use tokio::sync::mpsc::Sender;

use crate::backup::manifest::{
    io_error, sync_dir, BackupFile, Checksummed, Manifest, Parent, TableBackup, ViewBackup,
    MANIFEST,
};
use crate::backup::{blocking, stopped, Progress};
use crate::parse::statement::BackupSpec;
use crate::{Result, SqlError};

/// Rows a backup's scans read at a time.
const SCAN_BATCH_ROWS: usize = 8192;

/// One file to write: tablet `tablet` of `table`.
struct FileJob {
    table: TableHandle,
    /// The table's place in the backup.
    index: usize,
    tablet: usize,
    /// Relative to the backup's directory.
    path: String,
}

/// Takes the backup `spec` asks for, reporting each file written (and last the manifest) to
/// `progress`; stops, leaving no manifest, once `progress` is closed (the statement's client
/// went away or cancelled it).
pub(crate) async fn take(client: Client, spec: BackupSpec, progress: Progress) -> Result<()> {
    let dir = PathBuf::from(&spec.path);
    let tables: Vec<TableHandle> = match &spec.tables {
        None => client.tables(),
        Some(names) => names
            .iter()
            .map(|name| client.table(name).map_err(SqlError::from))
            .collect::<Result<_>>()?,
    };
    for (i, table) in tables.iter().enumerate() {
        if tables[..i].iter().any(|t| t.name == table.name) {
            return Err(SqlError::Invalid(format!(
                "table '{}' is named twice",
                table.name
            )));
        }
    }
    let views = match spec.tables {
        None => (client.views().iter())
            .map(|v| ViewBackup {
                name: v.name.clone(),
                sql: v.sql.clone(),
            })
            .collect(),
        Some(_) => Vec::new(),
    };
    let parent = spec.parent.clone();
    let (prepared, dir_) = (tables.clone(), dir.clone());
    let parent = blocking(move || {
        let parent = match parent {
            Some(parent) => Some(parent_of(Path::new(&parent), &prepared)?),
            None => None,
        };
        prepare_dir(&dir_)?;
        Ok(parent)
    })
    .await?;
    // One snapshot for every table: the newest of theirs, at which each reads every write
    // acknowledged before the statement.
    let mut snapshot = Timestamp(0);
    for table in &tables {
        snapshot = snapshot.max(client.safe_snapshot(table).await?);
    }
    if let Some(parent) = &parent {
        // A diff scan reads to the end of its snapshot's microsecond; the next incremental
        // backup starts there.
        snapshot = snapshot.end_of_microsecond().max(parent.snapshot);
    }
    let mut manifest = Manifest::new(snapshot, parent);
    manifest.views = views;
    let mut jobs = Vec::new();
    let mut folders = Vec::new();
    for (i, table) in tables.iter().enumerate() {
        let folder = folder_name(&table.name, i);
        manifest.tables.push(TableBackup {
            name: table.name.clone(),
            id: table.id.clone(),
            schema: table.schema.clone(),
            partition: table.partition.clone(),
            replicas: table.replicas,
            files: Vec::new(),
        });
        for tablet in 0..table.tablets.len() {
            jobs.push(FileJob {
                table: table.clone(),
                index: i,
                tablet,
                path: format!("{folder}/{tablet:05}.parquet"),
            });
        }
        folders.push(dir.join(folder));
    }
    let created = folders.clone();
    blocking(move || {
        created
            .iter()
            .try_for_each(|f| std::fs::create_dir_all(f).map_err(|e| io_error(f, "create", e)))
    })
    .await?;
    let steps = jobs.len() as u64 + 1;
    let since = manifest.parent.as_ref().map(|p| p.snapshot);
    let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut written = futures::stream::iter(jobs.into_iter().map(|job| {
        let (client, dir, sender) = (client.clone(), dir.clone(), progress.sender());
        blocking(move || {
            let file = write_file(&client, &job, &dir, snapshot, since, &sender)?;
            Ok((job, file))
        })
    }))
    .buffer_unordered(parallel);
    let mut step = 0;
    let (mut rows, mut bytes) = (0, 0);
    while let Some((job, file)) = written.try_next().await? {
        step += 1;
        let table = Some(job.table.name.as_str());
        let Some(file) = file else {
            progress.file(step, steps, table, 0, 0, None).await?;
            continue;
        };
        rows += file.rows;
        bytes += file.bytes;
        let path = dir.join(&file.path);
        let (file_rows, file_bytes) = (file.rows, file.bytes);
        progress
            .file(step, steps, table, file_rows, file_bytes, Some(&path))
            .await?;
        manifest.tables[job.index].files.push(file);
    }
    for table in &mut manifest.tables {
        table.files.sort_by(|a, b| a.path.cmp(&b.path));
    }
    drop(written);
    let path = blocking(move || {
        folders.iter().try_for_each(|folder| sync_dir(folder))?;
        sync_dir(&dir)?;
        manifest.write(&dir)
    })
    .await?;
    progress
        .file(steps, steps, None, rows, bytes, Some(&path))
        .await
}

/// An incremental backup's parent: its snapshot, after checking that it holds each of
/// `tables` as they are now (the same table, columns and partitions).
fn parent_of(parent: &Path, tables: &[TableHandle]) -> Result<Parent> {
    let manifest = Manifest::read(parent)?;
    let path = parent
        .canonicalize()
        .map_err(|e| io_error(parent, "find", e))?;
    for table in tables {
        let full_backup = "take a full backup of it";
        let Some(before) = manifest.table(&table.name).filter(|t| t.id == table.id) else {
            return Err(SqlError::Invalid(format!(
                "table '{}' is not in the parent backup {}; {full_backup}",
                table.name,
                parent.display()
            )));
        };
        if !before.schema.same_columns(&table.schema) || before.partition != table.partition {
            return Err(SqlError::Invalid(format!(
                "table '{}' changed its columns or partitions since the parent backup {}; \
                 {full_backup}",
                table.name,
                parent.display()
            )));
        }
    }
    Ok(Parent {
        path,
        snapshot: manifest.snapshot,
    })
}

/// Creates the backup's directory, refusing one that already holds a complete backup.
fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.as_os_str().is_empty() {
        return Err(SqlError::Invalid("a backup needs a directory".into()));
    }
    if dir.join(MANIFEST).exists() {
        return Err(SqlError::Invalid(format!(
            "{} already holds a backup; choose another directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "create", e))
}

/// The folder of table number `i` (`name` when it is a plain file name, else `table-<i>`).
fn folder_name(name: &str, i: usize) -> String {
    let plain = !name.is_empty()
        && name.len() <= 100
        && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    match plain {
        true => name.to_string(),
        false => format!("table-{i}"),
    }
}

/// Writes one tablet's rows (or changes since `since`) at `snapshot` into its Parquet file,
/// durably (None: changes were asked for and there were none); stops when `progress` has no
/// receiver any more.
fn write_file(
    client: &Client,
    job: &FileJob,
    dir: &Path,
    snapshot: Timestamp,
    since: Option<Timestamp>,
    progress: &Sender<Result<RecordBatch>>,
) -> Result<Option<BackupFile>> {
    let table = &job.table.schema;
    let mut fields: Vec<_> = table.arrow_schema().fields().to_vec();
    if since.is_some() {
        // A key inserted and deleted in the window has only its key columns set.
        for (i, field) in fields.iter_mut().enumerate() {
            if !table.key_columns().contains(&i) {
                *field = Arc::new(field.as_ref().clone().with_nullable(true));
            }
        }
        fields.extend(change_fields().map(Arc::new));
    }
    let schema: SchemaRef = Arc::new(ArrowSchema::new(fields));
    let spec = ScanSpec {
        projection: None,
        predicates: Vec::new(),
        snapshot,
        limit: None,
        batch_size: SCAN_BATCH_ROWS,
        string_views: false,
        changes_since: since,
    };
    let path = dir.join(&job.path);
    let parquet = |e: datafusion::parquet::errors::ParquetError| {
        SqlError::Invalid(format!("cannot write {}: {e}", path.display()))
    };
    // The file is made once there is a row for it; a full backup's empty tablet gets one too.
    let create = || {
        let file = File::create(&path).map_err(|e| io_error(&path, "create", e))?;
        let out = Checksummed {
            inner: BufWriter::with_capacity(1 << 20, file),
            bytes: 0,
            crc: crc32fast::Hasher::new(),
        };
        let properties = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .build();
        ArrowWriter::try_new(out, schema.clone(), Some(properties)).map_err(parquet)
    };
    let mut writer = None;
    let mut rows = 0;
    for batch in client.scan_tablet(&job.table, job.tablet, spec, Some(snapshot))? {
        if progress.is_closed() {
            return Err(stopped());
        }
        let batch = batch.map_err(nyala_engine::EngineError::from)?;
        if batch.num_rows() == 0 {
            continue;
        }
        let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())?;
        rows += batch.num_rows() as u64;
        let writer = match &mut writer {
            Some(writer) => writer,
            None => writer.insert(create()?),
        };
        writer.write(&batch).map_err(parquet)?;
    }
    let writer = match writer {
        Some(writer) => writer,
        // An incremental backup has no file for a tablet where nothing changed.
        None if since.is_some() => return Ok(None),
        None => create()?,
    };
    let mut out = writer.into_inner().map_err(parquet)?;
    out.inner
        .flush()
        .and_then(|()| out.inner.get_ref().sync_all())
        .map_err(|e| io_error(&path, "write", e))?;
    Ok(Some(BackupFile {
        path: job.path.clone(),
        rows,
        bytes: out.bytes,
        crc32: out.crc.finalize(),
    }))
}
