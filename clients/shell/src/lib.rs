//! `nyala sql`: run SQL scripts or an interactive shell against a Nyala database.
//!
//! The shell knows nothing of the server: it talks to a [`Connection`], either Flight SQL
//! ([`FlightSqlConnection`]) or an embedded database supplied by the `nyala` binary.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::util::pretty::pretty_format_batches;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use tonic::transport::Channel;

#[async_trait::async_trait]
pub trait Connection: Send + Sync {
    /// Runs one statement and returns its whole result.
    async fn execute(&self, sql: &str) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)>;
}

/// A connection to a Nyala server over Arrow Flight SQL.
pub struct FlightSqlConnection {
    client: tokio::sync::Mutex<FlightSqlServiceClient<Channel>>,
}

impl FlightSqlConnection {
    /// Connects to `url`, e.g. `grpc://127.0.0.1:50051`.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let endpoint = url.replacen("grpc://", "http://", 1).replacen("grpc+tcp://", "http://", 1);
        let channel = Channel::from_shared(endpoint.clone())
            .with_context(|| format!("invalid address {url}"))?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        Ok(Self { client: tokio::sync::Mutex::new(FlightSqlServiceClient::new(channel)) })
    }
}

#[async_trait::async_trait]
impl Connection for FlightSqlConnection {
    async fn execute(&self, sql: &str) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)> {
        let mut client = self.client.lock().await;
        let info = client.execute(sql.to_string(), None).await.map_err(flight_error)?;
        let schema = std::sync::Arc::new(info.clone().try_decode_schema()?);
        let mut batches = Vec::new();
        for endpoint in info.endpoint {
            let Some(ticket) = endpoint.ticket else { continue };
            let stream = client.do_get(ticket).await.map_err(flight_error)?;
            batches.extend(stream.try_collect::<Vec<_>>().await.map_err(|e| anyhow::anyhow!(clean(&e.to_string())))?);
        }
        Ok((schema, batches))
    }
}

fn flight_error(e: arrow_flight::error::FlightError) -> anyhow::Error {
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

/// Formats a statement result as the shell prints it.
pub fn format_result(schema: &SchemaRef, batches: &[RecordBatch]) -> anyhow::Result<String> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if schema.fields().len() == 1 && schema.field(0).name() == "count" && schema.field(0).data_type() == &DataType::UInt64 {
        let count = batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .and_then(|b| b.column(0).as_any().downcast_ref::<arrow::array::UInt64Array>().map(|a| a.value(0)))
            .unwrap_or(0);
        return Ok(format!("OK, {count} rows"));
    }
    let table = if batches.is_empty() {
        pretty_format_batches(&[RecordBatch::new_empty(schema.clone())])?.to_string()
    } else {
        pretty_format_batches(batches)?.to_string()
    };
    Ok(format!("{table}\n({rows} row{})", if rows == 1 { "" } else { "s" }))
}

/// Runs every statement of `script`, printing results to `out`; stops at the first error.
pub async fn run_script(conn: &dyn Connection, script: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    for statement in split_statements(script) {
        let (schema, batches) = conn.execute(&statement).await?;
        writeln!(out, "{}", format_result(&schema, &batches)?)?;
    }
    Ok(())
}

/// The interactive shell: multi-line statements ended by `;`, `\d`, `\d table`, `\timing`, `\q`.
pub async fn run_interactive(conn: &dyn Connection) -> anyhow::Result<()> {
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".nyala_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    println!("Nyala SQL shell. End statements with ';'. \\d lists tables, \\q quits.");
    let mut buffer = String::new();
    let mut timing = false;
    loop {
        let prompt = if buffer.is_empty() { "nyala> " } else { "   ...> " };
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
        if buffer.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            let mut words = trimmed.split_whitespace();
            let statement = match (words.next(), words.next()) {
                (Some("\\q"), _) => break,
                (Some("\\timing"), _) => {
                    timing = !timing;
                    println!("Timing is {}.", if timing { "on" } else { "off" });
                    continue;
                }
                (Some("\\d"), None) => "SHOW TABLES".to_string(),
                (Some("\\d"), Some(table)) => format!("DESCRIBE {table}"),
                _ => {
                    println!("unknown command {trimmed}");
                    continue;
                }
            };
            run_one(conn, &statement, timing).await;
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !trimmed.ends_with(';') {
            continue;
        }
        let _ = editor.add_history_entry(buffer.trim());
        for statement in split_statements(&buffer) {
            run_one(conn, &statement, timing).await;
        }
        buffer.clear();
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

async fn run_one(conn: &dyn Connection, statement: &str, timing: bool) {
    let start = Instant::now();
    match conn.execute(statement).await.and_then(|(s, b)| format_result(&s, &b)) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("Error: {e:#}"),
    }
    if timing {
        println!("Time: {:.3} ms", start.elapsed().as_secs_f64() * 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_and_comments() {
        let parts = split_statements("SELECT ';'; -- x; y\nSELECT 2;;  ");
        assert_eq!(parts, vec!["SELECT ';'".to_string(), "SELECT 2".to_string()]);
    }
}
