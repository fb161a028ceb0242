//! The floor under any Flight SQL server's serving figures on this machine: a server that answers
//! `bench/serving.sh`'s requests (serving_bench's Flight SQL calls) from answers encoded once at
//! its start, doing no database work at all, on the same stack as `nyala serve` (tonic, hyper, h2,
//! arrow-flight's Flight SQL dispatch, TCP_NODELAY). serving_bench's figures against it are what
//! the protocol, the client and the machine cost; the difference to Nyala's is Nyala's own work.
//!
//! ```text
//! flight_sql_floor --listen 127.0.0.1:0     # prints grpc://ADDRESS once it listens
//! serving_bench --nyala grpc://ADDRESS --postgres "..."
//! ```
//!
//! It answers every query with one row of the shape serving_bench expects (`SELECT 1`: one BIGINT;
//! any other query: a key and ten 100-byte strings, YCSB's row), every prepared update with one
//! row changed, a plain INSERT with the number of rows in its VALUES list, and a bulk ingest
//! (`bench/queue_bench.py --connect`) with the rows it decoded. It stores nothing:
//! it is a measuring instrument, not a database.

use std::pin::Pin;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use bytes::Bytes;
use clap::Parser;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status};

#[derive(Parser)]
#[command(about = "A Flight SQL server doing no work: the floor under serving figures")]
struct Args {
    /// Address to listen on (port 0: the OS chooses).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
}

/// The two answers, each as the FlightData messages a DoGet sends (schema, then the batch).
struct Answers {
    one: Vec<FlightData>,
    one_schema: SchemaRef,
    row: Vec<FlightData>,
    row_schema: SchemaRef,
}

/// The statement handles and tickets: which answer a query gets.
const ONE: &[u8] = b"one";
const ROW: &[u8] = b"row";

async fn encode(batch: RecordBatch) -> Result<Vec<FlightData>> {
    let stream = futures::stream::once(async { Ok(batch) });
    let encoded = FlightDataEncoderBuilder::new().build(stream);
    Ok(encoded.try_collect().await?)
}

impl Answers {
    async fn new() -> Result<Self> {
        let one_schema = Arc::new(Schema::new(vec![Field::new("1", DataType::Int64, false)]));
        let one = RecordBatch::try_new(
            one_schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1])) as ArrayRef],
        )?;
        let mut fields = vec![Field::new("ycsb_key", DataType::Utf8, false)];
        let mut columns = vec![Arc::new(StringArray::from(vec!["user1"])) as ArrayRef];
        for i in 0..10 {
            fields.push(Field::new(format!("field{i}"), DataType::Utf8, true));
            columns.push(Arc::new(StringArray::from(vec!["x".repeat(100)])));
        }
        let row_schema = Arc::new(Schema::new(fields));
        let row = RecordBatch::try_new(row_schema.clone(), columns)?;
        Ok(Answers {
            one: encode(one).await?,
            one_schema,
            row: encode(row).await?,
            row_schema,
        })
    }

    fn kind(query: &str) -> &'static [u8] {
        match query.trim().eq_ignore_ascii_case("select 1") {
            true => ONE,
            false => ROW,
        }
    }

    fn schema(&self, kind: &[u8]) -> &SchemaRef {
        match kind {
            ONE => &self.one_schema,
            _ => &self.row_schema,
        }
    }

    fn info(&self, kind: &[u8], descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
        let ticket = TicketStatementQuery {
            statement_handle: Bytes::copy_from_slice(kind),
        };
        let endpoint =
            FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()));
        let info = FlightInfo::new()
            .try_with_schema(self.schema(kind))
            .map_err(|e| Status::internal(e.to_string()))?
            .with_endpoint(endpoint)
            .with_descriptor(descriptor)
            .with_total_records(1);
        Ok(info)
    }
}

#[derive(Clone)]
struct Floor {
    answers: Arc<Answers>,
}

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// Reads a DoPut's messages to their end, as a server must before it answers.
async fn drain(request: Request<PeekableFlightDataStream>) -> Result<(), Status> {
    let mut stream = request.into_inner();
    while let Some(message) = stream.next().await {
        message?;
    }
    Ok(())
}

#[tonic::async_trait]
impl FlightSqlService for Floor {
    type FlightService = Floor;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = self
            .answers
            .info(Answers::kind(&query.query), request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let kind = query.prepared_statement_handle;
        Ok(Response::new(
            self.answers.info(&kind, request.into_inner())?,
        ))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let messages = match &ticket.statement_handle[..] {
            ONE => self.answers.one.clone(),
            _ => self.answers.row.clone(),
        };
        let stream = futures::stream::iter(messages.into_iter().map(Ok));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        drain(request).await?;
        // serving_bench's load sends `INSERT INTO usertable VALUES (...), (...), ...`.
        let rows = match command
            .query
            .trim_start()
            .to_ascii_uppercase()
            .starts_with("INSERT")
        {
            true => command.query.matches("), (").count() as i64 + 1,
            false => 0,
        };
        Ok(rows)
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        drain(request).await?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        drain(request).await?;
        Ok(1)
    }

    /// Bulk ingest (`bench/queue_bench.py`'s producers): decodes the uploaded batches, as any
    /// server must, and answers their row count.
    async fn do_put_statement_ingest(
        &self,
        _command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let messages = request
            .into_inner()
            .map_err(arrow_flight::error::FlightError::from);
        let mut batches = FlightRecordBatchStream::new_from_flight_data(messages);
        let mut rows = 0;
        while let Some(batch) = batches.next().await {
            rows += batch
                .map_err(|e| Status::invalid_argument(e.to_string()))?
                .num_rows() as i64;
        }
        Ok(rows)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let kind = Answers::kind(&query.query);
        let parameters = query.query.matches('$').count();
        let fields: Vec<Field> = (1..=parameters)
            .map(|i| Field::new(format!("${i}"), DataType::Utf8, true))
            .collect();
        let options = arrow::ipc::writer::IpcWriteOptions::default();
        let encode = |schema: &Schema| -> Result<Bytes, Status> {
            let message = arrow_flight::SchemaAsIpc::new(schema, &options);
            let arrow_flight::IpcMessage(bytes) = message
                .try_into()
                .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
            Ok(bytes)
        };
        let dataset = match query
            .query
            .trim_start()
            .to_ascii_uppercase()
            .starts_with("SELECT")
        {
            true => encode(self.answers.schema(kind))?,
            false => Bytes::new(),
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: Bytes::copy_from_slice(kind),
            dataset_schema: dataset,
            parameter_schema: encode(&Schema::new(fields))?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let floor = Floor {
        answers: Arc::new(Answers::new().await?),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    println!("flight_sql_floor listening on grpc://{address}");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|socket| {
        let socket = socket?;
        socket.set_nodelay(true)?;
        Ok::<_, std::io::Error>(socket)
    });
    tonic::transport::Server::builder()
        .add_service(FlightServiceServer::new(floor))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
