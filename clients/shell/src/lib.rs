//! `nyala sql`: run SQL scripts or an interactive shell against a Nyala database.
//!
//! The shell knows nothing of the server: it talks to a [`Connection`], either Flight SQL
//! ([`FlightSqlConnection`]) or an embedded database supplied by the `nyala` binary. A
//! statement that runs longer than a second shows a progress line, and the interactive shell
//! prints each statement's time.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandStatementIngest, TableDefinitionOptions, TableExistsOption, TableNotExistOption,
};
use futures::stream::BoxStream;
use futures::TryStreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use tonic::transport::Channel;

pub mod copy;
mod format;

pub use format::{format_result, OutputMode};

#[async_trait::async_trait]
pub trait Connection: Send + Sync {
    /// Runs one statement and returns its whole result.
    async fn execute(&self, sql: &str) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)>;

    /// Appends `batches` (of `schema`) to an existing table; returns the rows loaded.
    async fn ingest(
        &self,
        table: &str,
        schema: SchemaRef,
        batches: BoxStream<'static, anyhow::Result<RecordBatch>>,
    ) -> anyhow::Result<u64>;
}

/// A connection to a Nyala server over Arrow Flight SQL.
pub struct FlightSqlConnection {
    client: tokio::sync::Mutex<FlightSqlServiceClient<Channel>>,
}

impl FlightSqlConnection {
    /// Connects to `url`, e.g. `grpc://127.0.0.1:50051`, authenticating if `credentials` are
    /// given as (user, password).
    /// `url`: `grpc://`, `grpc+tcp://` or `grpc+tls://` (TLS, trusting the system's roots and
    /// `tls_ca`, a PEM file, if given).
    pub async fn connect(
        url: &str,
        credentials: Option<(&str, &str)>,
        tls_ca: Option<&std::path::Path>,
    ) -> anyhow::Result<Self> {
        let endpoint = url
            .replacen("grpc://", "http://", 1)
            .replacen("grpc+tcp://", "http://", 1)
            .replacen("grpc+tls://", "https://", 1);
        let mut channel = Channel::from_shared(endpoint.clone())
            .with_context(|| format!("invalid address {url}"))?;
        if endpoint.starts_with("https://") {
            let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
            if let Some(ca) = tls_ca {
                let pem =
                    std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            channel = channel.tls_config(tls)?;
        }
        let channel = channel
            .tcp_nodelay(true)
            .tcp_keepalive(Some(std::time::Duration::from_secs(60)))
            .connect()
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        let mut client = FlightSqlServiceClient::new(channel);
        if let Some((user, password)) = credentials {
            client
                .handshake(user, password)
                .await
                .map_err(flight_error)
                .context("authentication failed")?;
        }
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
        })
    }
}

impl FlightSqlConnection {
    /// Runs one statement, handing each batch of its result to `each` as it arrives (a
    /// long statement's progress); returns the result's schema.
    pub async fn execute_each(
        &self,
        sql: &str,
        each: &mut (dyn FnMut(RecordBatch) + Send),
    ) -> anyhow::Result<SchemaRef> {
        let mut client = self.client.lock().await;
        let info = client
            .execute(sql.to_string(), None)
            .await
            .map_err(flight_error)?;
        let schema = std::sync::Arc::new(info.clone().try_decode_schema()?);
        for endpoint in info.endpoint {
            let Some(ticket) = endpoint.ticket else {
                continue;
            };
            let mut stream = client.do_get(ticket).await.map_err(flight_error)?;
            while let Some(batch) = stream.try_next().await.map_err(flight_error)? {
                each(batch);
            }
        }
        Ok(schema)
    }
}

