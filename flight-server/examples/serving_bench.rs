//! End-to-end serving benchmark: Nyala over Arrow Flight SQL against PostgreSQL, in one run.
//!
//! It measures what a client of a serving database sees: the latency of a trivial statement and
//! of a prepared primary-key lookup on one connection, then YCSB's core workloads A to D (Cooper
//! et al., "Benchmarking Cloud Serving Systems with YCSB", SoCC 2010) with concurrent clients,
//! each on its own connection, for a fixed time. Both systems get the same table, the same rows
//! (same seed) and the same random choices per client, and every test runs on Nyala and then
//! straight away on PostgreSQL, so a busy machine disturbs both alike. Each figure is printed
//! with the ratio Nyala / PostgreSQL.
//!
//! ```text
//! bench/serving.sh        # builds, starts both servers, runs this program, cleans up
//! serving_bench --nyala grpc://127.0.0.1:50051 \
//!     --postgres "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
//! ```
//!
//! Round trips differ by protocol, and they are part of what is measured (the tables show the
//! requests per call): a Flight SQL statement is GetFlightInfo and then one DoGet per endpoint,
//! a prepared query first binds its parameters with a DoPut, and a prepared update is a DoPut
//! that binds and a DoPut that runs it. PostgreSQL's extended protocol binds and executes in one
//! round trip.
//!
//! Keys are chosen as YCSB chooses them: a scrambled zipfian (constant 0.99) over the loaded keys
//! for A to C; for D, reads skewed towards the most recently acknowledged insert. An error of one
//! operation is counted, not fatal; so is a read that returns other than one row and a write that
//! reports other than one row changed, as a correctness signal. Nothing here judges the timings.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::sql::client::{FlightSqlServiceClient, PreparedStatement};
use arrow_flight::FlightInfo;
use clap::Parser;
use futures::TryStreamExt;
use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::{NoTls, SimpleQueryMessage, Statement};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(about = "Serving benchmark: Nyala (Flight SQL) against PostgreSQL, same run")]
struct Args {
    /// Nyala's Flight SQL address, e.g. grpc://127.0.0.1:50051; with `--nyala-protocol
    /// postgres`, a connection string of its PostgreSQL protocol, e.g. "host=127.0.0.1
    /// port=5433 user=nyala dbname=nyala".
    #[arg(long)]
    nyala: Option<String>,
    /// How the benchmark talks to Nyala: Flight SQL (arrow-flight) or the PostgreSQL protocol
    /// (tokio-postgres, the same client as PostgreSQL's).
    #[arg(long, value_enum, default_value = "flight")]
    nyala_protocol: Protocol,
    /// PostgreSQL connection string, e.g. "host=127.0.0.1 port=5432 user=postgres dbname=postgres".
    #[arg(long)]
    postgres: Option<String>,
    /// Rows loaded into usertable before the tests (usertable is dropped and created first).
    #[arg(long, default_value_t = 10_000)]
    rows: u64,
    /// Concurrent clients in the workloads, each on its own connection.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Seconds each workload runs, per system.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Sequential calls per latency test, after a tenth as many to warm up.
    #[arg(long, default_value_t = 1_000)]
    iterations: usize,
    /// Also write the tables and the summary as JSON to this file (the schema of
    /// `bench/results/*.json`, which `bench/render.py` turns into the guide's benchmarks page).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// The benchmark's name in the JSON file.
    #[arg(long, default_value = "serving")]
    json_name: String,
    /// The command line recorded in the JSON file (by default this program's own).
    #[arg(long)]
    json_command: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Protocol {
    Flight,
    Postgres,
}

const FIELDS: usize = 10;
const FIELD_BYTES: usize = 100;
/// Rows per multi-row INSERT while loading.
const LOAD_BATCH: u64 = 100;
/// An operation still running after this is abandoned and counted as failed, so that one stuck
/// call cannot hold a fixed-duration run open.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
const SEED: u64 = 0x5e41_4e47;

fn key_name(number: u64) -> String {
    format!("user{number}")
}

fn random_value(rng: &mut StdRng) -> String {
    (0..FIELD_BYTES)
        .map(|_| char::from(rng.sample(Alphanumeric)))
        .collect()
}

fn random_values(rng: &mut StdRng) -> Vec<String> {
    (0..FIELDS).map(|_| random_value(rng)).collect()
}

fn update_sql(field: usize) -> String {
    format!("UPDATE usertable SET field{field} = $1 WHERE ycsb_key = $2")
}

const READ_SQL: &str = "SELECT * FROM usertable WHERE ycsb_key = $1";

fn insert_sql() -> String {
    let params: Vec<String> = (1..=FIELDS + 1).map(|i| format!("${i}")).collect();
    format!("INSERT INTO usertable VALUES ({})", params.join(", "))
}

// ---------------------------------------------------------------------------------------------
// The systems under test

/// One connection to a system under test. `prepare` prepares the workload's statements on it
/// (usertable must exist by then); the operations return what the server reports: rows returned
/// by a read, rows changed by a write. `requests` counts the requests sent so far (RPCs for
/// Flight SQL, round trips for PostgreSQL), so the tables can show the cost per call.
trait Client: Sized + Send + 'static {
    const NAME: &'static str;
    fn connect(target: &str) -> impl Future<Output = Result<Self>> + Send;
    /// One line on the server and how the client talks to it.
    fn describe(&mut self) -> impl Future<Output = Result<String>> + Send;
    fn create_table(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// A plain (unprepared) statement that changes rows; returns the rows changed.
    fn execute(&mut self, sql: &str) -> impl Future<Output = Result<u64>> + Send;
    fn prepare(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// `SELECT 1` as a plain statement; returns the rows received.
    fn select_one(&mut self) -> impl Future<Output = Result<u64>> + Send;
    fn read(&mut self, key: &str) -> impl Future<Output = Result<u64>> + Send;
    fn update(
        &mut self,
        field: usize,
        value: &str,
        key: &str,
    ) -> impl Future<Output = Result<u64>> + Send;
    fn insert(&mut self, key: &str, values: &[String]) -> impl Future<Output = Result<u64>> + Send;
    fn requests(&self) -> u64;
    /// Closes the prepared statements: Flight SQL keeps them on the server until then.
    fn close(self) -> impl Future<Output = Result<()>> + Send;
}

/// Nyala through Arrow Flight SQL: one tonic Channel (one HTTP/2 connection) per client; the
/// prepared statements share it.
struct Nyala {
    flight: FlightSqlServiceClient<Channel>,
    statements: Option<NyalaStatements>,
    requests: u64,
}

struct NyalaStatements {
    read: PreparedStatement<Channel>,
    updates: Vec<PreparedStatement<Channel>>,
    insert: PreparedStatement<Channel>,
}

impl Nyala {
    fn statements(
        &mut self,
    ) -> Result<(&mut NyalaStatements, &mut FlightSqlServiceClient<Channel>)> {
        let statements = self
            .statements
            .as_mut()
            .context("statements not prepared")?;
        Ok((statements, &mut self.flight))
    }
}

/// Reads every endpoint of `info` over `flight`, as a client must to get the whole result;
/// returns the rows received and the DoGet calls made.
async fn fetch(
    flight: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<(u64, u64)> {
    let (mut rows, mut calls) = (0, 0);
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.context("endpoint without a ticket")?;
        let mut stream = flight.do_get(ticket).await?;
        calls += 1;
        while let Some(batch) = stream.try_next().await? {
            rows += batch.num_rows() as u64;
        }
    }
    Ok((rows, calls))
}

/// One row of string parameters `$1, $2, ...` for a Flight SQL prepared statement.
fn string_params(values: &[&str]) -> Result<RecordBatch> {
    let fields: Vec<Field> = (1..=values.len())
        .map(|i| Field::new(format!("${i}"), DataType::Utf8, false))
        .collect();
    let columns: Vec<ArrayRef> = values
        .iter()
        .map(|v| Arc::new(StringArray::from(vec![*v])) as ArrayRef)
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

impl Client for Nyala {
    const NAME: &'static str = "nyala";

    async fn connect(target: &str) -> Result<Self> {
        let url = format!(
            "http://{}",
            target
                .trim_start_matches("grpc+tcp://")
                .trim_start_matches("grpc://")
                .trim_start_matches("http://")
        );
        let channel = Endpoint::from_shared(url.clone())
            .with_context(|| format!("bad Nyala address {target}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .with_context(|| format!("cannot connect to Nyala at {url}"))?;
        Ok(Nyala {
            flight: FlightSqlServiceClient::new(channel),
            statements: None,
            requests: 0,
        })
    }

    async fn describe(&mut self) -> Result<String> {
        let rows = self.select_one().await.context("SELECT 1 on Nyala")?;
        if rows != 1 {
            bail!("SELECT 1 on Nyala returned {rows} rows");
        }
        Ok("Arrow Flight SQL (arrow-flight client), one gRPC channel = one TCP connection per client".into())
    }

    async fn create_table(&mut self) -> Result<()> {
        let fields: Vec<String> = (0..FIELDS).map(|i| format!("field{i} STRING")).collect();
        for sql in [
            "DROP TABLE IF EXISTS usertable".to_string(),
            format!(
                "CREATE TABLE usertable (ycsb_key STRING, {}, PRIMARY KEY (ycsb_key)) \
                 DISTRIBUTE BY HASH (ycsb_key) INTO 8 BUCKETS",
                fields.join(", ")
            ),
        ] {
            self.flight
                .execute_update(sql.clone(), None)
                .await
                .with_context(|| format!("{sql} on Nyala"))?;
        }
        Ok(())
    }

    async fn execute(&mut self, sql: &str) -> Result<u64> {
        self.requests += 1;
        Ok(self.flight.execute_update(sql.to_string(), None).await? as u64)
    }

    async fn prepare(&mut self) -> Result<()> {
        let mut updates = Vec::with_capacity(FIELDS);
        for field in 0..FIELDS {
            let sql = update_sql(field);
            let statement = self.flight.prepare(sql.clone(), None).await;
            updates.push(statement.with_context(|| format!("preparing {sql} on Nyala"))?);
        }
        let read = self.flight.prepare(READ_SQL.into(), None).await;
        let insert = self.flight.prepare(insert_sql(), None).await;
        self.statements = Some(NyalaStatements {
            read: read.context("preparing the read on Nyala")?,
            updates,
            insert: insert.context("preparing the insert on Nyala")?,
        });
        Ok(())
    }

    async fn select_one(&mut self) -> Result<u64> {
        let info = self.flight.execute("SELECT 1".into(), None).await?;
        let (rows, calls) = fetch(&mut self.flight, info).await?;
        self.requests += 1 + calls;
        Ok(rows)
    }

    async fn read(&mut self, key: &str) -> Result<u64> {
        let (statements, flight) = self.statements()?;
        statements.read.set_parameters(string_params(&[key])?)?;
        let info = statements.read.execute().await?;
        let (rows, calls) = fetch(flight, info).await?;
        self.requests += 2 + calls;
        Ok(rows)
    }

    async fn update(&mut self, field: usize, value: &str, key: &str) -> Result<u64> {
        let (statements, _) = self.statements()?;
        let statement = &mut statements.updates[field];
        statement.set_parameters(string_params(&[value, key])?)?;
        let changed = statement.execute_update().await?;
        self.requests += 2;
        Ok(changed as u64)
    }

    async fn insert(&mut self, key: &str, values: &[String]) -> Result<u64> {
        let (statements, _) = self.statements()?;
        let params: Vec<&str> = std::iter::once(key)
            .chain(values.iter().map(String::as_str))
            .collect();
        statements.insert.set_parameters(string_params(&params)?)?;
        let inserted = statements.insert.execute_update().await?;
        self.requests += 2;
        Ok(inserted as u64)
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    async fn close(mut self) -> Result<()> {
        if let Some(statements) = self.statements.take() {
            let all = std::iter::once(statements.read)
                .chain(statements.updates)
                .chain(std::iter::once(statements.insert));
            for statement in all {
                statement
                    .close()
                    .await
                    .context("closing a prepared statement on Nyala")?;
            }
        }
        Ok(())
    }
}

/// PostgreSQL through tokio-postgres: one connection per client, statements prepared on it.
struct Postgres {
    client: tokio_postgres::Client,
    statements: Option<PostgresStatements>,
    requests: u64,
}

struct PostgresStatements {
    read: Statement,
    updates: Vec<Statement>,
    insert: Statement,
}

impl Postgres {
    fn statements(&self) -> Result<&PostgresStatements> {
        self.statements.as_ref().context("statements not prepared")
    }

    async fn show(&self, setting: &str) -> Result<String> {
        let messages = self.client.simple_query(&format!("SHOW {setting}")).await?;
        messages
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .with_context(|| format!("SHOW {setting} returned no row"))
    }
}

/// The row count of the last command in a simple-query response.
fn command_count(messages: &[SimpleQueryMessage]) -> Option<u64> {
    messages.iter().rev().find_map(|m| match m {
        SimpleQueryMessage::CommandComplete(n) => Some(*n),
        _ => None,
    })
}

impl Client for Postgres {
    const NAME: &'static str = "postgres";

    async fn connect(target: &str) -> Result<Self> {
        let (client, connection) = tokio_postgres::connect(target, NoTls)
            .await
            .with_context(|| format!("cannot connect to PostgreSQL with \"{target}\""))?;
        // The connection task ends when the client is dropped; an error on it surfaces as the
        // error of the client's pending and later calls.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Postgres {
            client,
            statements: None,
            requests: 0,
        })
    }

    async fn describe(&mut self) -> Result<String> {
        Ok(format!(
            "PostgreSQL {} (fsync={}, synchronous_commit={}, shared_buffers={}), tokio-postgres, one connection per client",
            self.show("server_version").await?,
            self.show("fsync").await?,
            self.show("synchronous_commit").await?,
            self.show("shared_buffers").await?,
        ))
    }

    async fn create_table(&mut self) -> Result<()> {
        let fields: Vec<String> = (0..FIELDS).map(|i| format!("field{i} TEXT")).collect();
        let sql = format!(
            "DROP TABLE IF EXISTS usertable; CREATE TABLE usertable (ycsb_key TEXT PRIMARY KEY, {})",
            fields.join(", ")
        );
        self.client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("{sql} on PostgreSQL"))
    }

    async fn execute(&mut self, sql: &str) -> Result<u64> {
        self.requests += 1;
        let messages = self.client.simple_query(sql).await?;
        command_count(&messages).context("no command completion in the response")
    }

    async fn prepare(&mut self) -> Result<()> {
        let mut updates = Vec::with_capacity(FIELDS);
        for field in 0..FIELDS {
            let sql = update_sql(field);
            let statement = self.client.prepare(&sql).await;
            updates.push(statement.with_context(|| format!("preparing {sql} on PostgreSQL"))?);
        }
        let read = self.client.prepare(READ_SQL).await;
        let insert = self.client.prepare(&insert_sql()).await;
        self.statements = Some(PostgresStatements {
            read: read.context("preparing the read on PostgreSQL")?,
            updates,
            insert: insert.context("preparing the insert on PostgreSQL")?,
        });
        Ok(())
    }

    async fn select_one(&mut self) -> Result<u64> {
        self.requests += 1;
        let messages = self.client.simple_query("SELECT 1").await?;
        Ok(messages
            .iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
            .count() as u64)
    }

    async fn read(&mut self, key: &str) -> Result<u64> {
        self.requests += 1;
        let rows = self.client.query(&self.statements()?.read, &[&key]).await?;
        Ok(rows.len() as u64)
    }

    async fn update(&mut self, field: usize, value: &str, key: &str) -> Result<u64> {
        self.requests += 1;
        let statement = &self.statements()?.updates[field];
        Ok(self.client.execute(statement, &[&value, &key]).await?)
    }

    async fn insert(&mut self, key: &str, values: &[String]) -> Result<u64> {
        self.requests += 1;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&key];
        params.extend(
            values
                .iter()
                .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync)),
        );
        Ok(self
            .client
            .execute(&self.statements()?.insert, &params)
            .await?)
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    async fn close(self) -> Result<()> {
        // Prepared statements end with the connection, which ends when the client is dropped.
        Ok(())
    }
}

/// Nyala through its PostgreSQL protocol, with the client PostgreSQL gets (tokio-postgres):
/// the same statements, prepared on the connection, one round trip per call.
struct NyalaPg(Postgres);

impl Client for NyalaPg {
    const NAME: &'static str = "nyala";

