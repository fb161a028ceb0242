//! The `nyala` binary: `serve` runs an embedded single node with Flight SQL; `sql` runs
//! statements against a server (`--connect`) or an embedded database (`--data-dir`); `master`
//! and `tserver` run the processes of a cluster, whose tablets replicate with Raft over internal
//! RPC; `admin` has the operators' commands. Every server also serves its web UI and metrics
//! on `--http-addr`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nyala_flight::activity::Activity;
use nyala_flight::admin::AdminArgs;
use nyala_flight::auth::Credentials;
use nyala_flight::embedded::EmbeddedConnection;
use nyala_flight::web::WebState;
use nyala_flight::{ServerOptions, TlsIdentity};
use nyala_shell::{Connection, FlightSqlConnection, OutputMode};
use nyala_sql::{Database, DatabaseOptions, QueryLimits};
use prometheus_client::registry::Registry;

/// Serving many small statements is allocation-heavy (protobuf, HTTP/2 frames, Arrow buffers);
/// mimalloc's per-thread caches keep that off the path glibc's allocator takes through its
/// shared arenas and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "nyala",
    version,
    about = "Nyala: a Raft-replicated, Arrow-native analytic database"
)]
struct Cli {
    /// A file holding the secret the servers of a cluster share (at least 16 characters, e.g.
    /// `openssl rand -hex 32`): every internal call carries it and internal calls without it
    /// are refused. Give the same file to every master, tablet server and `nyala admin`.
    #[arg(long, global = true, env = "NYALA_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// The administrator a server creates at its first start.
#[derive(clap::Args, Clone)]
struct AdministratorArgs {
    /// The administrator, created at the first start (with --password): from then on clients
    /// must authenticate, as the administrator or a user it creates.
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// The administrator's password (at least 8 characters).
    #[arg(
        long,
        env = "NYALA_PASSWORD",
        hide_env_values = true,
        requires = "user"
    )]
    password: Option<String>,
}

impl AdministratorArgs {
    fn credentials(self) -> Option<Credentials> {
        self.user
            .zip(self.password)
            .map(|(username, password)| Credentials { username, password })
    }
}

/// TLS for the Flight SQL listener: clients connect with `grpc+tls://`; plaintext is refused.
#[derive(clap::Args, Clone)]
struct TlsArgs {
    /// The server's certificate chain (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl TlsArgs {
    fn identity(&self) -> anyhow::Result<Option<TlsIdentity>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(TlsIdentity::read(cert, key)?)),
            _ => Ok(None),
        }
    }

    /// The URI scheme clients reach the listener with.
    fn scheme(&self) -> &'static str {
        match self.tls_cert {
            Some(_) => "grpc+tls",
            None => "grpc+tcp",
        }
    }
}

/// What one statement may use (see `SET statement_timeout` for a session's own timeout).
#[derive(clap::Args, Clone, Copy)]
struct LimitArgs {
    /// Memory (MiB) one query's operators may use; sorts and aggregations spill to disk
    /// beyond it, other operators fail the query.
    #[arg(long, default_value_t = 2048)]
    query_memory_limit_mb: usize,
    /// Memory (MiB) all running queries together may use.
    #[arg(long, default_value_t = 8192)]
    query_memory_budget_mb: usize,
    /// Queries that run at once (an open result stream counts); more wait their turn, at most
    /// 30 s (0: four per core, at least 16).
    #[arg(long, default_value_t = 0)]
    max_running_queries: usize,
    /// Statements running longer are cancelled, unless their session sets its own
    /// statement_timeout (0: no limit).
    #[arg(long, default_value_t = 0)]
    statement_timeout_secs: u64,
}

