//! Internal RPC between Nyala servers (tonic gRPC, prost messages; decision 5).
//!
//! One gRPC service per role, declared in `engine/proto/` and generated at build time by a
//! pure-Rust protobuf compiler (no protoc): the tablet server's ([`proto::tserver`]), the
//! consensus service that carries Raft messages between replicas ([`proto::consensus`]), and the
//! master's ([`proto::master`]). Every method has its own request and response.
//!
//! A failure travels as a gRPC status whose details hold an [`proto::common::ErrorDetail`]:
//! [`to_status`] turns an [`EngineError`] into one, and [`from_status`] gives the caller the
//! same error back (a replica that does not lead its tablet still names the leader it knows),
//! so code above the RPC layer sees the errors it would see in one process.

use std::time::Duration;

use arrow::array::RecordBatch;
use nyala_raft::RaftError;
use nyala_storage::StorageError;
use prost::Message as _;
use tonic::transport::Channel;

use crate::EngineError;

/// The messages and services, as generated from `engine/proto/`.
pub mod proto {
    pub mod common {
        tonic::include_proto!("nyala.common");
    }
    pub mod consensus {
        tonic::include_proto!("nyala.consensus");
    }
    pub mod tserver {
        tonic::include_proto!("nyala.tserver");
    }
    pub mod master {
        tonic::include_proto!("nyala.master");
    }
}

use proto::common::{ErrorCode, ErrorDetail};
use proto::consensus::consensus_service_client::ConsensusServiceClient;
use proto::master::master_service_client::MasterServiceClient;
use proto::tserver::tablet_server_service_client::TabletServerServiceClient;

/// Most bytes of one RPC message (a write batch or a scan result).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// How long an idle internal connection waits before TCP keepalive probes start.
const KEEPALIVE: Duration = Duration::from_secs(60);

/// The connections accepted on an internal RPC listener, with TCP_NODELAY (a small message
/// must not wait for the peer's delayed ACK: Nagle's algorithm adds 40 ms per round trip)
/// and keepalive.
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(KEEPALIVE))
}

/// The header that carries the cluster secret on every internal call.
const CLUSTER_SECRET_HEADER: &str = "x-nyala-cluster-secret";

/// The process's cluster secret, once set: every internal call carries it and every internal
/// service requires it.
static CLUSTER_SECRET: std::sync::OnceLock<tonic::metadata::AsciiMetadataValue> =
    std::sync::OnceLock::new();

/// Shortest cluster secret accepted.
pub const MIN_CLUSTER_SECRET_CHARS: usize = 16;

/// Sets the secret the servers of a cluster share (read from `--cluster-secret-file`): this
/// process sends it on its internal calls and refuses internal calls without it. Once only.
pub fn set_cluster_secret(secret: &str) -> Result<(), EngineError> {
    let secret = secret.trim();
    if secret.len() < MIN_CLUSTER_SECRET_CHARS || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(EngineError::Unsupported(format!(
            "a cluster secret is at least {MIN_CLUSTER_SECRET_CHARS} printable ASCII characters \
             without spaces (e.g. `openssl rand -hex 32`)"
        )));
    }
    let value = secret
        .parse()
        .map_err(|_| EngineError::Unsupported("the cluster secret is not a header value".into()))?;
    CLUSTER_SECRET
        .set(value)
        .map_err(|_| EngineError::Unsupported("the cluster secret is set already".into()))
}

/// Adds the cluster secret to every internal call a client makes.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterCredentials;

impl tonic::service::Interceptor for ClusterCredentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(secret) = CLUSTER_SECRET.get() {
            request
                .metadata_mut()
                .insert(CLUSTER_SECRET_HEADER, secret.clone());
        }
        Ok(request)
    }
}

/// Adds the cluster secret, if one is set, to the headers of an internal call made over a
/// connection of another library's (see [`stream_endpoint`]).
pub fn insert_cluster_secret(headers: &mut http::HeaderMap) {
    if let Some(secret) = CLUSTER_SECRET.get() {
        if let Ok(value) = http::HeaderValue::from_bytes(secret.as_bytes()) {
            headers.insert(CLUSTER_SECRET_HEADER, value);
        }
    }
}

/// A connection to another server's internal RPC, carrying the cluster secret.
pub type RpcChannel = tonic::service::interceptor::InterceptedService<Channel, ClusterCredentials>;

