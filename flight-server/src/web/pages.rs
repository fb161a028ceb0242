//! The web UI's pages, rendered on the server with `maud` (which escapes every value it
//! interpolates, so table names, statement texts and error messages cannot inject markup).
//! Each page shows what this process has (see [`WebState`]) and says so when it has nothing.

use std::time::{Duration, SystemTime};

use maud::{html, Markup, DOCTYPE};
use nyala_engine::rpc::proto::master::TabletReplicas;
use nyala_engine::tserver::replica::TabletReplica;

use super::WebState;

/// Why a page cannot be shown.
#[derive(Debug)]
pub enum PageError {
    /// What was asked for does not exist (a table, say).
    NotFound(String),
}

/// Most maintenance candidates the maintenance page lists.
const MAX_CANDIDATES: usize = 50;

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
    nav a{margin-right:1em}table{border-collapse:collapse;margin:.5em 0 1.5em}\
    th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
    th{background:#f0f0f0}td.n{text-align:right}code{white-space:pre-wrap}\
    .bad{color:#b00}.good{color:#070}";

/// A page with the navigation of this process's pages.
fn layout(state: &WebState, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { "Nyala " (state.role) ": " (title) }
                style { (STYLE) }
            }
            body {
                nav {
                    a href="/" { "Tables" }
                    @if state.tablet_server.is_some() { a href="/maintenance" { "Maintenance" } }
                    @if state.activity.is_some() { a href="/statements" { "Statements" } }
                    @if state.master.is_some() { a href="/cluster" { "Cluster" } }
                    a href="/metrics" { "Metrics" }
                }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// The page of something that does not exist.
pub fn not_found(what: &str) -> Markup {
    html! {
        (DOCTYPE)
        html { head { title { "Not found" } } body { h1 { "Not found" } p { (what) " does not exist." } } }
    }
}

/// `bytes` in binary units.
fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

fn seconds(duration: Duration) -> String {
    format!("{:.3} s", duration.as_secs_f64())
}

/// How long ago `at` was.
fn ago(at: SystemTime) -> String {
    let since = SystemTime::now().duration_since(at).unwrap_or_default();
    format!("{:.1} s ago", since.as_secs_f64())
}

/// `name` as one segment of a URL path (percent-encoded but for unreserved characters).
fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The front page: the tables and their tablets, or on a tablet server without SQL its
/// replicas.
pub fn home(state: &WebState) -> Result<Markup, PageError> {
    let body = match (&state.db, &state.tablet_server) {
        (Some(db), _) => tables(db),
        (None, Some(server)) => replicas(&server.replicas()),
        (None, None) => html! { p { "This process holds no tables." } },
    };
    Ok(layout(state, "Tables", body))
}

fn tables(db: &nyala_sql::Database) -> Markup {
    let client = db.client();
    let tables = client.tables();
    html! {
        @if tables.is_empty() { p { "No tables yet." } }
        @for table in &tables {
            @let stats = client.tablet_stats(table);
            h2 { a href={ "/tables/" (path_segment(&table.name)) } { (table.name) } }
            @match stats {
                Ok(stats) => {
                    p {
                        (stats.len()) " tablets, about "
                        (stats.iter().map(|s| s.estimated_rows).sum::<usize>()) " rows, "
                        (bytes(stats.iter().map(|s| s.disk_bytes).sum())) " on disk, "
                        (bytes(stats.iter().map(|s| s.memory_bytes as u64).sum())) " in memory"
                    }
                    table {
                        tr { th { "tablet" } th { "leader" } th { "rows" } th { "on disk" } th { "in memory" } }
                        @for s in &stats {
                            tr {
                                td { code { (s.id) } }
                                td { (s.leader) }
                                td.n { (s.estimated_rows) }
                                td.n { (bytes(s.disk_bytes)) }
                                td.n { (bytes(s.memory_bytes as u64)) }
                            }
                        }
                    }
                }
                Err(e) => { p.bad { "Cannot read its tablets: " (e) } }
            }
        }
    }
}

/// The replicas of this process's tablet server.
fn replicas(replicas: &[std::sync::Arc<TabletReplica>]) -> Markup {
    let mut replicas = replicas.to_vec();
    replicas.sort_by(|a, b| a.id().cmp(b.id()));
    html! {
        h2 { "Replicas on this tablet server" }
        @if replicas.is_empty() { p { "No replicas yet." } }
        @else {
            table {
                tr {
                    th { "tablet" } th { "role" } th { "term" } th { "commit index" }
                    th { "applied" } th { "rowsets" } th { "delta files" } th { "in memory" } th { "on disk" }
                }
                @for r in &replicas {
                    @let group = r.group_state();
                    @let tablet = r.tablet();
                    tr {
                        td { code { (r.id()) } }
                        td { @if group.leader == r.node_id() { "leader" } @else { "follower of " (group.leader) } }
                        td.n { (group.term) }
                        td.n { (group.commit) }
                        td.n { (r.last_applied()) }
                        td.n { (tablet.rowset_count()) }
                        td.n { (tablet.delta_file_count()) }
                        td.n { (bytes(tablet.memory_bytes() as u64)) }
                        td.n { (bytes(tablet.disk_bytes())) }
                    }
                }
            }
        }
    }
}

/// One table's tablets: leader, replicas, rowsets, memory, delta files.
pub fn table(state: &WebState, name: &str) -> Result<Markup, PageError> {
    let not_found = || PageError::NotFound(format!("table {name}"));
    let db = state.db.as_ref().ok_or_else(not_found)?;
    let client = db.client();
    let table = client.table(name).map_err(|_| not_found())?;
    let stats = client.tablet_stats(&table);
    // On a master: where each replica is, and what it reported.
    let placed: Vec<TabletReplicas> = state
        .master
        .as_ref()
        .and_then(|(master, registry)| master.list_tablets(registry, name).ok())
        .map(|list| list.tables.into_iter().flat_map(|t| t.tablets).collect())
        .unwrap_or_default();
    let body = html! {
        p { "Table id " code { (table.id) } ", " (table.tablets.len()) " tablets." }
        @match stats {
            Ok(stats) => {
                table {
                    tr {
                        th { "#" } th { "tablet" } th { "leader" } th { "replicas" }
                        th { "rowsets" } th { "delta files" } th { "column files" } th { "in memory" }
                        th { "on disk" } th { "rows" } th { "compactions" }
                    }
                    @for (i, s) in stats.iter().enumerate() {
                        tr {
                            td.n { (i) }
                            td { code { (s.id) } }
                            td { (s.leader) }
                            td {
                                (s.replicas)
                                @if let Some(tablet) = placed.iter().find(|t| t.tablet_id == s.id) {
                                    ": "
                                    @for (j, r) in tablet.replicas.iter().enumerate() {
                                        @if j > 0 { ", " }
                                        "server " (r.server_id)
                                        @if r.status.as_ref().is_some_and(|st| st.leader == r.server_id) { " (leader)" }
                                        @if !r.live { span.bad { " (not live)" } }
                                    }
                                }
                            }
                            td.n { (s.rowsets) }
                            td.n { (s.delta_files) }
                            td.n { (s.column_files) }
                            td.n { (bytes(s.memory_bytes as u64)) }
                            td.n { (bytes(s.disk_bytes)) }
                            td.n { (s.estimated_rows) }
                            td.n { (s.compactions) }
                        }
                    }
                }
            }
            Err(e) => { p.bad { "Cannot read its tablets: " (e) } }
        }
    };
    Ok(layout(state, &format!("Table {name}"), body))
}

/// The maintenance manager: the operation running, the candidates with their scores, the
/// operations done.
pub fn maintenance(state: &WebState) -> Result<Markup, PageError> {
    let Some(server) = &state.tablet_server else {
        let body = html! { p { "No tablet server runs in this process." } };
        return Ok(layout(state, "Maintenance", body));
    };
    let log = server.maintenance_log();
    let mut candidates = server.maintenance_candidates();
    candidates.sort_by(|a, b| b.score.total_cmp(&a.score));
    candidates.truncate(MAX_CANDIDATES);
    let body = html! {
        p {
            "Unflushed data: " (bytes(server.memory_bytes() as u64)) " of a limit of "
            (bytes(server.memory_limit() as u64)) ". Operations scoring 1 or more run, the best first."
        }
        h2 { "Running" }
        @match log.running() {
            Some(op) => {
                p { (op.operation) " of tablet " code { (op.tablet) } ", score " (format!("{:.2}", op.score))
                    ", started " (ago(op.started)) }
            }
            None => { p { "Nothing runs now." } }
        }
        h2 { "Candidates" }
        table {
            tr { th { "tablet" } th { "operation" } th { "score" } }
            @for c in &candidates {
                tr {
                    td { code { (c.replica.id()) } }
                    td { @match &c.kind { Some(kind) => { (format!("{kind:?}")) } None => { "flush" } } }
                    td.n { (format!("{:.2}", c.score)) }
                }
            }
        }
        h2 { "Recent" }
        @let recent = log.recent();
        @if recent.is_empty() { p { "No flush or compaction yet." } }
        @else {
            table {
                tr { th { "started" } th { "tablet" } th { "operation" } th { "score" } th { "duration" } th { "outcome" } }
                @for op in &recent {
                    tr {
                        td { (ago(op.started)) }
                        td { code { (op.tablet) } }
                        td { (op.operation) }
                        td.n {
                            (format!("{:.2}", op.score))
                            @if op.memory_pressure { " (memory pressure)" }
                        }
                        td.n { (op.duration.map(seconds).unwrap_or_default()) }
                        td { @match &op.error { Some(e) => { span.bad { (e) } } None => { "ok" } } }
                    }
                }
            }
        }
    };
    Ok(layout(state, "Maintenance", body))
}

/// Running statements (each with a cancel button) and recent ones.
pub fn statements(state: &WebState) -> Result<Markup, PageError> {
    let Some(activity) = &state.activity else {
        let body = html! { p { "This process serves no SQL." } };
        return Ok(layout(state, "Statements", body));
    };
    let running = activity.running();
    let recent = activity.recent();
    let body = html! {
        h2 { "Running" }
        @if running.is_empty() { p { "No statement runs now." } }
        @else {
            table {
                tr { th { "id" } th { "user" } th { "kind" } th { "running for" } th { "rows" } th { "statement" } th {} }
                @for s in &running {
                    tr {
                        td.n { (s.id) }
                        td { (s.user) }
                        td { (s.kind) }
                        td.n { (seconds(s.elapsed())) }
                        td.n { (s.rows()) }
                        td {
                            code { (s.text) }
                            @if let Some(stages) = s.stages() {
                                details { summary { "distributed: stages" } pre { (stages) } }
                            }
                        }
                        td {
                            @if s.cancelled() { "cancelling" }
                            @else {
                                form method="post" action={ "/statements/" (s.id) "/cancel" } {
                                    button type="submit" { "Cancel" }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Recent" }
        @if recent.is_empty() { p { "No statement has finished yet." } }
        @else {
            table {
                tr { th { "id" } th { "user" } th { "kind" } th { "started" } th { "duration" } th { "rows" } th { "outcome" } th { "statement" } }
                @for s in &recent {
                    tr {
                        td.n { (s.id) }
                        td { (s.user) }
                        td { (s.kind) }
                        td { (ago(s.started_at)) }
                        td.n { (seconds(s.duration)) }
                        td.n { (s.rows) }
                        td { @match &s.error { Some(e) => { span.bad { (e) } } None => { "ok" } } }
                        td { code { (s.text) } }
                    }
                }
            }
        }
    };
    Ok(layout(state, "Statements", body))
}

/// On a master: the tablet servers, whether they are live, and the replicas each holds.
pub fn cluster(state: &WebState) -> Result<Markup, PageError> {
    let Some((master, registry)) = &state.master else {
        let body = html! { p { "This process is no master." } };
        return Ok(layout(state, "Cluster", body));
    };
    let catalog = master.catalog().group_state();
    let leading = catalog.leader == master.catalog().node_id();
    let servers = registry.servers();
    let body = html! {
        p {
            "This master "
            @if leading { "leads the catalog" } @else { "follows master " (catalog.leader) " in the catalog" }
            " (term " (catalog.term) "). " (master.tables().len()) " tables."
        }
        h2 { "Tablet servers" }
        @if servers.is_empty() { p { "No tablet server has reported yet." } }
        @else {
            table {
                tr { th { "server" } th { "address" } th { "state" } th { "last heard" } th { "replicas" } th { "leaders" } }
                @for s in &servers {
                    tr {
                        td.n { (s.id) }
                        td { (s.address) }
                        td { @if s.live { span.good { "live" } } @else { span.bad { "not live" } } }
                        td.n { (format!("{:.1} s ago", s.silent_for.as_secs_f64())) }
                        td.n { (s.replicas) }
                        td.n { (s.leaders) }
                    }
                }
            }
        }
    };
    Ok(layout(state, "Cluster", body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_in_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn names_in_paths_are_percent_encoded() {
        assert_eq!(path_segment("events_2"), "events_2");
        assert_eq!(path_segment("a b/<c>"), "a%20b%2F%3Cc%3E");
    }

    #[test]
    fn interpolated_text_is_escaped() {
        let page = not_found("<script>alert(1)</script>").into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
    }
}
