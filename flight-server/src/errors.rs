//! Errors as they leave the server: every gRPC status a Flight SQL client receives says what
//! went wrong in at most [`MAX_ERROR_BYTES`] bytes.
//!
//! A status travels in HTTP/2 headers (those of a response that is only an error, or the
//! trailers that end a stream), which clients limit: hyper's at 16 KiB, gRPC C++ refuses
//! "metadata size exceeds hard limit". An error that quotes what a client sent (a type URL, a
//! name, a statement) would never arrive if the client made it long. The handlers bound the
//! messages they make ([`crate::status`], [`crate::invalid`]), but statuses come from elsewhere
//! too: arrow-flight's dispatch of Flight SQL commands quotes an unknown command's type URL
//! whole, and tonic and the session layer make their own. So the server's outermost layer,
//! [`bound_statuses`], bounds every status on its way out, in headers and in trailers: its
//! message as [`bounded_message`] cuts it, and details longer than [`MAX_ERROR_BYTES`] (opaque
//! bytes, which cannot be cut) are left out.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::Body as _;
use tonic::body::Body;
use tonic::Status;

pub use nyala_engine::rpc::{bounded_message, MAX_ERROR_BYTES};

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";

/// `response` with its status bounded: in its headers now, in its trailers when its stream
/// ends (see the module comment).
pub fn bound_statuses(response: http::Response<Body>) -> http::Response<Body> {
    let (mut parts, body) = response.into_parts();
    bound_status(&mut parts.headers);
    // A response that is only a status has nothing more to bound.
    let body = match body.is_end_stream() {
        true => body,
        false => Body::new(BoundedTrailers(body)),
    };
    http::Response::from_parts(parts, body)
}

/// Bounds the status in `headers` (a response's headers or a stream's trailers), if any.
fn bound_status(headers: &mut HeaderMap) {
    let too_long = |value: Option<&HeaderValue>| value.is_some_and(|v| v.len() > MAX_ERROR_BYTES);
    if too_long(headers.get(GRPC_MESSAGE)) {
        match bounded_message_header(headers) {
            Some(message) => headers.insert(GRPC_MESSAGE, message),
            None => headers.remove(GRPC_MESSAGE),
        };
    }
    if too_long(headers.get(GRPC_STATUS_DETAILS)) {
        headers.remove(GRPC_STATUS_DETAILS);
    }
}

/// The grpc-message header of `headers` decoded (percent-encoded UTF-8), bounded and encoded
/// again, both as tonic does it.
fn bounded_message_header(headers: &HeaderMap) -> Option<HeaderValue> {
    // The code and the message only: tonic reads the details as base64 it trusts.
    let mut status = HeaderMap::new();
    status.insert(GRPC_STATUS, headers.get(GRPC_STATUS)?.clone());
    status.insert(GRPC_MESSAGE, headers.get(GRPC_MESSAGE)?.clone());
    let status = Status::from_header_map(&status)?;
    let mut encoded = HeaderMap::new();
    Status::new(status.code(), bounded_message(status.message()))
        .add_header(&mut encoded)
        .ok()?;
    encoded.remove(GRPC_MESSAGE)
}

/// A response body whose trailers, the status that ends a stream, are bounded.
struct BoundedTrailers(Body);

impl http_body::Body for BoundedTrailers {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let mut polled = Pin::new(&mut self.0).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            if let Some(trailers) = frame.trailers_mut() {
                bound_status(trailers);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use arrow_flight::flight_service_client::FlightServiceClient;
    use arrow_flight::sql::{Any, CommandStatementQuery, ProstMessageExt};
    use arrow_flight::{Action, FlightData, FlightDescriptor, Ticket};
    use http_body::Body as _;
    use prost::Message;
    use tonic::Code;

    use super::*;

    fn status_of(headers: &HeaderMap) -> Status {
        Status::from_header_map(headers).expect("a gRPC status")
    }

    #[test]
    fn a_long_status_in_headers_is_cut() {
        let long = "é".repeat(1 << 19);
        let refused = Status::invalid_argument(format!("unknown thing {long}!"));
        let status = status_of(bound_statuses(refused.into_http()).headers());
        assert_eq!(status.code(), Code::InvalidArgument);
        let message = status.message();
        assert!(message.len() <= MAX_ERROR_BYTES, "{}", message.len());
        assert!(message.starts_with("unknown thing é"), "{message}");
        assert!(
            message.contains("bytes cut") && message.ends_with("é!"),
            "{message}"
        );

        let short = Status::not_found("no such query");
        let status = status_of(bound_statuses(short.into_http()).headers());
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "no such query");
    }