/// Whether `headers` carry the process's cluster secret (always, when none is set); compared
/// in constant time.
fn has_cluster_secret(headers: &http::HeaderMap) -> bool {
    let Some(secret) = CLUSTER_SECRET.get() else {
        return true;
    };
    let given = headers
        .get(CLUSTER_SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let expected = secret.as_bytes();
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// Refuses every internal call that does not carry the cluster secret (a tower layer for the
/// internal services' server).
#[derive(Clone, Copy, Debug, Default)]
pub struct RequireClusterSecret;

impl<S> tower::Layer<S> for RequireClusterSecret {
    type Service = ClusterSecretService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClusterSecretService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterSecretService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for ClusterSecretService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if has_cluster_secret(request.headers()) {
            return Box::pin(self.inner.call(request));
        }
        tracing::warn!(path = %request.uri().path(), "internal call without the cluster secret refused");
        let refused = tonic::Status::unauthenticated(
            "internal RPC needs the cluster secret (--cluster-secret-file)",
        );
        Box::pin(std::future::ready(Ok(refused.into_http())))
    }
}

/// A connection to another server's internal RPC; every service's client shares it.
pub async fn connect(address: &str) -> Result<RpcChannel, EngineError> {
    connect_with_timeout(address, Duration::from_secs(30)).await
}

/// A connection like [`connect`]'s on which a call may take up to `timeout`.
pub async fn connect_with_timeout(
    address: &str,
    timeout: Duration,
) -> Result<RpcChannel, EngineError> {
    connect_endpoint(address, endpoint(address)?.timeout(timeout)).await
}

/// A connection for calls that stay open (streams), with no time limit: instead, the
/// connection closes, and its calls fail, when the other server stops answering HTTP/2 pings
/// for [`STREAM_PING_TIMEOUT`].
pub async fn connect_for_streams(address: &str) -> Result<RpcChannel, EngineError> {
    connect_endpoint(address, stream_endpoint(address)?).await
}

/// How often a stream's connection pings the other server, and how long it waits for the
/// answer.
const STREAM_PING_EVERY: Duration = Duration::from_secs(1);
const STREAM_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The endpoint of the server at `address`'s internal RPC for calls that stay open, as
/// [`connect_for_streams`] makes them (the caller adds the cluster secret to its calls,
/// [`insert_cluster_secret`]).
pub fn stream_endpoint(address: &str) -> Result<tonic::transport::Endpoint, EngineError> {
    Ok(endpoint(address)?
        .http2_keep_alive_interval(STREAM_PING_EVERY)
        .keep_alive_timeout(STREAM_PING_TIMEOUT)
        .keep_alive_while_idle(true))
}

fn endpoint(address: &str) -> Result<tonic::transport::Endpoint, EngineError> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| EngineError::Unsupported(format!("bad address {address}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .tcp_keepalive(Some(KEEPALIVE)),
    )
}

async fn connect_endpoint(
    address: &str,
    endpoint: tonic::transport::Endpoint,
) -> Result<RpcChannel, EngineError> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| EngineError::Unavailable(format!("cannot reach {address}: {e}")))?;
    Ok(RpcChannel::new(channel, ClusterCredentials))
}