#[async_trait::async_trait]
impl Connection for FlightSqlConnection {
    async fn execute(&self, sql: &str) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)> {
        let mut batches = Vec::new();
        let schema = self.execute_each(sql, &mut |b| batches.push(b)).await?;
        Ok((schema, batches))
    }

    async fn ingest(
        &self,
        table: &str,
        _schema: SchemaRef,
        batches: BoxStream<'static, anyhow::Result<RecordBatch>>,
    ) -> anyhow::Result<u64> {
        let command = CommandStatementIngest {
            table_definition_options: Some(TableDefinitionOptions {
                if_not_exist: TableNotExistOption::Fail as i32,
                if_exists: TableExistsOption::Append as i32,
            }),
            table: table.to_string(),
            ..Default::default()
        };
        let batches = batches.map_err(|e| FlightError::ExternalError(e.into()));
        let mut client = self.client.lock().await;
        let loaded = client
            .execute_ingest(command, batches)
            .await
            .map_err(flight_error)?;
        Ok(loaded.max(0) as u64)
    }
}

fn flight_error(e: FlightError) -> anyhow::Error {
    anyhow::anyhow!(clean(&e.to_string()))
}

/// Strips transport wrapping from a server error so the user sees the server's message.
fn clean(message: &str) -> String {
    match message.find("message: \"") {
        Some(start) => {
            let rest = &message[start + 10..];
            let end = rest.find("\", details").unwrap_or(rest.len());
            rest[..end].replace("\\\"", "\"").replace("\\n", "\n")
        }
        None => message.to_string(),
    }
}

/// Splits a script at `;` outside quotes and comments; empty statements are dropped.
pub fn split_statements(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = script.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                current.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    current.push(c);
                }
                '-' if chars.peek() == Some(&'-') => {
                    for c in chars.by_ref() {
                        if c == '\n' {
                            current.push('\n');
                            break;
                        }
                    }
                }
                ';' => {
                    if !current.trim().is_empty() {
                        out.push(current.trim().to_string());
                    }
                    current.clear();
                }
                _ => current.push(c),
            },
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// Runs every statement of `script`, and backslash commands on lines of their own between
/// statements, in order, printing results to `out` in `mode`; stops at the first error.
pub async fn run_script(
    conn: &dyn Connection,
    script: &str,
    mode: OutputMode,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut shell = Shell {
        conn,
        mode,
        timing: false,
    };
    let mut sql = String::new();
    // `None` marks the end of the script.
    for line in script.lines().map(Some).chain([None]) {
        let command = line.map(str::trim).filter(|l| l.starts_with('\\'));
        let at_boundary = sql.trim().is_empty() || sql.trim_end().ends_with(';');
        if line.is_none() || (command.is_some() && at_boundary) {
            for statement in split_statements(&std::mem::take(&mut sql)) {
                writeln!(out, "{}", shell.statement(&statement).await?)?;
            }
        }
        match (line, command) {
            (Some(_), Some(command)) if at_boundary => match shell.command(command).await? {
                Some(text) => writeln!(out, "{text}")?,
                None => return Ok(()),
            },
            (Some(line), _) => {
                sql.push_str(line);
                sql.push('\n');
            }
            (None, _) => {}
        }
    }
    Ok(())
}

/// State of one shell: the connection and the settings changed by backslash commands.
struct Shell<'a> {
    conn: &'a dyn Connection,
    mode: OutputMode,
    timing: bool,
}

/// What `\?` prints.
const HELP: &str = "\\d              list tables
\\d TABLE        describe a table
\\mode MODE      output as table, csv, json or line
\\timing         toggle printing the time each statement takes
\\i FILE         run the statements in FILE
\\copy T FROM 'F' load a CSV (with header) or Parquet file into table T
\\q              quit
Statements end with ';'. Ctrl-C cancels the running statement.";

