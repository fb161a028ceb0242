//! A sqllogictest driver that talks Arrow Flight SQL to a `nyala serve` process: queries go
//! through `CommandStatementQuery` (every endpoint read), everything else through
//! `CommandStatementUpdate`, and errors come back as the server's message.

use arrow::array::{Array, RecordBatch};
use arrow::datatypes::DataType;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_flight::sql::client::FlightSqlServiceClient;
use async_trait::async_trait;
use futures::TryStreamExt;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use tonic::transport::Channel;

pub struct FlightDb {
    pub client: FlightSqlServiceClient<Channel>,
}

#[derive(Debug)]
pub struct FlightError(String);

impl std::fmt::Display for FlightError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlightError {}

fn failed(e: impl std::fmt::Display) -> FlightError {
    FlightError(e.to_string())
}

/// Whether `sql` returns rows (by its first word, after comments).
fn is_query(sql: &str) -> bool {
    let first = sql
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("--"))
        .unwrap_or("")
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    matches!(
        first.as_str(),
        "SELECT" | "WITH" | "EXPLAIN" | "SHOW" | "DESCRIBE" | "VALUES" | ""
    )
}

fn column_type(data_type: &DataType) -> DefaultColumnType {
    if data_type.is_integer() {
        DefaultColumnType::Integer
    } else if data_type.is_floating() || matches!(data_type, DataType::Decimal128(..)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// Rows as sqllogictest text: NULL as `NULL`, the empty string as `(empty)`.
fn rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, FlightError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        for row in 0..batch.num_rows() {
            let cells = formatters
                .iter()
                .zip(batch.columns())
                .map(|(f, column)| {
                    let text = f.value(row).to_string();
                    if text.is_empty() && column.is_valid(row) {
                        "(empty)".to_string()
                    } else {
                        text
                    }
                })
                .collect();
            rows.push(cells);
        }
    }
    Ok(rows)
}

#[async_trait]
impl AsyncDB for FlightDb {
    type Error = FlightError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, FlightError> {
        if !is_query(sql) {
            let count = self
                .client
                .execute_update(sql.to_string(), None)
                .await
                .map_err(failed)?;
            return Ok(DBOutput::StatementComplete(count.max(0) as u64));
        }
        let info = self
            .client
            .execute(sql.to_string(), None)
            .await
            .map_err(failed)?;
        let schema = info.clone().try_decode_schema().map_err(failed)?;
        let mut batches = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint
                .ticket
                .ok_or_else(|| FlightError("endpoint without a ticket".into()))?;
            let stream = self.client.do_get(ticket).await.map_err(failed)?;
            batches.extend(stream.try_collect::<Vec<_>>().await.map_err(failed)?);
        }
        Ok(DBOutput::Rows {
            types: schema
                .fields()
                .iter()
                .map(|f| column_type(f.data_type()))
                .collect(),
            rows: rows(&batches)?,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "nyala"
    }

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}