/// The tablet-server service over `channel`.
pub fn tserver(channel: RpcChannel) -> TabletServerServiceClient<RpcChannel> {
    TabletServerServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The consensus service over `channel`.
pub fn consensus(channel: RpcChannel) -> ConsensusServiceClient<RpcChannel> {
    ConsensusServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The master service over `channel`.
pub fn master(channel: RpcChannel) -> MasterServiceClient<RpcChannel> {
    MasterServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// The most bytes of a status message (an error's text) a server sends. A status travels in
/// HTTP/2 headers, which clients limit (hyper, hence tonic: 16 KiB; gRPC C++: 8 KiB before it
/// starts refusing), and an error quotes what it is about (a table name, a key, a type URL),
/// which a client can make as long as it likes. Percent-encoded on the wire, a message takes at
/// most three times as many bytes.
pub const MAX_ERROR_BYTES: usize = 1024;

/// `message`, or, when it is longer than [`MAX_ERROR_BYTES`], its start and its end around a
/// note of how many bytes were cut between them (cut on character boundaries), at most
/// MAX_ERROR_BYTES long. Every status a server sends, internal or Flight SQL, is bounded by it.
pub fn bounded_message(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= MAX_ERROR_BYTES {
        return message.into();
    }
    // Room for the note: "… (18446744073709551615 bytes cut) …" is 40 bytes.
    let kept = MAX_ERROR_BYTES - 64;
    let mut head = kept * 3 / 4;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - (kept - head);
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}… ({} bytes cut) …{}",
        &message[..head],
        tail - head,
        &message[tail..]
    )
    .into()
}

/// `e` as a gRPC status. `leader_address` resolves a replica's leader hint to an address.
/// Its message and the subject in its details are bounded ([`bounded_message`]): a table name
/// or a key can be as long as a client made it.
pub fn to_status(e: &EngineError, leader_address: impl Fn(u64) -> Option<String>) -> tonic::Status {
    use tonic::Code;
    let mut detail = ErrorDetail::default();
    let (code, grpc) = match e {
        EngineError::Raft(RaftError::NotLeader { leader_hint }) => {
            let hint = leader_hint.unwrap_or(0);
            detail.leader_hint = hint;
            detail.leader_address = leader_address(hint).unwrap_or_default();
            (ErrorCode::NotLeader, Code::FailedPrecondition)
        }
        EngineError::NotLeaderMaster { leader } => {
            detail.leader_address = leader.clone().unwrap_or_default();
            (ErrorCode::NotLeaderMaster, Code::FailedPrecondition)
        }
        EngineError::TableNotFound(name) => {
            detail.subject = name.clone();
            (ErrorCode::TableNotFound, Code::NotFound)
        }
        EngineError::TableExists(name) => {
            detail.subject = name.clone();
            (ErrorCode::TableExists, Code::AlreadyExists)
        }
        EngineError::TabletNotFound(id) => {
            detail.subject = id.clone();
            (ErrorCode::TabletNotFound, Code::NotFound)
        }
        EngineError::InvalidTable(_) => (ErrorCode::InvalidTable, Code::InvalidArgument),
        EngineError::NoRangePartition(_) => (ErrorCode::NoRangePartition, Code::InvalidArgument),
        EngineError::Unsupported(_) => (ErrorCode::Unsupported, Code::InvalidArgument),
        EngineError::Busy(_) => (ErrorCode::Busy, Code::ResourceExhausted),
        EngineError::Unavailable(_) | EngineError::OutcomeUnknown(_) => {
            (ErrorCode::ServerError, Code::Unavailable)
        }
        EngineError::Storage(StorageError::Locked { key }) => {
            detail.subject = key.clone();
            (ErrorCode::Locked, Code::Aborted)
        }
        EngineError::Storage(StorageError::DuplicateKey { key }) => {
            detail.subject = key.clone();
            (ErrorCode::DuplicateKey, Code::AlreadyExists)
        }
        _ => (ErrorCode::ServerError, Code::Internal),
    };
    detail.code = code as i32;
    detail.subject = bounded_message(&detail.subject).into_owned();
    tonic::Status::with_details(
        grpc,
        bounded_message(&e.to_string()),
        detail.encode_to_vec().into(),
    )
}

/// A status that says a server cannot serve a request of another role.
pub fn wrong_role(what: &str) -> tonic::Status {
    let detail = ErrorDetail {
        code: ErrorCode::WrongRole as i32,
        ..ErrorDetail::default()
    };
    tonic::Status::with_details(
        tonic::Code::Unimplemented,
        format!("this server is not {what}"),
        detail.encode_to_vec().into(),
    )
}

/// The engine error a call's status stands for (see [`to_status`]); a status without
/// details (the server unreachable, a deadline) is [`EngineError::Unavailable`].
pub fn from_status(status: tonic::Status) -> EngineError {
    let message = status.message().to_string();
    if status.details().is_empty() {
        return EngineError::Unavailable(message);
    }
    let Ok(detail) = ErrorDetail::decode(status.details()) else {
        return EngineError::Remote(message);
    };
    match ErrorCode::try_from(detail.code).unwrap_or(ErrorCode::Unspecified) {
        ErrorCode::NotLeader => EngineError::Raft(RaftError::NotLeader {
            leader_hint: (detail.leader_hint != 0).then_some(detail.leader_hint),
        }),
        ErrorCode::NotLeaderMaster => EngineError::NotLeaderMaster {
            leader: (!detail.leader_address.is_empty()).then_some(detail.leader_address),
        },
        ErrorCode::TableNotFound => EngineError::TableNotFound(detail.subject),
        ErrorCode::TableExists => EngineError::TableExists(detail.subject),
        ErrorCode::TabletNotFound => EngineError::TabletNotFound(detail.subject),
        ErrorCode::InvalidTable => {
            EngineError::InvalidTable(strip(&message, "invalid table definition: "))
        }
        ErrorCode::NoRangePartition => EngineError::NoRangePartition(message),
        ErrorCode::Unsupported => EngineError::Unsupported(message),
        ErrorCode::Busy => EngineError::Busy(message),
        ErrorCode::Locked => EngineError::Storage(StorageError::Locked {
            key: detail.subject,
        }),
        ErrorCode::DuplicateKey => EngineError::Storage(StorageError::DuplicateKey {
            key: detail.subject,
        }),
        ErrorCode::Unspecified | ErrorCode::ServerError | ErrorCode::WrongRole => {
            EngineError::Remote(message)
        }
    }
}

fn strip(message: &str, prefix: &str) -> String {
    message.strip_prefix(prefix).unwrap_or(message).to_string()
}

/// Answers a request from a handler's result.
pub fn respond<T>(
    result: Result<T, EngineError>,
    leader_address: impl Fn(u64) -> Option<String>,
) -> Result<tonic::Response<T>, tonic::Status> {
    result
        .map(tonic::Response::new)
        .map_err(|e| to_status(&e, leader_address))
}

/// A blocking handler's result, run on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Unavailable(format!("the request's task failed: {e}")))?
}