    #[test]
    fn details_too_long_to_cut_are_left_out() {
        let small = Status::with_details(Code::Internal, "m", Bytes::from_static(b"\x08\x01"));
        let status = status_of(bound_statuses(small.into_http()).headers());
        assert_eq!(status.details(), b"\x08\x01");

        let large = Status::with_details(Code::Internal, "m", vec![7u8; 1 << 20].into());
        let status = status_of(bound_statuses(large.into_http()).headers());
        assert!(status.details().is_empty());
        assert_eq!((status.code(), status.message()), (Code::Internal, "m"));
    }

    /// A body that is only trailers: a stream that fails before its first message.
    struct OnlyTrailers(Option<HeaderMap>);

    impl http_body::Body for OnlyTrailers {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.take().map(|t| Ok(http_body::Frame::trailers(t))))
        }
    }

    #[tokio::test]
    async fn a_long_status_in_trailers_is_cut() {
        let mut trailers = HeaderMap::new();
        let failed = Status::resource_exhausted(format!("{} is too much", "x".repeat(1 << 20)));
        failed.add_header(&mut trailers).unwrap();
        let response = http::Response::new(Body::new(OnlyTrailers(Some(trailers))));
        let mut body = bound_statuses(response).into_body();
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .expect("a frame")
            .expect("trailers, not an error");
        let status = status_of(&frame.into_trailers().expect("trailers"));
        assert_eq!(status.code(), Code::ResourceExhausted);
        let message = status.message();
        assert!(message.len() <= MAX_ERROR_BYTES, "{}", message.len());
        assert!(message.ends_with("x is too much"), "{message}");
    }

    fn refused<T>(result: Result<T, Status>) -> Status {
        match result {
            Ok(_) => panic!("accepted"),
            Err(status) => status,
        }
    }

    /// The refusal of a streaming call: before its response, or as its first message.
    async fn refused_stream<T>(
        result: Result<tonic::Response<tonic::Streaming<T>>, Status>,
    ) -> Status {
        match result {
            Err(status) => status,
            Ok(response) => refused(response.into_inner().message().await),
        }
    }

    /// A refusal a client can read that says `what`.
    fn assert_short(status: &Status, what: &str) {
        let message = status.message();
        assert!(message.len() <= MAX_ERROR_BYTES, "{} bytes", message.len());
        assert!(message.contains(what), "{:?}: {message}", status.code());
        assert!(
            matches!(status.code(), Code::InvalidArgument | Code::Unimplemented),
            "{:?}: {message}",
            status.code()
        );
    }

    /// What the fuzzer found: a command whose `Any` carries a megabyte-long type URL got an
    /// error about as long back (arrow-flight quotes the URL), which clients refuse. Through
    /// the whole server, as a client sees it, with other input a client can make as long.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_megabyte_of_client_input_gets_a_short_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = nyala_sql::Database::open(dir.path(), Default::default())
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let options = crate::ServerOptions::default();
        let server = crate::serve(db, listener, None, options, std::future::pending());
        tokio::select! {
            served = server => panic!("the server stopped: {served:?}"),
            () = send_megabytes(address) => {}
        }
    }

    async fn send_megabytes(address: std::net::SocketAddr) {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = FlightServiceClient::new(channel);

        let long_url = format!("type.googleapis.com/{}", "x".repeat(1 << 20));
        let command = Any {
            type_url: long_url,
            value: Bytes::new(),
        }
        .encode_to_vec();
        let descriptor = FlightDescriptor::new_cmd(command.clone());
        let status = refused(client.get_flight_info(descriptor.clone()).await);
        assert_short(&status, "type.googleapis.com/xxx");
        let upload = FlightData {
            flight_descriptor: Some(descriptor),
            ..Default::default()
        };
        let status = refused_stream(client.do_put(futures::stream::iter([upload])).await).await;
        assert_short(&status, "type.googleapis.com/xxx");
        let status = refused_stream(client.do_get(Ticket::new(command)).await).await;
        assert_short(&status, "type.googleapis.com/xxx");

        let action = Action::new("x".repeat(1 << 20), Bytes::new());
        let status = refused_stream(client.do_action(action).await).await;
        assert_short(&status, "unknown action xxx");

        let query = CommandStatementQuery {
            query: format!("SELECT * FROM missing_{}", "x".repeat(1_000_000)),
            ..Default::default()
        };
        let descriptor = FlightDescriptor::new_cmd(query.as_any().encode_to_vec());
        let status = refused(client.get_flight_info(descriptor).await);
        assert_short(&status, "missing_xxx");
    }
}