impl Shell<'_> {
    /// Runs one SQL statement and formats its result.
    async fn statement(&self, sql: &str) -> anyhow::Result<String> {
        let start = Instant::now();
        let (schema, batches) = with_progress(self.conn.execute(sql)).await?;
        let mut text = format_result(&schema, &batches, self.mode)?;
        if self.timing {
            text.push_str(&format!(
                "\nTime: {:.3} ms",
                start.elapsed().as_secs_f64() * 1000.0
            ));
        }
        Ok(text)
    }

    /// Runs a backslash command; None for `\q`.
    async fn command(&mut self, line: &str) -> anyhow::Result<Option<String>> {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        let arg = words.next();
        let text = match (name, arg) {
            ("\\q", _) => return Ok(None),
            ("\\?" | "\\h" | "\\help", _) => HELP.to_string(),
            ("\\timing", _) => {
                self.timing = !self.timing;
                format!("Timing is {}.", if self.timing { "on" } else { "off" })
            }
            ("\\mode", None) => format!("Output mode is {:?}.", self.mode).to_lowercase(),
            ("\\mode", Some(mode)) => {
                self.mode = mode.parse()?;
                format!("Output mode is {mode}.")
            }
            ("\\d", None) => self.statement("SHOW TABLES").await?,
            ("\\d", Some(table)) => self.statement(&format!("DESCRIBE {table}")).await?,
            ("\\i", Some(_)) => {
                let path = line[2..].trim();
                let script =
                    std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
                let mut out = Vec::new();
                Box::pin(run_script(self.conn, &script, self.mode, &mut out)).await?;
                String::from_utf8_lossy(&out).trim_end().to_string()
            }
            ("\\copy", _) => copy::run(self.conn, line).await?,
            _ => anyhow::bail!("unknown command {line} (\\? lists the commands)"),
        };
        Ok(Some(text))
    }
}

/// A statement running longer than this gets a progress line (on a terminal).
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Awaits `work`; once it has run for [`PROGRESS_AFTER`], a spinner on stderr says for how
/// long (indicatif draws nothing when stderr is no terminal), cleared when it is done.
async fn with_progress<T>(work: impl std::future::Future<Output = T>) -> T {
    let mut work = std::pin::pin!(work);
    tokio::select! {
        done = &mut work => return done,
        () = tokio::time::sleep(PROGRESS_AFTER) => {}
    }
    let spinner = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} running for {elapsed}") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(100));
    let done = work.await;
    spinner.finish_and_clear();
    done
}

/// The interactive shell: line editing and history, multi-line statements ended by `;`,
/// backslash commands (see `\?`); Ctrl-C cancels the running statement or clears the line.
/// Each statement's time is shown (`\timing` turns it off).
pub async fn run_interactive(conn: &dyn Connection, mode: OutputMode) -> anyhow::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".nyala_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    println!("Nyala SQL shell. End statements with ';'. \\? for help, \\q to quit.");
    let mut shell = Shell {
        conn,
        mode,
        timing: true,
    };
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "nyala> "
        } else {
            "   ...> "
        };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(rustyline::error::ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let trimmed = line.trim();
        let work: Vec<String> = if buffer.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            vec![trimmed.to_string()]
        } else {
            buffer.push_str(&line);
            buffer.push('\n');
            if !trimmed.ends_with(';') {
                continue;
            }
            let _ = editor.add_history_entry(buffer.trim());
            let statements = split_statements(&buffer);
            buffer.clear();
            statements
        };
        for item in work {
            let run = async {
                if item.starts_with('\\') {
                    shell.command(&item).await
                } else {
                    shell.statement(&item).await.map(Some)
                }
            };
            // Dropping the statement's future closes its RPC, which stops it on the server.
            let result = tokio::select! {
                result = run => result,
                _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("cancelled")),
            };
            match result {
                Ok(Some(text)) => println!("{text}"),
                Ok(None) => {
                    save_history(&mut editor, history.as_deref());
                    return Ok(());
                }
                Err(e) => eprintln!("Error: {e:#}"),
            }
        }
        save_history(&mut editor, history.as_deref());
    }
    save_history(&mut editor, history.as_deref());
    Ok(())
}

fn save_history(editor: &mut rustyline::DefaultEditor, history: Option<&std::path::Path>) {
    if let Some(h) = history {
        let _ = editor.save_history(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_and_comments() {
        let parts = split_statements("SELECT ';'; -- x; y\nSELECT 2;;  ");
        assert_eq!(
            parts,
            vec!["SELECT ';'".to_string(), "SELECT 2".to_string()]
        );
    }
}