/// Rows as one Arrow IPC stream, as scans return them (empty: no rows).
pub fn encode_rows(batches: &[RecordBatch]) -> Result<Vec<u8>, EngineError> {
    let mut ipc = Vec::new();
    if let Some(first) = batches.first() {
        let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut ipc, &first.schema())?;
        for batch in batches {
            writer.write(batch)?;
        }
        writer.finish()?;
    }
    Ok(ipc)
}

/// The rows [`encode_rows`] encoded.
pub fn decode_rows(ipc: prost::bytes::Bytes) -> Result<Vec<RecordBatch>, EngineError> {
    if ipc.is_empty() {
        return Ok(vec![]);
    }
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)?;
    Ok(reader.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_the_wire_with_their_kind() {
        let cases = [
            EngineError::Raft(RaftError::NotLeader {
                leader_hint: Some(3),
            }),
            EngineError::TableNotFound("t".into()),
            EngineError::TabletNotFound("abc".into()),
            EngineError::Busy("memory".into()),
            EngineError::InvalidTable("no key".into()),
            EngineError::NotLeaderMaster {
                leader: Some("h:1".into()),
            },
        ];
        for e in cases {
            let back = from_status(to_status(&e, |_| Some("h:2".into())));
            assert_eq!(back.to_string(), e.to_string());
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&e),
                "{e}"
            );
        }
        let lost = from_status(tonic::Status::unavailable("connection refused"));
        assert!(matches!(lost, EngineError::Unavailable(_)));
    }

    #[test]
    fn bounded_messages_keep_their_start_and_end() {
        assert_eq!(bounded_message("table t not found"), "table t not found");
        for c in ['x', 'é', '€', '😀'] {
            for len in [
                MAX_ERROR_BYTES - 1,
                MAX_ERROR_BYTES,
                MAX_ERROR_BYTES + 1,
                1 << 20,
            ] {
                let message = format!("<{}>", c.to_string().repeat(len / c.len_utf8()));
                let bounded = bounded_message(&message);
                assert!(
                    bounded.len() <= MAX_ERROR_BYTES,
                    "{c} {len}: {}",
                    bounded.len()
                );
                if message.len() <= MAX_ERROR_BYTES {
                    assert_eq!(bounded, message);
                    continue;
                }
                // Start, note, end: together all of the message.
                let (head, rest) = bounded.split_once("… (").expect("a note");
                let (cut, tail) = rest.split_once(" bytes cut) …").expect("a note");
                let cut: usize = cut.parse().unwrap();
                assert_eq!(head.len() + cut + tail.len(), message.len());
                assert!(
                    message.starts_with(head) && head.starts_with('<'),
                    "{c} {len}"
                );
                assert!(message.ends_with(tail) && tail.ends_with('>'), "{c} {len}");
                assert!(
                    head.len() > MAX_ERROR_BYTES / 2,
                    "{c} {len}: {}",
                    head.len()
                );
            }
        }
    }

    /// A table named by a client, a megabyte long, in a status that must fit an HTTP/2 header
    /// block (16 KiB for tonic's clients): cut, and still the error it was.
    #[test]
    fn long_errors_cross_the_wire_bounded() {
        let name = format!("t{}", "é".repeat(1 << 19));
        let status = to_status(&EngineError::TableNotFound(name), |_| None);
        assert!(
            status.message().len() <= MAX_ERROR_BYTES,
            "{}",
            status.message().len()
        );
        assert!(
            status.details().len() <= MAX_ERROR_BYTES + 16,
            "{}",
            status.details().len()
        );
        match from_status(status) {
            EngineError::TableNotFound(subject) => {
                assert!(subject.len() <= MAX_ERROR_BYTES, "{}", subject.len());
                assert!(
                    subject.starts_with("té") && subject.contains("bytes cut"),
                    "{subject}"
                );
            }
            other => panic!("{other}"),
        }
    }
}
