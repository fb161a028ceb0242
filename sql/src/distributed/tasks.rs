//! Where a distributed scan's work goes: each task of a scan's stage reads the tablets one
//! tablet server leads, and runs on that server (the three event handlers datafusion-distributed
//! asks while it plans and starts a query).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, RouteTasksEvent, RouteTasksEventResponse,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
};
use url::Url;

use crate::exec::scan::{NyalaScanExec, TaskSplit};

/// A scan's stage runs as many tasks as there are servers leading its tablets.
pub(crate) fn desired_task_count(
    event: DesiredTaskCountEvent<'_>,
) -> Option<Result<DesiredTaskCountEventResponse>> {
    let scan = event.plan.downcast_ref::<NyalaScanExec>()?;
    let leaders = by_leader(scan).len();
    Some(Ok(DesiredTaskCountEventResponse::desired(leaders.max(1))))
}

/// The scan split into `task_count` tasks, each reading tablets led by one server.
pub(crate) fn scale_up(
    event: ScaleUpLeafNodeEvent<'_>,
) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let scan = event.plan.downcast_ref::<NyalaScanExec>()?;
    if event.task_count <= 1 {
        return None;
    }
    let split = split(by_leader(scan), event.task_count);
    Some(Ok(ScaleUpLeafNodeEventResponse::new(Arc::new(
        scan.split(split),
    ))))
}

/// Each task of a stage that scans goes to the server leading its tablets (the first split
/// scan of the stage decides; where a leader is unknown, datafusion-distributed's routing).
pub(crate) fn route(event: RouteTasksEvent<'_>) -> Option<Result<RouteTasksEventResponse>> {
    let mut servers = None;
    let _ = event.plan.apply(|node| {
        let split = (node.downcast_ref::<NyalaScanExec>())
            .and_then(NyalaScanExec::task_split)
            .filter(|split| split.servers.len() == event.task_count);
        match split {
            Some(split) => {
                servers = Some(split.servers.clone());
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    });
    let urls: Option<Vec<Url>> = (servers?.iter())
        .map(|server| Url::parse(&format!("http://{server}")).ok())
        .collect();
    urls.map(|urls| Ok(RouteTasksEventResponse::new(urls)))
}

/// The scan's tablets by the address of the server leading each (unknown: "").
fn by_leader(scan: &NyalaScanExec) -> BTreeMap<String, Vec<usize>> {
    let stats = scan.client().tablet_stats(scan.table()).unwrap_or_default();
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &tablet in scan.tablets() {
        let leader = stats
            .get(tablet)
            .map(|s| s.leader.clone())
            .unwrap_or_default();
        groups.entry(leader).or_default().push(tablet);
    }
    groups
}

/// `groups` (tablets by leader) as `tasks` tasks: whole groups where there are more groups
/// than tasks (the largest first, each to the task with fewest tablets, whose server is that
/// of its first group), and the largest groups halved where there are fewer.
fn split(groups: BTreeMap<String, Vec<usize>>, tasks: usize) -> TaskSplit {
    let mut groups: Vec<(String, Vec<usize>)> = groups.into_iter().collect();
    groups.sort_by_key(|(_, tablets)| std::cmp::Reverse(tablets.len()));
    let mut bins: Vec<(String, Vec<usize>)> = Vec::with_capacity(tasks);
    for (server, tablets) in groups {
        if bins.len() < tasks {
            bins.push((server, tablets));
        } else if let Some(bin) = bins.iter_mut().min_by_key(|(_, t)| t.len()) {
            bin.1.extend(tablets);
        }
    }
    while bins.len() < tasks {
        let largest = (0..bins.len()).max_by_key(|&b| bins[b].1.len());
        match largest.filter(|&b| bins[b].1.len() > 1) {
            Some(b) => {
                let half = bins[b].1.len() / 2;
                let rest = bins[b].1.split_off(half);
                bins.push((bins[b].0.clone(), rest));
            }
            None => bins.push((String::new(), Vec::new())),
        }
    }
    for (_, tablets) in &mut bins {
        tablets.sort_unstable();
    }
    let (servers, tablets) = bins.into_iter().unzip();
    TaskSplit { tablets, servers }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(list: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
        (list.iter())
            .map(|(s, t)| (s.to_string(), t.to_vec()))
            .collect()
    }

    #[test]
    fn one_task_per_leading_server() {
        let split = split(groups(&[("a", &[0, 3]), ("b", &[1]), ("c", &[2, 4, 5])]), 3);
        assert_eq!(split.servers, ["c", "a", "b"]);
        assert_eq!(split.tablets, [vec![2, 4, 5], vec![0, 3], vec![1]]);
    }

    #[test]
    fn fewer_tasks_than_servers_take_whole_groups() {
        let split = split(groups(&[("a", &[0, 3]), ("b", &[1]), ("c", &[2, 4, 5])]), 2);
        assert_eq!(split.servers, ["c", "a"]);
        assert_eq!(split.tablets, [vec![2, 4, 5], vec![0, 1, 3]]);
    }

    #[test]
    fn more_tasks_than_servers_halve_the_largest_groups() {
        let split = split(groups(&[("a", &[0, 1, 2, 3])]), 3);
        assert_eq!(split.servers, ["a", "a", "a"]);
        assert_eq!(split.tablets, [vec![0, 1], vec![2], vec![3]]);
        let split = super::split(groups(&[("a", &[7])]), 2);
        assert_eq!(split.tablets, [vec![7], vec![]]);
    }
}