impl LimitArgs {
    fn limits(self) -> QueryLimits {
        let default = QueryLimits::default();
        QueryLimits {
            query_memory_bytes: self.query_memory_limit_mb << 20,
            server_memory_bytes: self.query_memory_budget_mb << 20,
            max_running_queries: match self.max_running_queries {
                0 => default.max_running_queries,
                n => n,
            },
            statement_timeout: (self.statement_timeout_secs > 0)
                .then(|| std::time::Duration::from_secs(self.statement_timeout_secs)),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run an embedded single node (master + tablet server + Flight SQL) in one process.
    Serve {
        #[arg(long, default_value = "./nyala-data")]
        data_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// Where the web UI and /metrics listen (port 0: any free port; the line printed at
        /// start says which).
        #[arg(long, default_value = "127.0.0.1:8051")]
        http_addr: SocketAddr,
        /// Address clients should use to reach this server (per-tablet endpoints carry it);
        /// defaults to the listen address.
        #[arg(long)]
        advertise: Option<String>,
        /// Where the PostgreSQL protocol listens (psql, psycopg, pgjdbc, psqlODBC; port 0: any
        /// free port; the line printed at start says which).
        #[arg(long, default_value = "127.0.0.1:5433")]
        pg_addr: SocketAddr,
        #[command(flatten)]
        administrator: AdministratorArgs,
        /// Unflushed data (MiB) all tablets together may hold; writers wait above it.
        #[arg(long, default_value_t = 2048)]
        memory_limit_mb: usize,
        /// How far back (seconds) `AS OF` reads may go; older versions are dropped.
        #[arg(long, default_value_t = 900)]
        history_max_age_secs: u64,
        /// A client session (its settings, prepared statements and token) without a request for
        /// this many seconds ends; sessions of a connection also end when it closes.
        #[arg(long, default_value_t = nyala_flight::DEFAULT_SESSION_IDLE_TIMEOUT.as_secs())]
        session_idle_timeout_secs: u64,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Run a tablet server of a cluster: it hosts tablet replicas, replicated with Raft among
    /// tablet servers over internal RPC (tonic).
    Tserver {
        #[arg(long, default_value = "./nyala-tserver")]
        data_dir: PathBuf,
        /// Where the internal RPC listens (port 0: any free port; the line printed at start
        /// says which).
        #[arg(long, default_value = "127.0.0.1:7050")]
        rpc_addr: SocketAddr,
        /// The address the masters and the other servers use to reach this one's internal
        /// RPC (behind NAT or a proxy); defaults to the listen address.
        #[arg(long)]
        rpc_advertise: Option<String>,
        /// Where the web UI and /metrics listen (none unless given; port 0: any free port).
        #[arg(long)]
        http_addr: Option<SocketAddr>,
        /// Unflushed data (MiB) all tablets together may hold; writers wait above it.
        #[arg(long, default_value_t = 2048)]
        memory_limit_mb: usize,
        /// The masters' internal RPC addresses (comma-separated), to send heartbeats to.
        #[arg(long, value_delimiter = ',')]
        masters: Vec<String>,
        /// Also serve Flight SQL here, as a coordinator of the cluster (needs --masters).
        #[arg(long, requires = "masters")]
        flight_addr: Option<SocketAddr>,
        /// Also serve the PostgreSQL protocol here, as a coordinator (with --flight-addr).
        #[arg(long, requires = "flight_addr")]
        pg_addr: Option<SocketAddr>,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Run the master of a cluster: the catalog, placement of tablet replicas on the tablet
    /// servers that send it heartbeats, and Flight SQL for clients.
    Master {
        #[arg(long, default_value = "./nyala-master")]
        data_dir: PathBuf,
        /// Where the internal RPC (heartbeats from tablet servers) listens.
        #[arg(long, default_value = "127.0.0.1:7051")]
        rpc_addr: SocketAddr,
        /// Where Flight SQL listens.
        #[arg(long, default_value = "127.0.0.1:50051")]
        flight_addr: SocketAddr,
        /// Where the PostgreSQL protocol listens, if anywhere.
        #[arg(long)]
        pg_addr: Option<SocketAddr>,
        /// Where the web UI and /metrics listen (none unless given; port 0: any free port).
        #[arg(long)]
        http_addr: Option<SocketAddr>,
        /// Replicas of each tablet when CREATE TABLE does not say (fewer if fewer tablet
        /// servers are alive).
        #[arg(long, default_value_t = 3)]
        default_replicas: usize,
        /// All masters' internal RPC addresses, this one's included (comma-separated, the same
        /// list on every master): the catalog is replicated among them. Empty: one master.
        #[arg(long, value_delimiter = ',')]
        masters: Vec<String>,
        /// A tablet server silent for this long loses its replicas, and so does a replica its
        /// tablet's leader has not heard from for this long: they are re-created on other
        /// servers.
        #[arg(long, default_value_t = 300)]
        follower_unavailable_secs: u64,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        tls: TlsArgs,
        #[command(flatten)]
        administrator: AdministratorArgs,
    },
    /// Operators' commands against a cluster's masters (ksck, tables, rebalance, ...).
    Admin(AdminArgs),
    /// Run SQL: a script with -c/-f, or an interactive shell.
    Sql {
        /// Flight SQL server to talk to, e.g. grpc://127.0.0.1:50051; without it an embedded
        /// database in --data-dir is opened.
        #[arg(long)]
        connect: Option<String>,
        #[arg(long, default_value = "./nyala-data")]
        data_dir: PathBuf,
        /// Statements to run (separated by ';').
        #[arg(short = 'c', conflicts_with = "file")]
        command: Option<String>,
        /// A file of statements to run.
        #[arg(short = 'f')]
        file: Option<PathBuf>,
        /// How results are printed.
        #[arg(long, value_enum, default_value = "table")]
        mode: OutputMode,
        /// User to authenticate as with --connect (with --password).
        #[arg(long, requires = "password")]
        user: Option<String>,
        /// The password for --user.
        #[arg(long, env = "NYALA_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        /// A CA certificate (PEM) to trust for `--connect grpc+tls://...`, besides the
        /// system's.
        #[arg(long)]
        tls_ca: Option<PathBuf>,
    },
}

fn main() {
    // Before any other thread starts (mimalloc's options are not thread safe).
    keep_freed_memory_a_while();
    no_transparent_huge_pages();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(Cli::parse())),
        Err(e) => Err(anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    if let Err(e) = result {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

/// mimalloc's `purge_delay` option (its place in `mi_option_t`, mimalloc.h, in versions 2
/// and 3; the Rust bindings name only some options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long the allocator keeps memory freed before it returns it to the system (mimalloc's
/// default: 10 ms).
const PURGE_DELAY_MS: std::ffi::c_long = 30_000;

/// Keeps freed memory for [`PURGE_DELAY_MS`] before returning it to the system, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise. Under a steady write load the same memory is freed
/// and taken again within seconds (a MemRowSet flushed while the next one fills; batches
/// decoded, copied into log entries and dropped). Returned after 10 ms, each page came back
/// through a page fault that zeroed it: in a profile of bulk enqueue on one node, 17 % of the
/// server's time was `clear_page_erms`, and none with the memory kept. Bulk enqueue then took
/// 8 % less CPU per message and ran 7 % faster (`bench/queue_bench.py --threads 8`, six
/// alternating runs). An idle server still returns the memory within a minute.
fn keep_freed_memory_a_while() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an integer option; no other thread runs yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Turns transparent huge pages off for this process. The allocator returns freed memory to
/// the system and takes it again as writes come and go; with huge pages each time meant a
/// page fault that zeroed 2 MiB, wherever the memory was needed: under a steady enqueue load,
/// 18 % of the Raft threads' time went to `clear_page_erms`. Without them bulk enqueue took
/// 10 % less CPU per message and ran 10 % faster (`bench/queue_bench.py --threads 8`);
/// lookups and queries did not change measurably.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integers and only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(path) = &cli.cluster_secret_file {
        let secret = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the cluster secret {}", path.display()))?;
        nyala_engine::rpc::set_cluster_secret(&secret)?;
    }
    match cli.command {
        Command::Serve {
            data_dir,
            listen,
            http_addr,
            advertise,
            pg_addr,
            administrator,
            memory_limit_mb,
            history_max_age_secs,
            session_idle_timeout_secs,
            limits,
            tls,
        } => {
            let administrator = administrator.credentials();
            let options = DatabaseOptions {
                memory_limit_bytes: Some(memory_limit_mb << 20),
                history_max_age: Some(std::time::Duration::from_secs(history_max_age_secs)),
                limits: limits.limits(),
                ..DatabaseOptions::default()
            };
            let server = ServerOptions {
                tls: tls.identity()?,
                session_idle_timeout: Some(std::time::Duration::from_secs(
                    session_idle_timeout_secs,
                )),
                ..ServerOptions::default()
            };
            let scheme = tls.scheme();
            let addresses = (listen, http_addr, pg_addr);
            serve(
                data_dir,
                addresses,
                (advertise, scheme),
                administrator,
                server,
                options,
            )
            .await
        }
        Command::Tserver {
            data_dir,
            rpc_addr,
            rpc_advertise,
            http_addr,
            memory_limit_mb,
            masters,
            flight_addr,
            pg_addr,
            limits,
            tls,
        } => {
            tserver(
                data_dir,
                (rpc_addr, rpc_advertise, http_addr),
                memory_limit_mb << 20,
                masters,
                flight_addr.map(|addr| ((addr, pg_addr), limits.limits(), tls)),
            )
            .await
        }
        Command::Master {
            data_dir,
            rpc_addr,
            flight_addr,
            pg_addr,
            http_addr,
            default_replicas,
            masters,
            follower_unavailable_secs,
            limits,
            tls,
            administrator,
        } => {
            master(
                data_dir,
                (rpc_addr, (flight_addr, pg_addr), http_addr),
                default_replicas,
                masters,
                std::time::Duration::from_secs(follower_unavailable_secs),
                (limits.limits(), tls, administrator.credentials()),
            )
            .await
        }
        Command::Admin(args) => {
            let healthy = nyala_flight::admin::run(args, &mut std::io::stdout()).await?;
            if !healthy {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Sql {
            connect,
            data_dir,
            command,
            file,
            mode,
            user,
            password,
            tls_ca,
        } => {
            let script = match (command, file) {
                (Some(c), _) => Some(c),
                (None, Some(f)) => Some(
                    std::fs::read_to_string(&f)
                        .with_context(|| format!("cannot read {}", f.display()))?,
                ),
                (None, None) => None,
            };
            match connect {
                Some(url) => {
                    let credentials = user.as_deref().zip(password.as_deref());
                    let conn =
                        FlightSqlConnection::connect(&url, credentials, tls_ca.as_deref()).await?;
                    shell(&conn, script, mode).await
                }
                None => {
                    let db = Database::open(&data_dir, DatabaseOptions::default())
                        .await
                        .with_context(|| {
                            format!("cannot open the database in {}", data_dir.display())
                        })?;
                    let conn = EmbeddedConnection::new(db);
                    let result = shell(&conn, script, mode).await;
                    conn.close().await?;
                    result
                }
            }
        }
    }
}

async fn shell(
    conn: &dyn Connection,
    script: Option<String>,
    mode: OutputMode,
) -> anyhow::Result<()> {
    match script {
        Some(script) => nyala_shell::run_script(conn, &script, mode, &mut std::io::stdout()).await,
        None => nyala_shell::run_interactive(conn, mode).await,
    }
}

async fn master(
    data_dir: PathBuf,
    (rpc_addr, (flight_addr, pg_addr), http_addr): (
        SocketAddr,
        (SocketAddr, Option<SocketAddr>),
        Option<SocketAddr>,
    ),
    default_replicas: usize,
    masters: Vec<String>,
    unavailable: std::time::Duration,
    (limits, tls, administrator): (QueryLimits, TlsArgs, Option<Credentials>),
) -> anyhow::Result<()> {
    use nyala_engine::consensus::RaftRouter;
    use nyala_engine::master::{MasterNode, CATALOG_TABLET};
    use nyala_engine::tserver::replica::{Peers, Replication};
    let rpc = tokio::net::TcpListener::bind(rpc_addr)
        .await
        .with_context(|| format!("cannot listen on {rpc_addr}"))?;
    let rpc_addr = rpc.local_addr()?;
    // Masters are Raft nodes 1, 2, 3, ... in the order of --masters.
    let replication = if masters.is_empty() {
        None
    } else {
        let me = masters
            .iter()
            .position(|m| *m == rpc_addr.to_string())
            .with_context(|| format!("--masters must list this master's --rpc-addr {rpc_addr}"))?;
        let addresses: std::collections::BTreeMap<u64, String> = masters
            .iter()
            .enumerate()
            .map(|(i, m)| (i as u64 + 1, m.clone()))
            .collect();
        let router = RaftRouter::new(tokio::runtime::Handle::current());
        router.learn(&addresses);
        Some(Replication {
            server_id: me as u64 + 1,
            peers: Peers {
                voters: addresses.keys().copied().collect(),
                addresses,
            },
            transport: router.transport(CATALOG_TABLET),
            learn: None,
            // Every master serves the catalog from its own replica.
            followers_serve_reads: true,
        })
    };
    std::fs::create_dir_all(&data_dir)?;
    let runtime = tokio::runtime::Handle::current();
    let dir = data_dir.clone();
    let node = tokio::task::spawn_blocking(move || {
        MasterNode::open(&dir, default_replicas, replication, runtime)
    })
    .await?
    .with_context(|| format!("cannot open the master in {}", data_dir.display()))?;
    let db = Database::with_client(node.client.clone(), limits);
    if let Some(administrator) = administrator {
        // The catalog takes DDL once it has a leader (one of the masters).
        let db = db.clone();
        tokio::spawn(async move {
            for _ in 0..120 {
                match create_administrator(&db, &administrator).await {
                    Ok(()) => return,
                    Err(e) => tracing::debug!(error = %e, "the administrator is not created yet"),
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            tracing::error!("cannot create the administrator: the catalog has no leader");
        });
    }
    let (master_service, consensus_service) = node.services();
    let heartbeats = tonic::transport::Server::builder()
        .layer(nyala_engine::rpc::RequireClusterSecret)
        .layer(nyala_engine::metrics::RpcMetricsLayer)
        .add_service(master_service.into_server())
        .add_service(consensus_service.into_server())
        .serve_with_incoming_shutdown(nyala_engine::rpc::incoming(rpc), shutdown_signal());
    let heartbeats = tokio::spawn(heartbeats);
    node.start_repairs(unavailable);
    let listener = tokio::net::TcpListener::bind(flight_addr)
        .await
        .with_context(|| format!("cannot listen on {flight_addr}"))?;
    let addr = listener.local_addr()?;
    let activity = Arc::new(Activity::default());
    let mut metrics = registry_with_engine_metrics();
    nyala_engine::master::metrics::register_master(&mut metrics, &node.master, &node.registry);
    activity.register(&mut metrics);
    let web = WebState {
        role: "master",
        metrics,
        db: Some(db.clone()),
        tablet_server: None,
        master: Some((node.master.clone(), node.registry.clone())),
        activity: Some(activity.clone()),
    };
    let http = match http_addr {
        Some(http_addr) => format!(" and {}", start_web(http_addr, web).await?),
        None => String::new(),
    };
    announce(&format!(
        "Nyala master listening on grpc://{addr}{http} (internal RPC {rpc_addr}, data: {})",
        data_dir.display()
    ));
    let pg = listen_pg(pg_addr).await?;
    let options = ServerOptions {
        location: Some(format!("{}://{addr}", tls.scheme())),
        activity: Some(activity),
        tls: tls.identity()?,
        ..ServerOptions::default()
    };
    nyala_flight::serve(db.clone(), listener, pg, options, shutdown_signal()).await?;
    db.shutdown().await?;
    heartbeats.abort();
    Ok(())
}

async fn tserver(
    data_dir: PathBuf,
    (rpc_addr, rpc_advertise, http_addr): (SocketAddr, Option<String>, Option<SocketAddr>),
    memory_limit: usize,
    masters: Vec<String>,
    flight: Option<((SocketAddr, Option<SocketAddr>), QueryLimits, TlsArgs)>,
) -> anyhow::Result<()> {
    use nyala_engine::clock::HybridClock;
    use nyala_engine::consensus::{ConsensusService, RaftRouter};
    use nyala_engine::tserver::service::TabletServerService;
    use nyala_engine::tserver::TabletServer;
    let router = RaftRouter::new(tokio::runtime::Handle::current());
    let dir = data_dir.clone();
    let server = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        TabletServer::open(
            &dir,
            nyala_engine::storage::TabletOptions::default(),
            memory_limit,
            Arc::new(HybridClock::new()),
            Some(router),
        )
    })
    .await?
    .with_context(|| format!("cannot open the tablet server in {}", data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(rpc_addr)
        .await
        .with_context(|| format!("cannot listen on {rpc_addr}"))?;
    let addr = listener.local_addr()?;
    let activity = Arc::new(Activity::default());
    let mut metrics = registry_with_engine_metrics();
    nyala_engine::tserver::metrics::register_tablet_server(&mut metrics, &server);
    if flight.is_some() {
        activity.register(&mut metrics);
    }
    let web = WebState {
        role: "tserver",
        metrics,
        db: None,
        tablet_server: Some(server.clone()),
        master: None,
        activity: flight.is_some().then(|| activity.clone()),
    };
    let http = match http_addr {
        Some(http_addr) => format!(" and {}", start_web(http_addr, web).await?),
        None => String::new(),
    };
    announce(&format!(
        "Nyala tablet server {} listening on {addr}{http} (data: {})",
        server.server_id(),
        data_dir.display()
    ));
    if !masters.is_empty() {
        tokio::spawn(nyala_engine::tserver::heartbeater::heartbeat_loop(
            server.clone(),
            rpc_advertise.unwrap_or_else(|| addr.to_string()),
            masters.clone(),
        ));
        // Ends transactions abandoned in the tablets this server leads; the client of the
        // cluster it needs for that is connected the first time there is one.
        let cluster = Arc::new(tokio::sync::OnceCell::new());
        let masters = masters.clone();
        tokio::spawn(nyala_engine::tserver::txns::resolve_abandoned(
            Arc::downgrade(&server),
            move || {
                let (cluster, masters) = (cluster.clone(), masters.clone());
                async move {
                    let connect = || nyala_engine::Client::connect_cluster(masters);
                    cluster.get_or_try_init(connect).await.ok().cloned()
                }
            },
        ));
    }
    // Other servers' Raft streams stay open: they end when this server stops.
    let (stop_streams, stopping) = tokio::sync::watch::channel(false);
    let consensus = ConsensusService::new(vec![server.clone()]).ending_streams_on(stopping);
    let shutdown = async move {
        shutdown_signal().await;
        let _ = stop_streams.send(true);
    };
    // The cluster's database this server coordinates queries over and runs other
    // coordinators' stages in (connected the first time either needs it).
    let limits = flight
        .as_ref()
        .map_or_else(QueryLimits::default, |(_, l, _)| l.clone());
    let database = cluster_database(masters, server.clone(), limits);
    let worker = nyala_sql::distributed::worker(database.clone());
    let rpc = tonic::transport::Server::builder()
        .layer(nyala_engine::rpc::RequireClusterSecret)
        .layer(nyala_engine::metrics::RpcMetricsLayer)
        .add_service(TabletServerService::new(server.clone()).into_server())
        .add_service(consensus.into_server())
        .add_service(worker.into_worker_server())
        .serve_with_incoming_shutdown(nyala_engine::rpc::incoming(listener), shutdown);
    match flight {
        None => rpc.await?,
        Some((flight_addr, _, tls)) => {
            let rpc = tokio::spawn(rpc);
            coordinate(database, flight_addr, tls, activity).await?;
            rpc.abort();
        }
    }
    tokio::task::spawn_blocking(move || server.shutdown()).await??;
    Ok(())
}

/// The database of the cluster whose masters are `masters`, seen from the tablet server
/// `local`: connected once, the first time it is asked for.
fn cluster_database(
    masters: Vec<String>,
    local: Arc<nyala_engine::tserver::TabletServer>,
    limits: QueryLimits,
) -> nyala_sql::distributed::WorkerDatabase {
    let database: Arc<tokio::sync::OnceCell<Arc<Database>>> = Arc::default();
    Arc::new(move || {
        let (database, masters) = (database.clone(), masters.clone());
        let (local, limits) = (local.clone(), limits.clone());
        Box::pin(async move {
            let connect = || Database::connect_cluster(masters, Some(local), limits);
            database.get_or_try_init(connect).await.cloned()
        })
    })
}

/// Serves Flight SQL at `flight_addr` as a coordinator of the cluster `database` connects
/// to, until a shutdown signal.
async fn coordinate(
    database: nyala_sql::distributed::WorkerDatabase,
    (flight_addr, pg_addr): (SocketAddr, Option<SocketAddr>),
    tls: TlsArgs,
    activity: Arc<Activity>,
) -> anyhow::Result<()> {
    // The masters may still be starting.
    let started = std::time::Instant::now();
    let db = loop {
        match database().await {
            Ok(db) => break db,
            Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => {
                return Err(e).context("cannot reach a master");
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    };
    let listener = tokio::net::TcpListener::bind(flight_addr)
        .await
        .with_context(|| format!("cannot listen on {flight_addr}"))?;
    let addr = listener.local_addr()?;
    announce(&format!("Nyala coordinator listening on grpc://{addr}"));
    let pg = listen_pg(pg_addr).await?;
    let options = ServerOptions {
        location: Some(format!("{}://{addr}", tls.scheme())),
        activity: Some(activity),
        tls: tls.identity()?,
        ..ServerOptions::default()
    };
    nyala_flight::serve(db.clone(), listener, pg, options, shutdown_signal()).await?;
    db.client().wait_for_commits().await;
    Ok(())
}

/// Creates the administrator `--user/--password` name at the first start (the catalog has no
/// user yet); later starts keep the users the catalog has.
async fn create_administrator(db: &Database, administrator: &Credentials) -> anyhow::Result<()> {
    let client = db.client();
    if !client.users().is_empty() {
        let known = client.user(&administrator.username);
        if !known.is_some_and(|user| user.verify(&administrator.password)) {
            tracing::warn!(
                user = %administrator.username,
                "--user/--password are used only at the first start; the users and passwords \
                 in the catalog apply (ALTER USER changes a password)"
            );
        }
        return Ok(());
    }
    let user = nyala_engine::UserInfo::new(&administrator.username, &administrator.password, true)
        .context("cannot create the administrator")?;
    client
        .ddl(nyala_engine::DdlOp::CreateUser {
            user,
            if_not_exists: true,
        })
        .await
        .context("cannot create the administrator")?;
    Ok(())
}

/// A metrics registry with the engine's event metrics (see [`nyala_engine::metrics`]).
fn registry_with_engine_metrics() -> Registry {
    let mut registry = Registry::default();
    nyala_engine::metrics::register(&mut registry);
    registry
}

/// Starts the web UI and /metrics at `addr` until a shutdown signal; the URL it serves.
async fn start_web(addr: SocketAddr, state: WebState) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for the web UI (see --http-addr)"))?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = nyala_flight::web::serve(listener, state, shutdown_signal()).await {
            tracing::error!(error = %e, "the web UI stopped");
        }
    });
    Ok(url)
}

/// The PostgreSQL protocol's listener at `addr`, if one is asked for; announces where it
/// listens.
async fn listen_pg(addr: Option<SocketAddr>) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for PostgreSQL clients (see --pg-addr)")
    })?;
    announce(&format!(
        "Nyala PostgreSQL protocol listening on {}",
        listener.local_addr()?
    ));
    Ok(Some(listener))
}

/// Prints a status line (where a server listens) to stdout; a closed stdout is not an error.
fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

async fn serve(
    data_dir: PathBuf,
    (listen, http_addr, pg_addr): (SocketAddr, SocketAddr, SocketAddr),
    (advertise, scheme): (Option<String>, &str),
    administrator: Option<Credentials>,
    server: ServerOptions,
    options: DatabaseOptions,
) -> anyhow::Result<()> {
    let db: Arc<Database> = Database::open(&data_dir, options)
        .await
        .with_context(|| format!("cannot open the database in {}", data_dir.display()))?;
    if let Some(administrator) = administrator {
        create_administrator(&db, &administrator).await?;
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let activity = Arc::new(Activity::default());
    let mut metrics = registry_with_engine_metrics();
    if let Some(server) = db.tablet_server() {
        nyala_engine::tserver::metrics::register_tablet_server(&mut metrics, server);
    }
    activity.register(&mut metrics);
    let web = WebState {
        role: "serve",
        metrics,
        db: Some(db.clone()),
        tablet_server: db.tablet_server().cloned(),
        master: None,
        activity: Some(activity.clone()),
    };
    let http = start_web(http_addr, web).await?;
    let shown = if scheme == "grpc+tls" { scheme } else { "grpc" };
    announce(&format!(
        "Nyala listening on {shown}://{addr} and {http} (data: {})",
        data_dir.display()
    ));
    let pg = listen_pg(Some(pg_addr)).await?;
    let advertised = advertise.unwrap_or_else(|| addr.to_string());
    let options = ServerOptions {
        location: Some(format!(
            "{scheme}://{}",
            advertised
                .trim_start_matches("grpc://")
                .trim_start_matches("grpc+tcp://")
                .trim_start_matches("grpc+tls://")
        )),
        activity: Some(activity),
        ..server
    };
    nyala_flight::serve(db.clone(), listener, pg, options, shutdown_signal()).await?;
    db.shutdown().await?;
    Ok(())
}
