//! Which workers a coordinator has and how it reaches them: every live tablet server is a
//! worker, its worker service mounted on its internal RPC server, so a worker is reached as
//! every internal call is, with the cluster secret.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result};
use datafusion_distributed::grpc::{create_worker_client, BoxCloneSyncChannel};
use datafusion_distributed::{ChannelResolver, WorkerChannel, WorkerResolver};
use http_body_util::BodyExt;
use nyala_engine::Client;
use parking_lot::Mutex;
use tonic::body::Body;
use url::Url;

/// The cluster's live tablet servers, as the client last heard from them.
pub(crate) struct TabletServerWorkers {
    pub(crate) client: Client,
}

impl WorkerResolver for TabletServerWorkers {
    fn get_urls(&self) -> Result<Vec<Url>> {
        (self.client.tablet_servers().iter())
            .map(|address| worker_url(address))
            .collect()
    }
}

/// The URL of the worker on the tablet server whose internal RPC listens at `address`.
pub(crate) fn worker_url(address: &str) -> Result<Url> {
    Url::parse(&format!("http://{address}"))
        .map_err(|e| DataFusionError::Plan(format!("tablet server address {address}: {e}")))
}

/// Connections to workers, one kept per worker (it connects again by itself after a failure),
/// each call carrying the cluster secret.
#[derive(Clone, Default)]
pub(crate) struct ClusterChannels {
    channels: Arc<Mutex<HashMap<Url, BoxCloneSyncChannel>>>,
}

impl ClusterChannels {
    fn channel(&self, url: &Url) -> Result<BoxCloneSyncChannel> {
        if let Some(channel) = self.channels.lock().get(url) {
            return Ok(channel.clone());
        }
        let address = match (url.host_str(), url.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            _ => return Err(DataFusionError::Plan(format!("bad worker URL {url}"))),
        };
        let endpoint = nyala_engine::rpc::stream_endpoint(&address)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let with_secret = tower::ServiceBuilder::new()
            .map_request(|mut request: http::Request<Body>| {
                nyala_engine::rpc::insert_cluster_secret(request.headers_mut());
                request
            })
            .map_result(move |result| Ok(naming_the_server(&address, result)))
            .service(endpoint.connect_lazy());
        let channel = BoxCloneSyncChannel::new(with_secret);
        self.channels.lock().insert(url.clone(), channel.clone());
        Ok(channel)
    }
}

/// A worker's answer, in which a failure to reach the worker, or a stream from it that
/// breaks, is a retryable UNAVAILABLE status that names the server (the transport's own errors
/// say neither).
fn naming_the_server(
    address: &str,
    result: Result<http::Response<Body>, tonic::transport::Error>,
) -> http::Response<Body> {
    let unavailable = |e: &dyn std::fmt::Display| {
        tonic::Status::unavailable(format!(
            "tablet server {address}, which runs part of the query, is unreachable: {e}"
        ))
    };
    match result {
        Ok(response) => {
            let address = address.to_string();
            response.map(|body| {
                Body::new(body.map_err(move |e| {
                    tonic::Status::unavailable(format!(
                        "tablet server {address}, which runs part of the query, stopped \
                         answering: {}",
                        e.message()
                    ))
                }))
            })
        }
        Err(e) => unavailable(&e).into_http(),
    }
}

#[async_trait]
impl ChannelResolver for ClusterChannels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>> {
        self.channel(url).map(create_worker_client)
    }
}