    async fn connect(target: &str) -> Result<Self> {
        Ok(NyalaPg(Postgres::connect(target).await?))
    }

    async fn describe(&mut self) -> Result<String> {
        Ok(format!(
            "PostgreSQL protocol (server_version {}), tokio-postgres, one connection per client",
            self.0.show("server_version").await?
        ))
    }

    async fn create_table(&mut self) -> Result<()> {
        let fields: Vec<String> = (0..FIELDS).map(|i| format!("field{i} STRING")).collect();
        let sql = format!(
            "DROP TABLE IF EXISTS usertable; CREATE TABLE usertable (ycsb_key STRING, {}, \
             PRIMARY KEY (ycsb_key)) DISTRIBUTE BY HASH (ycsb_key) INTO 8 BUCKETS",
            fields.join(", ")
        );
        (self.0.client.batch_execute(&sql).await).with_context(|| format!("{sql} on Nyala"))
    }

    async fn execute(&mut self, sql: &str) -> Result<u64> {
        self.0.execute(sql).await
    }

    async fn prepare(&mut self) -> Result<()> {
        self.0.prepare().await
    }

    async fn select_one(&mut self) -> Result<u64> {
        self.0.select_one().await
    }

    async fn read(&mut self, key: &str) -> Result<u64> {
        self.0.read(key).await
    }

