//! `nyala admin`: the operators' commands (Kudu's `kudu cluster ksck`, `kudu table list`, ...),
//! talking to the masters' internal RPC through [`AdminClient`]. Output is plain text for
//! people; `ksck` answers through its exit code too.

use std::io::Write;

use nyala_engine::client::AdminClient;
use nyala_engine::master::ksck;
use nyala_engine::rpc::proto::master::TabletReplicas;

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
}

/// Runs an admin command, writing its report to `out`; false when `ksck` found the cluster
/// unhealthy.
pub async fn run(args: AdminArgs, out: &mut impl Write) -> anyhow::Result<bool> {
    let admin = AdminClient::new(args.masters);
    match args.command {
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
