//! The HTTP side of every `nyala` process (Kudu's embedded web server), on `--http-addr`:
//!
//! - `/metrics`: the process's metrics in the Prometheus (OpenMetrics) text format.
//! - Server-rendered pages ([`pages`], no JavaScript): the tables with their tablets and sizes
//!   (`/`, `/tables/{name}`), or on a tablet server without SQL its replicas; the maintenance
//!   manager (`/maintenance`); running and recent statements, with a cancel button
//!   (`/statements`); on a master the cluster's tablet servers (`/cluster`).
//!
//! A process shows what it has ([`WebState`]): `serve` all but the cluster, a master the
//! tables and the cluster, a tablet server its replicas and maintenance. Pages read live state
//! (tablets' locks), so they are rendered on tokio's blocking pool.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::Markup;
use nyala_engine::master::{Master, TServerRegistry};
use nyala_engine::tserver::TabletServer;
use nyala_sql::Database;
use prometheus_client::registry::Registry;

use crate::activity::Activity;

pub mod pages;

/// What a process shows on its web pages.
pub struct WebState {
    /// `serve`, `master` or `tserver`, shown in every page's title.
    pub role: &'static str,
    pub metrics: Registry,
    /// The SQL database the process serves (its tables).
    pub db: Option<Arc<Database>>,
    /// The tablet server in this process.
    pub tablet_server: Option<Arc<TabletServer>>,
    /// The master in this process, and its registry of tablet servers.
    pub master: Option<(Arc<Master>, Arc<TServerRegistry>)>,
    /// The statements clients run here.
    pub activity: Option<Arc<Activity>>,
}

/// The content type of the OpenMetrics text format, which Prometheus scrapes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the web pages and `/metrics` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: WebState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, router(Arc::new(state)))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

fn router(state: Arc<WebState>) -> Router {
    Router::new()
        .route("/", get(home))
        .route("/metrics", get(metrics))
        .route("/tables/{name}", get(table))
        .route("/maintenance", get(maintenance))
        .route("/statements", get(statements))
        .route("/statements/{id}/cancel", post(cancel))
        .route("/cluster", get(cluster))
        .fallback(not_found)
        .with_state(state)
}

/// Renders a page on the blocking pool (it reads tablets' state under their locks).
async fn render(
    state: Arc<WebState>,
    page: impl FnOnce(&WebState) -> Result<Markup, pages::PageError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || page(&state)).await {
        Ok(Ok(markup)) => markup.into_response(),
        Ok(Err(pages::PageError::NotFound(what))) => {
            (StatusCode::NOT_FOUND, pages::not_found(&what)).into_response()
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the page failed: {e}"),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<Arc<WebState>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.metrics) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the metrics failed: {e}"),
        )
            .into_response(),
    }
}

async fn home(State(state): State<Arc<WebState>>) -> Response {
    render(state, pages::home).await
}

async fn table(State(state): State<Arc<WebState>>, Path(name): Path<String>) -> Response {
    render(state, move |s| pages::table(s, &name)).await
}

async fn maintenance(State(state): State<Arc<WebState>>) -> Response {
    render(state, pages::maintenance).await
}

async fn statements(State(state): State<Arc<WebState>>) -> Response {
    render(state, pages::statements).await
}

async fn cluster(State(state): State<Arc<WebState>>) -> Response {
    render(state, pages::cluster).await
}

/// Cancels a running statement, then shows the statements again.
async fn cancel(State(state): State<Arc<WebState>>, Path(id): Path<u64>) -> Response {
    match state.activity.as_ref().is_some_and(|a| a.cancel(id)) {
        true => Redirect::to("/statements").into_response(),
        false => (
            StatusCode::NOT_FOUND,
            pages::not_found(&format!("running statement {id}")),
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, pages::not_found("this page")).into_response()
}