    async fn update(&mut self, field: usize, value: &str, key: &str) -> Result<u64> {
        self.0.update(field, value, key).await
    }

    async fn insert(&mut self, key: &str, values: &[String]) -> Result<u64> {
        self.0.insert(key, values).await
    }

    fn requests(&self) -> u64 {
        self.0.requests()
    }

    async fn close(self) -> Result<()> {
        self.0.close().await
    }
}

// ---------------------------------------------------------------------------------------------
// YCSB's key choosers

const ZIPFIAN_CONSTANT: f64 = 0.99;

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases", SIGMOD 1994): item i of n is drawn with probability proportional to
/// 1/(i+1)^0.99, so item 0 is the most popular. When the item count grows between draws (workload
/// D), zeta is extended by the new items instead of recomputed, as YCSB does.
#[derive(Clone)]
struct Zipfian {
    items: u64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
}

/// zeta(n) continued from `from` items: `initial` plus 1/(i+1)^theta for i in from..to.
fn zeta(from: u64, to: u64, initial: f64) -> f64 {
    (from..to).fold(initial, |sum, i| {
        sum + 1.0 / ((i + 1) as f64).powf(ZIPFIAN_CONSTANT)
    })
}

impl Zipfian {
    fn new(items: u64) -> Self {
        Self::with_zeta(items, zeta(0, items, 0.0))
    }

