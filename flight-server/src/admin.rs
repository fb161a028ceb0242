//! `nyala admin`: the operators' commands (Kudu's `kudu cluster ksck`, `kudu table list`, ...),
//! talking to the masters' internal RPC through [`AdminClient`]; `backup` and `restore` run
//! SQL's BACKUP and RESTORE on a server through Flight SQL, with a progress bar. Output is
//! plain text for people; `ksck` answers through its exit code too.

use std::io::Write;

use nyala_engine::client::AdminClient;
use nyala_engine::master::ksck;
use nyala_engine::rpc::proto::master::TabletReplicas;
use nyala_shell::FlightSqlConnection;

/// `nyala admin`'s arguments.
#[derive(clap::Args)]
pub struct AdminArgs {
    /// The masters' internal RPC addresses (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7051")]
    masters: Vec<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(clap::Subcommand)]
enum AdminCommand {
    /// Checks that every tablet has a leader, a majority of live replicas, and replicas that
    /// agree on its members; exits with 1 otherwise.
    Ksck,
    /// Lists the tables with their tablets, replicas and sizes.
    Tables,
    /// Lists a table's tablets: leader, replicas and what each reported.
    Tablets { table: String },
    /// Moves replicas, one at a time, until the live tablet servers hold about as many each.
    Rebalance {
        /// Stop after this many moves.
        #[arg(long, default_value_t = 1000)]
        max_moves: usize,
    },
    /// Has a tablet's leader hand leadership to another replica.
    LeaderStepDown { tablet: String },
    /// Backs up the database (or some tables) into a directory on the server (SQL's BACKUP).
    Backup {
        /// The directory the backup goes to, on the server.
        dir: String,
        /// Only these tables (comma-separated); without it, every table and view.
        #[arg(long, value_delimiter = ',')]
        tables: Vec<String>,
        /// Take an incremental backup: what changed since the backup in this directory.
        #[arg(long)]
        incremental_from: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Restores a backup's tables and views (or one table) from a directory on the server
    /// (SQL's RESTORE), following its incremental backups back to the full one.
    Restore {
        /// The backup's directory, on the server.
        dir: String,
        /// Only this table.
        #[arg(long)]
        table: Option<String>,
        /// The name to restore --table as.
        #[arg(long = "as", requires = "table")]
        restore_as: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// The server `backup` and `restore` run their statement on.
#[derive(clap::Args)]
struct ServerArgs {
    /// The server's Flight SQL address.
    #[arg(long, default_value = "grpc://127.0.0.1:50051")]
    connect: String,
    /// User to authenticate as (the administrator), with --password.
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// The password for --user.
    #[arg(long, env = "NYALA_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// A CA certificate (PEM) to trust for `--connect grpc+tls://...`.
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
}

/// Runs an admin command, writing its report to `out`; false when `ksck` found the cluster
/// unhealthy.
pub async fn run(args: AdminArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let admin = AdminClient::new(args.masters);
    match args.command {
        AdminCommand::Backup {
            dir,
            tables,
            incremental_from,
            server,
        } => {
            let what = match tables.is_empty() {
                true => "DATABASE".to_string(),
                false => {
                    let names: Vec<String> = tables.iter().map(|t| identifier(t)).collect();
                    format!("TABLE {}", names.join(", "))
                }
            };
            let mut sql = format!("BACKUP {what} TO {}", literal(&dir));
            if let Some(parent) = incremental_from {
                sql.push_str(&format!(" INCREMENTAL FROM {}", literal(&parent)));
            }
            let done = with_progress(&server, &sql, "table_name").await?;
            writeln!(
                out,
                "backup complete: {} rows, {} bytes, {}",
                done.rows, done.bytes, done.last
            )?;
        }
        AdminCommand::Restore {
            dir,
            table,
            restore_as,
            server,
        } => {
            let sql = match table {
                None => format!("RESTORE DATABASE FROM {}", literal(&dir)),
                Some(table) => {
                    let restored_as = restore_as.as_deref().unwrap_or(&table);
                    format!(
                        "RESTORE TABLE {} FROM {} AS {}",
                        identifier(&table),
                        literal(&dir),
                        identifier(restored_as)
                    )
                }
            };
            let done = with_progress(&server, &sql, "name").await?;
            writeln!(
                out,
                "restore complete: {} table(s) and view(s), {} rows",
                done.steps, done.rows
            )?;
        }
        AdminCommand::Ksck => {
            let servers = admin.list_servers().await?;
            let tablets = admin.list_tablets("").await?;
            let report = ksck::check(&servers, &tablets);
            write!(out, "{report}")?;
            return Ok(report.healthy());
        }
        AdminCommand::Tables => {
            let tables = admin.list_tablets("").await?;
            let rows = tables
                .tables
                .iter()
                .map(|t| {
                    let replicas = t.tablets.first().map_or(0, |t| t.placement.len());
                    let leaders = t.tablets.iter().filter_map(leader_status);
                    let (rows, disk) = leaders.fold((0, 0), |(rows, disk), s| {
                        (rows + s.estimated_rows, disk + s.disk_bytes)
                    });
                    vec![
                        t.name.clone(),
                        t.tablets.len().to_string(),
                        replicas.to_string(),
                        rows.to_string(),
                        disk.to_string(),
                    ]
                })
                .collect();
            let header = ["table", "tablets", "replicas", "rows", "disk_bytes"];
            write_columns(out, &header, rows)?;
        }
        AdminCommand::Tablets { table } => {
            let tables = admin.list_tablets(&table).await?;
            let rows = tables
                .tables
                .iter()
                .flat_map(|t| &t.tablets)
                .map(|tablet| {
                    let leader = leader_status(tablet);
                    vec![
                        tablet.tablet_id.clone(),
                        leader.map_or("none".into(), |s| s.leader.to_string()),
                        replica_list(tablet),
                        leader.map_or(0, |s| s.estimated_rows).to_string(),
                        leader.map_or(0, |s| s.disk_bytes).to_string(),
                    ]
                })
                .collect();
            let header = ["tablet", "leader", "replicas", "rows", "disk_bytes"];
            write_columns(out, &header, rows)?;
        }
        AdminCommand::Rebalance { max_moves } => {
            let mut moves = 0;
            while moves < max_moves {
                let Some(moved) = admin.rebalance_once().await? else {
                    break;
                };
                moves += 1;
                writeln!(
                    out,
                    "moved the replica of tablet {} on server {} to server {}",
                    moved.tablet_id, moved.from_server, moved.to_server
                )?;
            }
            writeln!(out, "{moves} replica(s) moved")?;
        }
        AdminCommand::LeaderStepDown { tablet } => {
            let done = admin.leader_step_down(&tablet).await?;
            writeln!(
                out,
                "tablet {tablet}: leadership moved from server {} to server {}",
                done.old_leader, done.new_leader
            )?;
        }
    }
    Ok(true)
}

/// What a BACKUP or RESTORE reported, all steps added up.
#[derive(Default)]
struct Done {
    steps: u64,
    rows: u64,
    bytes: u64,
    /// What the last step was about (a backup's manifest).
    last: String,
}

/// Runs BACKUP or RESTORE `sql` on the server, showing its steps (rows with `step`, `steps`
/// and the name in column `name_column`) in a progress bar.
async fn with_progress(server: &ServerArgs, sql: &str, name_column: &str) -> anyhow::Result<Done> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::UInt64Type;
    let credentials = server.user.as_deref().zip(server.password.as_deref());
    let connection =
        FlightSqlConnection::connect(&server.connect, credentials, server.tls_ca.as_deref())
            .await?;
    let bar = indicatif::ProgressBar::new(0).with_style(indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} {wide_msg}",
    )?);
    let mut done = Done::default();
    let mut each = |batch: arrow::array::RecordBatch| {
        let number = |name: &str| {
            batch
                .column_by_name(name)
                .map(|c| c.as_primitive::<UInt64Type>().clone())
        };
        let (Some(step), Some(steps), Some(rows)) =
            (number("step"), number("steps"), number("rows"))
        else {
            return;
        };
        let bytes = number("bytes");
        let names = batch
            .column_by_name(name_column)
            .map(|c| c.as_string::<i32>().clone());
        let files = batch
            .column_by_name("file")
            .map(|c| c.as_string::<i32>().clone());
        for i in 0..batch.num_rows() {
            bar.set_length(steps.value(i));
            bar.set_position(step.value(i));
            let name = names.as_ref().filter(|n| n.is_valid(i)).map(|n| n.value(i));
            let file = files.as_ref().map(|f| f.value(i));
            done.last = file.or(name).unwrap_or_default().to_string();
            bar.set_message(done.last.clone());
            done.steps += 1;
            let (r, b) = (rows.value(i), bytes.as_ref().map_or(0, |b| b.value(i)));
            match name {
                Some(_) => (done.rows, done.bytes) = (done.rows + r, done.bytes + b),
                // A backup's manifest, last: the whole backup's figures.
                None => (done.rows, done.bytes) = (r, b),
            }
        }
    };
    let result = connection.execute_each(sql, &mut each).await;
    bar.finish_and_clear();
    result?;
    Ok(done)
}

/// `name` as a quoted SQL identifier.
fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// What the live replica that leads `tablet` reported.
fn leader_status(
    tablet: &TabletReplicas,
) -> Option<&nyala_engine::rpc::proto::common::ReplicaStatus> {
    tablet
        .replicas
        .iter()
        .filter(|r| r.live)
        .filter_map(|r| r.status.as_ref().filter(|s| s.leader == r.server_id))
        .next()
}

/// `1 (leader), 2, 3 (not live)`.
fn replica_list(tablet: &TabletReplicas) -> String {
    tablet
        .replicas
        .iter()
        .map(|r| {
            let mut s = r.server_id.to_string();
            if r.status.as_ref().is_some_and(|st| st.leader == r.server_id) && r.live {
                s.push_str(" (leader)");
            }
            if !r.live {
                s.push_str(" (not live)");
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes `rows` under `header`, in columns as wide as their widest cell.
fn write_columns(
    out: &mut impl Write,
    header: &[&str],
    rows: Vec<Vec<String>>,
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in &rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}
