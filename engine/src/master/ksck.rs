//! The cluster check of `nyala admin ksck` (Kudu's ksck), from what a master knows: every
//! tablet must have a leader, a majority of its voters on live servers, and replicas that agree
//! on its membership (with each other and with the catalog's placement). A tablet short of some
//! replicas but with a majority is healthy, with a warning.
//!
//! ```no_run
//! # use nyala_engine::client::AdminClient;
//! # use nyala_engine::master::ksck;
//! # async fn sketch(admin: AdminClient) -> nyala_engine::Result<()> {
//! let report = ksck::check(&admin.list_servers().await?, &admin.list_tablets("").await?);
//! print!("{report}");
//! std::process::exit(if report.healthy() { 0 } else { 1 });
//! # }
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use crate::rpc::proto::master::{ListServersResponse, ListTabletsResponse, TabletReplicas};

/// What the check found.
#[derive(Debug, Default)]
pub struct KsckReport {
    pub servers: usize,
    pub live_servers: usize,
    pub tables: usize,
    pub tablets: usize,
    /// What makes the cluster unhealthy, one line each.
    pub problems: Vec<String>,
    /// What does not (yet): replicas down while a majority is up, dead servers.
    pub warnings: Vec<String>,
}

impl KsckReport {
    pub fn healthy(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for KsckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} of {} tablet servers live; {} tables, {} tablets checked",
            self.live_servers, self.servers, self.tables, self.tablets
        )?;
        for warning in &self.warnings {
            writeln!(f, "WARNING: {warning}")?;
        }
        for problem in &self.problems {
            writeln!(f, "ERROR: {problem}")?;
        }
        match self.problems.len() {
            0 => writeln!(
                f,
                "OK: every tablet has a leader and a majority of live replicas"
            ),
            n => writeln!(f, "UNHEALTHY: {n} problem(s)"),
        }
    }
}

/// Checks the tablets of `tables` against the servers of `servers` (see the module comment).
pub fn check(servers: &ListServersResponse, tables: &ListTabletsResponse) -> KsckReport {
    let addresses: HashMap<u64, &str> = servers
        .servers
        .iter()
        .map(|s| (s.server_id, s.address.as_str()))
        .collect();
    let mut report = KsckReport {
        servers: servers.servers.len(),
        live_servers: servers.servers.iter().filter(|s| s.live).count(),
        tables: tables.tables.len(),
        ..KsckReport::default()
    };
    for server in servers.servers.iter().filter(|s| !s.live) {
        report.warnings.push(format!(
            "tablet server {} ({}) is not live: last heard from {:.1} s ago",
            server.server_id,
            server.address,
            server.silent_ms as f64 / 1000.0
        ));
    }
    let name = |id: u64| match addresses.get(&id) {
        Some(address) => format!("{id} ({address})"),
        None => format!("{id} (never reported)"),
    };
    for table in &tables.tables {
        for tablet in &table.tablets {
            report.tablets += 1;
            let subject = format!("tablet {} of table {}", tablet.tablet_id, table.name);
            check_tablet(tablet, &name, &subject, &mut report);
        }
    }
    report
}