    fn with_zeta(items: u64, zetan: f64) -> Self {
        let mut zipfian = Zipfian {
            items,
            alpha: 1.0 / (1.0 - ZIPFIAN_CONSTANT),
            zeta2: zeta(0, 2, 0.0),
            zetan,
            eta: 0.0,
        };
        zipfian.eta = zipfian.eta();
        zipfian
    }

    fn eta(&self) -> f64 {
        (1.0 - (2.0 / self.items as f64).powf(1.0 - ZIPFIAN_CONSTANT))
            / (1.0 - self.zeta2 / self.zetan)
    }

    /// An item in 0..items.
    fn next(&mut self, rng: &mut StdRng, items: u64) -> u64 {
        if items != self.items {
            self.zetan = if items > self.items {
                zeta(self.items, items, self.zetan)
            } else {
                zeta(0, items, 0.0)
            };
            self.items = items;
            self.eta = self.eta();
        }
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        let item = if uz < 1.0 {
            0
        } else if uz < 1.0 + 0.5f64.powf(ZIPFIAN_CONSTANT) {
            1
        } else {
            (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        item.min(items - 1)
    }
}

/// YCSB's scrambled zipfian: a zipfian over a fixed space of 10^10 items (whose zeta YCSB
/// precomputed), hashed onto the keys, so the popular keys are spread over the key range
/// rather than being its first keys.
struct ScrambledZipfian {
    zipfian: Zipfian,
    keys: u64,
}

const SCRAMBLED_ITEMS: u64 = 10_000_000_000 + 1;
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

impl ScrambledZipfian {
    fn new(keys: u64) -> Self {
        ScrambledZipfian {
            zipfian: Zipfian::with_zeta(SCRAMBLED_ITEMS, SCRAMBLED_ZETAN),
            keys,
        }
    }

    fn next(&mut self, rng: &mut StdRng) -> u64 {
        let item = self.zipfian.next(rng, SCRAMBLED_ITEMS);
        fnv_hash64(item as i64).rem_euclid(self.keys as i64) as u64
    }
}

/// YCSB's `Utils.fnvhash64` (FNV-1a over the 8 bytes of the value, then the absolute value).
fn fnv_hash64(mut value: i64) -> i64 {
    let mut hash = 0xCBF2_9CE4_8422_2325_u64 as i64;
    for _ in 0..8 {
        hash ^= value & 0xff;
        hash = hash.wrapping_mul(1_099_511_628_211);
        value >>= 8;
    }
    hash.wrapping_abs()
}

/// The keys of workload D: inserts take the next key number, and reads pick among the keys
/// below `limit`, the first number not yet acknowledged (YCSB's acknowledged counter), skewed
/// towards the newest. Numbers whose insert failed are never read.
struct InsertedKeys {
    next: AtomicU64,
    acknowledged: Mutex<Acknowledged>,
}

struct Acknowledged {
    limit: u64,
    out_of_order: BTreeSet<u64>,
    failed: BTreeSet<u64>,
}

impl InsertedKeys {
    fn new(loaded: u64) -> Self {
        InsertedKeys {
            next: AtomicU64::new(loaded),
            acknowledged: Mutex::new(Acknowledged {
                limit: loaded,
                out_of_order: BTreeSet::new(),
                failed: BTreeSet::new(),
            }),
        }
    }

    fn allocate(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn finish(&self, number: u64, inserted: bool) {
        let mut acknowledged = self.acknowledged.lock().expect("not poisoned");
        if !inserted {
            acknowledged.failed.insert(number);
        }
        acknowledged.out_of_order.insert(number);
        while let Some(next) = acknowledged.out_of_order.first().copied() {
            if next != acknowledged.limit {
                break;
            }
            acknowledged.out_of_order.pop_first();
            acknowledged.limit += 1;
        }
    }

    /// YCSB's skewed-latest choice: the newest acknowledged key minus a zipfian offset.
    fn latest(&self, zipfian: &mut Zipfian, rng: &mut StdRng) -> u64 {
        let acknowledged = self.acknowledged.lock().expect("not poisoned");
        loop {
            let newest = acknowledged.limit - 1;
            let number = newest - zipfian.next(rng, acknowledged.limit);
            if !acknowledged.failed.contains(&number) {
                return number;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements

/// Latencies of successful calls, sorted.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Latencies(samples)
    }

    /// Nearest-rank percentile, None without samples.
    fn percentile(&self, p: f64) -> Option<Duration> {
        let rank = ((p * self.0.len() as f64).ceil() as usize).max(1);
        self.0.get(rank - 1).copied()
    }

    fn mean(&self) -> Option<Duration> {
        let total: Duration = self.0.iter().sum();
        (!self.0.is_empty()).then(|| total / self.0.len() as u32)
    }
}

/// What the calls of a test or a workload came to.
#[derive(Default)]
struct Outcomes {
    reads: Vec<Duration>,
    writes: Vec<Duration>,
    failed: u64,
    reads_not_one_row: u64,
    writes_not_one_row: u64,
    first_error: Option<String>,
}

impl Outcomes {
    fn record(
        &mut self,
        write: bool,
        began: Instant,
        result: Result<Result<u64>, tokio::time::error::Elapsed>,
    ) {
        let latency = began.elapsed();
        match result {
            Ok(Ok(count)) => {
                let (latencies, not_one) = if write {
                    (&mut self.writes, &mut self.writes_not_one_row)
                } else {
                    (&mut self.reads, &mut self.reads_not_one_row)
                };
                latencies.push(latency);
                *not_one += u64::from(count != 1);
            }
            Ok(Err(e)) => self.fail(format!("{e:#}")),
            Err(_) => self.fail(format!("no answer within {OP_TIMEOUT:?}")),
        }
    }

    fn fail(&mut self, error: String) {
        self.failed += 1;
        self.first_error.get_or_insert(error);
    }

    fn merge(&mut self, other: Outcomes) {
        self.reads.extend(other.reads);
        self.writes.extend(other.writes);
        self.failed += other.failed;
        self.reads_not_one_row += other.reads_not_one_row;
        self.writes_not_one_row += other.writes_not_one_row;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn succeeded(&self) -> u64 {
        (self.reads.len() + self.writes.len()) as u64
    }

    fn all(&self) -> Latencies {
        Latencies::new(self.reads.iter().chain(&self.writes).copied().collect())
    }

    fn read_latencies(&self) -> Latencies {
        Latencies::new(self.reads.clone())
    }

    fn write_latencies(&self) -> Latencies {
        Latencies::new(self.writes.clone())
    }

    fn not_one_row(&self) -> u64 {
        self.reads_not_one_row + self.writes_not_one_row
    }
}

struct LoadResult {
    elapsed: Duration,
}

/// Drops and creates usertable and loads `rows` rows on one connection with multi-row INSERTs,
/// the same SQL text for both systems (the rows come from the same seed).
async fn load<C: Client>(target: &str, rows: u64) -> Result<LoadResult> {
    let mut client = C::connect(target).await?;
    client.create_table().await?;
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut elapsed = Duration::ZERO;
    let mut first = 0;
    while first < rows {
        let last = (first + LOAD_BATCH).min(rows);
        let tuples: Vec<String> = (first..last)
            .map(|number| {
                let values = random_values(&mut rng);
                format!("('{}', '{}')", key_name(number), values.join("', '"))
            })
            .collect();
        let sql = format!("INSERT INTO usertable VALUES {}", tuples.join(", "));
        let began = Instant::now();
        let inserted = client
            .execute(&sql)
            .await
            .with_context(|| format!("loading rows {first}..{last} into {}", C::NAME))?;
        elapsed += began.elapsed();
        if inserted != last - first {
            bail!(
                "loading rows {first}..{last} into {}: the server reports {inserted} rows inserted",
                C::NAME
            );
        }
        first = last;
    }
    Ok(LoadResult { elapsed })
}

#[derive(Clone, Copy)]
enum LatencyTest {
    SelectOne,
    Lookup,
}

struct LatencyResult {
    outcomes: Outcomes,
    requests_per_call: f64,
}

/// `iterations` sequential calls on one connection after a tenth as many to warm up.
async fn latency<C: Client>(
    target: &str,
    test: LatencyTest,
    iterations: usize,
    rows: u64,
) -> Result<LatencyResult> {
    let mut client = C::connect(target).await?;
    client.prepare().await?;
    let mut rng = StdRng::seed_from_u64(SEED + 1);
    let warm_up = (iterations / 10).max(1);
    let mut outcomes = Outcomes::default();
    let mut requests_before = 0;
    for i in 0..warm_up + iterations {
        if i == warm_up {
            outcomes = Outcomes::default();
            requests_before = client.requests();
        }
        let key = key_name(rng.random_range(0..rows));
        let began = Instant::now();
        let result = match test {
            LatencyTest::SelectOne => tokio::time::timeout(OP_TIMEOUT, client.select_one()).await,
            LatencyTest::Lookup => tokio::time::timeout(OP_TIMEOUT, client.read(&key)).await,
        };
        outcomes.record(false, began, result);
    }
    let requests_per_call = (client.requests() - requests_before) as f64 / iterations as f64;
    client.close().await?;
    Ok(LatencyResult {
        outcomes,
        requests_per_call,
    })
}

#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    read_proportion: f64,
    /// D: writes insert new keys and reads favour the newest; else writes update one field.
    read_latest: bool,
}

const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "A update heavy 50/50",
        read_proportion: 0.5,
        read_latest: false,
    },
    Workload {
        name: "B read mostly 95/5",
        read_proportion: 0.95,
        read_latest: false,
    },
    Workload {
        name: "C read only",
        read_proportion: 1.0,
        read_latest: false,
    },
    Workload {
        name: "D read latest 95/5",
        read_proportion: 0.95,
        read_latest: true,
    },
];

struct WorkloadResult {
    outcomes: Outcomes,
    elapsed: Duration,
    requests: u64,
}

impl WorkloadResult {
    fn ops_per_second(&self) -> f64 {
        self.outcomes.succeeded() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `workload` with `threads` clients, each on its own connection made (and its statements
/// prepared) before the clock starts, until `duration` has passed.
async fn run_workload<C: Client>(
    target: &str,
    workload: Workload,
    index: usize,
    threads: usize,
    duration: Duration,
    rows: u64,
) -> Result<WorkloadResult> {
    let clients = futures::future::try_join_all((0..threads).map(|_| async {
        let mut client = C::connect(target).await?;
        client.prepare().await?;
        anyhow::Ok(client)
    }))
    .await?;
    // Workload D inserts keys numbered from `rows` on; this runs after A to C and usertable is
    // recreated on each run, so those numbers are free.
    let inserted = Arc::new(InsertedKeys::new(rows));
    // Zeta over the loaded keys, computed before the clock starts.
    let latest = workload.read_latest.then(|| Zipfian::new(rows));
    let began = Instant::now();
    let deadline = began + duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let seed = SEED ^ ((index as u64) << 32 | i as u64);
            tokio::spawn(run_client(
                client,
                workload,
                seed,
                deadline,
                rows,
                inserted.clone(),
                latest.clone(),
            ))
        })
        .collect();
    let mut outcomes = Outcomes::default();
    let mut requests = 0;
    let mut clients = Vec::with_capacity(threads);
    for task in tasks {
        let (client, client_outcomes) = task.await.context("a client task panicked")?;
        requests += client.requests();
        outcomes.merge(client_outcomes);
        clients.push(client);
    }
    let elapsed = began.elapsed();
    futures::future::try_join_all(clients.into_iter().map(C::close)).await?;
    Ok(WorkloadResult {
        outcomes,
        elapsed,
        requests,
    })
}

async fn run_client<C: Client>(
    mut client: C,
    workload: Workload,
    seed: u64,
    deadline: Instant,
    rows: u64,
    inserted: Arc<InsertedKeys>,
    mut latest: Option<Zipfian>,
) -> (C, Outcomes) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut scrambled = ScrambledZipfian::new(rows);
    let mut outcomes = Outcomes::default();
    while Instant::now() < deadline {
        let read = rng.random::<f64>() < workload.read_proportion;
        if read {
            let number = match &mut latest {
                Some(zipfian) => inserted.latest(zipfian, &mut rng),
                None => scrambled.next(&mut rng),
            };
            let key = key_name(number);
            let began = Instant::now();
            let result = tokio::time::timeout(OP_TIMEOUT, client.read(&key)).await;
            outcomes.record(false, began, result);
        } else if workload.read_latest {
            let number = inserted.allocate();
            let values = random_values(&mut rng);
            let began = Instant::now();
            let result =
                tokio::time::timeout(OP_TIMEOUT, client.insert(&key_name(number), &values)).await;
            inserted.finish(number, matches!(result, Ok(Ok(_))));
            outcomes.record(true, began, result);
        } else {
            let key = key_name(scrambled.next(&mut rng));
            let field = rng.random_range(0..FIELDS);
            let value = random_value(&mut rng);
            let began = Instant::now();
            let result = tokio::time::timeout(OP_TIMEOUT, client.update(field, &value, &key)).await;
            outcomes.record(true, began, result);
        }
    }
    (client, outcomes)
}

// ---------------------------------------------------------------------------------------------
// Output

/// The same measurement on each system given.
struct Pair<T> {
    nyala: Option<T>,
    postgres: Option<T>,
}

/// Where the systems are, and how Nyala is spoken to.
struct Targets {
    nyala: Option<String>,
    postgres: Option<String>,
    protocol: Protocol,
}

impl<T> Pair<T> {
    /// The systems' names and results, Nyala first.
    fn each(&self) -> impl Iterator<Item = (&'static str, &T)> {
        [(Nyala::NAME, &self.nyala), (Postgres::NAME, &self.postgres)]
            .into_iter()
            .filter_map(|(name, result)| result.as_ref().map(|r| (name, r)))
    }

    fn get(&self, name: &str) -> Option<&T> {
        self.each().find(|(n, _)| *n == name).map(|(_, r)| r)
    }

    /// Nyala / PostgreSQL of `figure`, if both were measured and it is defined on both.
    fn ratio(&self, figure: impl Fn(&T) -> Option<f64>) -> Option<f64> {
        let nyala = figure(self.nyala.as_ref()?)?;
        let postgres = figure(self.postgres.as_ref()?)?;
        (postgres > 0.0).then(|| nyala / postgres)
    }
}

/// Runs the generic measurement `$f::<C>(target, args...)` on each system given, Nyala first.
macro_rules! on_each_system {
    ($targets:expr, $f:ident ( $($arg:expr),* )) => {
        Pair {
            nyala: match (&$targets.nyala, $targets.protocol) {
                (Some(target), Protocol::Flight) => Some($f::<Nyala>(target, $($arg),*).await?),
                (Some(target), Protocol::Postgres) => {
                    Some($f::<NyalaPg>(target, $($arg),*).await?)
                }
                (None, _) => None,
            },
            postgres: match &$targets.postgres {
                Some(target) => Some($f::<Postgres>(target, $($arg),*).await?),
                None => None,
            },
        }
    };
}

/// A table printed a row at a time as results arrive: the first column left-aligned, the others
/// right-aligned, each as wide as given (or its heading). It keeps its rows for the JSON report.
struct Table {
    title: String,
    columns: Vec<String>,
    widths: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(title: &str, columns: &[(&str, usize)]) -> Self {
        let table = Table {
            title: title.to_string(),
            columns: columns.iter().map(|(h, _)| h.to_string()).collect(),
            widths: columns.iter().map(|(h, w)| (*w).max(h.len())).collect(),
            rows: Vec::new(),
        };
        println!("\n{title}");
        table.print(&table.columns);
        let width: usize = table.widths.iter().sum::<usize>() + 2 * (table.widths.len() - 1);
        println!("{}", "-".repeat(width));
        table
    }

    /// Prints a row and keeps it, with empty cells where it has fewer than the columns.
    fn row(&mut self, mut cells: Vec<String>) {
        self.print(&cells);
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    fn print(&self, cells: &[String]) {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(&self.widths).enumerate() {
            if i == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        println!("{}", line.trim_end());
    }
}

fn ms(duration: Option<Duration>) -> String {
    match duration {
        Some(d) => format!("{:.3}", d.as_secs_f64() * 1e3),
        None => "-".into(),
    }
}

fn seconds(duration: Option<Duration>) -> Option<f64> {
    duration.map(|d| d.as_secs_f64())
}

/// A ratio with three significant digits (at least two decimals below 1: 0.0417x, 0.50x).
fn ratio(value: Option<f64>) -> String {
    match value {
        Some(r) if r >= 100.0 => format!("{r:.0}x"),
        Some(r) if r >= 10.0 => format!("{r:.1}x"),
        Some(r) if r >= 0.1 || r <= 0.0 => format!("{r:.2}x"),
        Some(r) => {
            let decimals = (2 - r.log10().floor() as i32).clamp(2, 8) as usize;
            format!("{r:.decimals$}x")
        }
        None => "-".into(),
    }
}

fn count(n: f64) -> String {
    let digits = format!("{:.0}", n.round());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(' ');
        }
        grouped.push(c);
    }
    grouped
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn print_errors<T>(test: &str, pair: &Pair<T>, outcomes: impl Fn(&T) -> &Outcomes) {
    for (name, result) in pair.each() {
        let outcomes = outcomes(result);
        if let Some(error) = &outcomes.first_error {
            println!(
                "  {name} {test}: {} failed, first error: {error}",
                outcomes.failed
            );
        }
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(Args::parse()).await {
        eprintln!("serving_bench: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<()> {
    if args.nyala.is_none() && args.postgres.is_none() {
        bail!("nothing to measure: give --nyala and/or --postgres");
    }
    if args.rows < 2 || args.threads == 0 || args.iterations == 0 || args.seconds == 0 {
        bail!("--rows must be at least 2, --threads, --iterations and --seconds at least 1");
    }
    let targets = Targets {
        nyala: args.nyala.clone(),
        postgres: args.postgres.clone(),
        protocol: args.nyala_protocol,
    };
    let both = targets.nyala.is_some() && targets.postgres.is_some();
    let duration = Duration::from_secs(args.seconds);

    println!(
        "Serving benchmark: {} rows of {FIELDS} fields x {FIELD_BYTES} B, {} clients, {} s per workload, {} calls per latency test",
        args.rows, args.threads, args.seconds, args.iterations
    );
    let mut systems = serde_json::Map::new();
    if let Some(target) = &targets.nyala {
        let described = match targets.protocol {
            Protocol::Flight => Nyala::connect(target).await?.describe().await?,
            Protocol::Postgres => NyalaPg::connect(target).await?.describe().await?,
        };
        println!("  nyala     {target}: {described}");
        systems.insert(Nyala::NAME.into(), described.into());
    }
    if let Some(target) = &targets.postgres {
        let mut client = Postgres::connect(target).await?;
        let described = client.describe().await?;
        println!("  postgres  {target}: {described}");
        systems.insert(Postgres::NAME.into(), described.into());
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "  machine   {cpus} CPUs shared by the clients and the servers; load average {} at the start",
        load_average()
    );
    if both {
        println!("  ratio     Nyala / PostgreSQL: above 1 means Nyala takes longer (times, latencies) or does more (rows/s, ops/s)");
    }

    // Load.
    let mut tables = Vec::new();
    let mut table = Table::new(
        &format!(
            "Load: one client, multi-row INSERTs of {LOAD_BATCH} rows, the same SQL text for both"
        ),
        &[("system", 10), ("seconds", 9), ("rows/s", 10)],
    );
    let loads = on_each_system!(targets, load(args.rows));
    let rows_per_second = |l: &LoadResult| args.rows as f64 / l.elapsed.as_secs_f64();
    for (name, l) in loads.each() {
        table.row(vec![
            name.into(),
            format!("{:.3}", l.elapsed.as_secs_f64()),
            count(rows_per_second(l)),
        ]);
    }
    if both {
        table.row(vec![
            "ratio".into(),
            ratio(loads.ratio(|l| Some(l.elapsed.as_secs_f64()))),
            ratio(loads.ratio(|l| Some(rows_per_second(l)))),
        ]);
    }

    tables.push(table);

    // Latency on one connection.
    let mut table = Table::new(
        "Latency: one client, sequential calls (ms); requests = Flight RPCs or PostgreSQL round trips per call",
        &[
            ("test", 34),
            ("system", 8),
            ("p50", 9),
            ("p99", 9),
            ("mean", 9),
            ("requests", 8),
            ("failed", 6),
            ("rows!=1", 7),
        ],
    );
    let mut latency_results = Vec::new();
    for (test, title) in [
        (LatencyTest::SelectOne, "SELECT 1 (plain statement)"),
        (LatencyTest::Lookup, "primary-key lookup (prepared)"),
    ] {
        let pair = on_each_system!(targets, latency(test, args.iterations, args.rows));
        let mut first = true;
        for (name, r) in pair.each() {
            let l = r.outcomes.all();
            table.row(vec![
                if first { title.into() } else { String::new() },
                name.into(),
                ms(l.percentile(0.5)),
                ms(l.percentile(0.99)),
                ms(l.mean()),
                format!("{:.1}", r.requests_per_call),
                r.outcomes.failed.to_string(),
                r.outcomes.not_one_row().to_string(),
            ]);
            first = false;
        }
        let figure = |f: fn(&Latencies) -> Option<Duration>| {
            ratio(pair.ratio(|r| seconds(f(&r.outcomes.all()))))
        };
        if both {
            table.row(vec![
                String::new(),
                "ratio".into(),
                figure(|l| l.percentile(0.5)),
                figure(|l| l.percentile(0.99)),
                figure(Latencies::mean),
            ]);
        }
        latency_results.push(pair);
    }
    tables.push(table);
    for (pair, test) in latency_results.iter().zip(["SELECT 1", "lookup"]) {
        print_errors(test, pair, |r| &r.outcomes);
    }

    // YCSB workloads.
    let mut table = Table::new(
        &format!(
            "YCSB workloads: {} clients, {} s each; keys scrambled zipfian (0.99), D reads the latest; \
             ops/s counts successful operations; latencies in ms",
            args.threads, args.seconds
        ),
        &[
            ("workload", 22),
            ("system", 8),
            ("ops/s", 8),
            ("p50", 8),
            ("p99", 8),
            ("read p50", 8),
            ("read p99", 8),
            ("write p50", 9),
            ("write p99", 9),
            ("req/op", 6),
            ("failed", 6),
            ("reads!=1", 8),
            ("writes!=1", 9),
        ],
    );
    let mut workload_results = Vec::new();
    for (index, workload) in WORKLOADS.into_iter().enumerate() {
        let pair = on_each_system!(
            targets,
            run_workload(workload, index, args.threads, duration, args.rows)
        );
        let mut first = true;
        for (name, r) in pair.each() {
            let all = r.outcomes.all();
            let reads = r.outcomes.read_latencies();
            let writes = r.outcomes.write_latencies();
            let attempted = r.outcomes.succeeded() + r.outcomes.failed;
            table.row(vec![
                if first {
                    workload.name.into()
                } else {
                    String::new()
                },
                name.into(),
                count(r.ops_per_second()),
                ms(all.percentile(0.5)),
                ms(all.percentile(0.99)),
                ms(reads.percentile(0.5)),
                ms(reads.percentile(0.99)),
                ms(writes.percentile(0.5)),
                ms(writes.percentile(0.99)),
                format!("{:.1}", r.requests as f64 / attempted.max(1) as f64),
                r.outcomes.failed.to_string(),
                r.outcomes.reads_not_one_row.to_string(),
                r.outcomes.writes_not_one_row.to_string(),
            ]);
            first = false;
        }
        if both {
            let latency = |which: fn(&Outcomes) -> Latencies, p: f64| {
                ratio(pair.ratio(|r| seconds(which(&r.outcomes).percentile(p))))
            };
            table.row(vec![
                String::new(),
                "ratio".into(),
                ratio(pair.ratio(|r| Some(r.ops_per_second()))),
                latency(Outcomes::all, 0.5),
                latency(Outcomes::all, 0.99),
                latency(Outcomes::read_latencies, 0.5),
                latency(Outcomes::read_latencies, 0.99),
                latency(Outcomes::write_latencies, 0.5),
                latency(Outcomes::write_latencies, 0.99),
            ]);
        }
        workload_results.push((workload, pair));
    }
    tables.push(table);
    for (workload, pair) in &workload_results {
        print_errors(&workload.name[..1], pair, |r| &r.outcomes);
    }
    println!("\nload average {} at the end", load_average());

    // Summary: ratios when both systems ran, else the figures; then the failures and the
    // operations whose row count was not 1, per system.
    let ops = |r: &WorkloadResult| Some(r.ops_per_second());
    let p50 = |r: &LatencyResult| seconds(r.outcomes.all().percentile(0.5));
    let mut summary = Vec::new();
    if both {
        let workloads: Vec<String> = workload_results
            .iter()
            .map(|(w, pair)| format!("{} {}", &w.name[..1], ratio(pair.ratio(ops))))
            .collect();
        summary.push(format!(
            "Nyala/PostgreSQL SELECT 1 p50 {}, lookup p50 {}, ops/s {}",
            ratio(latency_results[0].ratio(p50)),
            ratio(latency_results[1].ratio(p50)),
            workloads.join(" ")
        ));
    } else {
        let (name, select_one) = latency_results[0].each().next().expect("one system ran");
        let workloads: Vec<String> = workload_results
            .iter()
            .filter_map(|(w, pair)| {
                Some(format!("{} {}", &w.name[..1], count(ops(pair.get(name)?)?)))
            })
            .collect();
        summary.push(format!(
            "{name} SELECT 1 p50 {} ms, lookup p50 {} ms, ops/s {}",
            ms(select_one.outcomes.all().percentile(0.5)),
            ms(latency_results[1]
                .get(name)
                .and_then(|r| r.outcomes.all().percentile(0.5))),
            workloads.join(" "),
        ));
    }
    for (name, _) in latency_results[0].each() {
        let outcomes = latency_results
            .iter()
            .filter_map(|pair| pair.get(name).map(|r| &r.outcomes))
            .chain(
                workload_results
                    .iter()
                    .filter_map(|(_, pair)| pair.get(name).map(|r| &r.outcomes)),
            );
        let (failed, not_one) =
            outcomes.fold((0, 0), |(f, n), o| (f + o.failed, n + o.not_one_row()));
        summary.push(format!("{name} {failed} failed, {not_one} row counts != 1"));
    }
    println!("summary: {}", summary.join("; "));
    if let Some(path) = &args.json {
        let report = json_report(&args, systems, &tables, &summary);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

/// The run as `bench/results/*.json` holds it: what ran where, every table as printed, and the
/// summary lines as notes.
fn json_report(
    args: &Args,
    systems: serde_json::Map<String, serde_json::Value>,
    tables: &[Table],
    summary: &[String],
) -> serde_json::Value {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let load: Vec<f64> = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    let memory_gib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let kib: f64 = m.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
        Some((kib / (1024.0 * 1024.0)).round())
    });
    let protocol = match args.nyala_protocol {
        Protocol::Flight => "Arrow Flight SQL (arrow-flight)",
        Protocol::Postgres => "the PostgreSQL protocol (tokio-postgres)",
    };
    let command = args
        .json_command
        .clone()
        .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
    serde_json::json!({
        "benchmark": args.json_name,
        "title": match systems.contains_key(Postgres::NAME) {
            true => format!("Serving: YCSB and latency, Nyala over {protocol} against PostgreSQL"),
            false => format!("Serving: YCSB and latency, Nyala over {protocol}"),
        },
        "command": command,
        "commit": commit,
        "date": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "machine": {
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "memory_gib": memory_gib,
            "load_average": load,
        },
        "baseline": systems.get(Postgres::NAME).cloned(),
        "systems": systems,
        "parameters": {
            "rows": args.rows, "threads": args.threads,
            "seconds": args.seconds, "iterations": args.iterations,
        },
        "tables": tables.iter().map(|t| serde_json::json!({
            "title": t.title, "columns": t.columns, "rows": t.rows,
        })).collect::<Vec<_>>(),
        "notes": summary,
    })
}