fn check_tablet(
    tablet: &TabletReplicas,
    name: &impl Fn(u64) -> String,
    subject: &str,
    report: &mut KsckReport,
) {
    // Replicas on live servers that report the tablet, with the voters each knows.
    let live: Vec<(u64, BTreeSet<u64>, u64)> = tablet
        .replicas
        .iter()
        .filter(|r| r.live)
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            Some((
                r.server_id,
                status.voters.iter().copied().collect(),
                status.leader,
            ))
        })
        .collect();
    let placement: BTreeSet<u64> = tablet.placement.iter().copied().collect();
    // The members: as the one leader knows them, else as the catalog placed them.
    let mut claims = live.iter().filter(|(id, _, leader)| leader == id);
    let members = match (claims.next(), claims.next()) {
        (Some((_, voters, _)), None) => voters.clone(),
        _ => placement.clone(),
    };
    // A replica of neither is left from a move or a re-replication, to be deleted: it may
    // never have learnt that it was removed, so its view does not count.
    let (live, stale): (Vec<_>, Vec<_>) = live
        .into_iter()
        .partition(|(id, _, _)| members.contains(id) || placement.contains(id));
    for (id, _, _) in &stale {
        report.warnings.push(format!(
            "{subject}: server {} holds a replica that is no longer a member",
            name(*id)
        ));
    }
    let leaders: Vec<&(u64, BTreeSet<u64>, u64)> =
        live.iter().filter(|(id, _, leader)| leader == id).collect();
    let list = |ids: &mut dyn Iterator<Item = u64>| ids.map(name).collect::<Vec<_>>().join(", ");
    match leaders.len() {
        0 => report.problems.push(format!(
            "{subject} has no leader (replicas on {})",
            list(&mut tablet.replicas.iter().map(|r| r.server_id))
        )),
        1 => {}
        _ => report.problems.push(format!(
            "{subject} has {} replicas that claim to lead it: {}",
            leaders.len(),
            list(&mut leaders.iter().map(|(id, _, _)| *id))
        )),
    }
    let up = members
        .iter()
        .filter(|m| live.iter().any(|(id, _, _)| id == *m))
        .count();
    let down: Vec<u64> = members
        .iter()
        .copied()
        .filter(|m| !live.iter().any(|(id, _, _)| id == m))
        .collect();
    if up * 2 <= members.len() {
        report.problems.push(format!(
            "{subject} has {up} of {} replicas live, no majority (down: {})",
            members.len(),
            list(&mut down.iter().copied())
        ));
    } else if !down.is_empty() {
        report.warnings.push(format!(
            "{subject} has {up} of {} replicas live (down: {})",
            members.len(),
            list(&mut down.iter().copied())
        ));
    }
    let views: BTreeSet<&BTreeSet<u64>> = live.iter().map(|(_, voters, _)| voters).collect();
    if views.len() > 1 {
        let each = live
            .iter()
            .map(|(id, voters, _)| format!("server {id} sees {voters:?}"))
            .collect::<Vec<_>>()
            .join("; ");
        report.problems.push(format!(
            "{subject}: replicas disagree on its members: {each}"
        ));
    } else if !placement.is_empty() && members != placement {
        report.problems.push(format!(
            "{subject}: the catalog places it on {placement:?} but its group is {members:?}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::proto::common::ReplicaStatus;
    use crate::rpc::proto::master::{ReplicaReport, ServerInfo, TableTablets};

    fn servers(live: &[bool]) -> ListServersResponse {
        ListServersResponse {
            servers: live
                .iter()
                .enumerate()
                .map(|(i, &live)| ServerInfo {
                    server_id: i as u64 + 1,
                    address: format!("127.0.0.1:{}", 7050 + i),
                    live,
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// One tablet on servers 1-3 led by 1, as the servers in `live` report it.
    fn tablets(live: &[bool], voters: impl Fn(u64) -> Vec<u64>) -> ListTabletsResponse {
        let replicas = (1..=3)
            .map(|id| ReplicaReport {
                server_id: id,
                live: live[id as usize - 1],
                status: Some(ReplicaStatus {
                    tablet_id: "t-0".into(),
                    leader: 1,
                    voters: voters(id),
                    ..Default::default()
                }),
            })
            .collect();
        ListTabletsResponse {
            tables: vec![TableTablets {
                name: "events".into(),
                id: "t".into(),
                tablets: vec![TabletReplicas {
                    tablet_id: "t-0".into(),
                    placement: vec![1, 2, 3],
                    replicas,
                }],
            }],
        }
    }

    #[test]
    fn a_cluster_with_every_replica_live_is_healthy() {
        let live = [true, true, true];
        let report = check(&servers(&live), &tablets(&live, |_| vec![1, 2, 3]));
        assert!(report.healthy(), "{report}");
        assert!(report.warnings.is_empty(), "{report}");
        assert!(report.to_string().contains("OK"), "{report}");
    }

    #[test]
    fn one_replica_down_is_a_warning() {
        let live = [true, true, false];
        let report = check(&servers(&live), &tablets(&live, |_| vec![1, 2, 3]));
        assert!(report.healthy(), "{report}");
        assert!(
            report.to_string().contains("2 of 3 replicas live"),
            "{report}"
        );
    }

    #[test]
    fn two_replicas_down_lose_the_majority() {
        let live = [true, false, false];
        let report = check(&servers(&live), &tablets(&live, |_| vec![1, 2, 3]));
        assert!(!report.healthy());
        assert!(report.to_string().contains("no majority"), "{report}");
    }

    #[test]
    fn no_live_leader_is_a_problem() {
        let live = [false, true, true];
        let report = check(&servers(&live), &tablets(&live, |_| vec![1, 2, 3]));
        assert!(report.to_string().contains("has no leader"), "{report}");
    }

    #[test]
    fn a_replica_left_from_a_move_is_a_warning() {
        let live = [true, true, true, true];
        let mut tablets = tablets(&live, |_| vec![1, 2, 3]);
        // Server 4 held the tablet before it moved to 3, and never learnt of its removal.
        tablets.tables[0].tablets[0].replicas.push(ReplicaReport {
            server_id: 4,
            live: true,
            status: Some(ReplicaStatus {
                tablet_id: "t-0".into(),
                leader: 1,
                voters: vec![1, 2, 4],
                ..Default::default()
            }),
        });
        let report = check(&servers(&live), &tablets);
        assert!(report.healthy(), "{report}");
        assert!(
            report.to_string().contains("no longer a member"),
            "{report}"
        );
    }

    #[test]
    fn replicas_that_disagree_on_members_are_a_problem() {
        let live = [true, true, true];
        let voters = |id| if id == 3 { vec![1, 2] } else { vec![1, 2, 3] };
        let report = check(&servers(&live), &tablets(&live, voters));
        assert!(report.to_string().contains("disagree"), "{report}");
    }
}
