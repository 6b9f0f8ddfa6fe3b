//! Calls a module dispatches, made over real HTTP: kept-alive HTTP/1.1 connections per
//! endpoint, as Envoy's cluster connection pools.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::{CallResponse, PendingCall};

/// A call to make: the module's request and, for Envoy, its cluster's endpoints in the
/// order to try them (`None`: an ngx_wasm_module `host:port`, resolved for the call, or
/// `unix:PATH`).
pub struct Call {
    pub call: PendingCall,
    pub endpoints: Option<Vec<SocketAddr>>,
}

/// How a call ended.
pub enum Ended {
    /// The endpoint answered.
    Answered(CallResponse),
    /// No endpoint took the connection: the host's own answer to the module (Envoy's 503).
    Unreached(CallResponse),
    /// It failed or timed out without an answer.
    Failed,
}

/// The client for dispatched calls.
pub type CallClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn call_client() -> CallClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Makes `call` within its timeout.
pub async fn make(client: &CallClient, call: Call) -> Ended {
    let Call { call, endpoints } = call;
    let timeout = Duration::from_millis(u64::from(call.timeout_ms));
    let call_out = async {
        let endpoints = match endpoints {
            Some(endpoints) => endpoints,
            None => match call.upstream.strip_prefix("unix:") {
                Some(path) => {
                    return over_unix_socket(path, &call.headers, call.body)
                        .await
                        .map_or(Ended::Failed, Ended::Answered)
                }
                None => resolve(&call.upstream).await,
            },
        };
        perform(client, &endpoints, &call.headers, call.body).await
    };
    tokio::time::timeout(timeout, call_out).await.unwrap_or(Ended::Failed)
}

/// One call to the first endpoint (pooled connections are reused), as Envoy makes a
/// module's call: no retry on another endpoint; an endpoint that refuses the connection is
/// answered as Envoy answers it, 503 with its text. `None` on any other failure.
async fn perform(client: &CallClient, endpoints: &[SocketAddr], headers: &[(String, String)], body: Vec<u8>) -> Ended {
    let body = Bytes::from(body);
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map_or("/", |(_, v)| v.as_str());
    if let Some(addr) = endpoints.first() {
        let mut builder = Request::builder().uri(format!("http://{addr}{path}"));
        for (k, v) in headers {
            builder = match k.as_str() {
                ":method" => builder.method(v.as_str()),
                ":path" => builder,
                ":authority" => builder.header("host", v.as_str()),
                _ => builder.header(k.as_str(), v.as_str()),
            };
        }
        let Ok(request) = builder.body(Full::new(body.clone())) else {
            return Ended::Failed;
        };
        let resp = match client.request(request).await {
            Ok(resp) => resp,
            Err(e) if e.is_connect() => {
                tracing::debug!(%addr, "endpoint refused the call's connection: {e}");
                return Ended::Unreached(connect_failure());
            }
            Err(e) => {
                tracing::debug!(%addr, "call failed: {e}");
                return Ended::Failed;
            }
        };
        return answer(resp).await.map_or(Ended::Failed, Ended::Answered);
    }
    Ended::Failed
}

/// What Envoy hands a module whose call found no connection (Envoy 1.40).
fn connect_failure() -> CallResponse {
    let body = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
    CallResponse {
        headers: vec![
            (":status".into(), "503".into()),
            ("content-type".into(), "text/plain".into()),
            ("content-length".into(), body.len().to_string()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// A call to an ngx_wasm_module `unix:PATH` upstream, as the module makes it: a new
/// connection, `Connection: close`, closed once answered.
async fn over_unix_socket(path: &str, headers: &[(String, String)], body: Vec<u8>) -> Option<CallResponse> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| tracing::debug!(%path, "cannot connect to the call's socket: {e}"))
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    let mut builder = Request::builder().header("connection", "close");
    for (k, v) in headers {
        builder = match k.as_str() {
            ":method" => builder.method(v.as_str()),
            ":path" => builder.uri(v.as_str()),
            ":authority" => builder.header("host", v.as_str()),
            _ => builder.header(k.as_str(), v.as_str()),
        };
    }
    let request = builder.body(Full::new(Bytes::from(body))).ok()?;
    let resp = sender.send_request(request).await.ok()?;
    answer(resp).await
}

/// A call's answer as the module reads it.
async fn answer(resp: hyper::Response<hyper::body::Incoming>) -> Option<CallResponse> {
    let mut out = vec![(":status".to_owned(), resp.status().as_u16().to_string())];
    for (k, v) in resp.headers() {
        out.push((k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()));
    }
    let body = resp.into_body().collect().await.ok()?.to_bytes().to_vec();
    Some(CallResponse { headers: out, body })
}

/// An ngx_wasm_module upstream, `host[:port]` (port 80 when none is given), resolved as
/// Nginx does for each call; a name that does not resolve fails the call.
async fn resolve(upstream: &str) -> Vec<SocketAddr> {
    let has_port = match upstream.strip_prefix('[') {
        Some(rest) => rest.contains("]:"),
        None => upstream.contains(':'),
    };
    let target = if has_port {
        upstream.to_owned()
    } else {
        format!("{upstream}:80")
    };
    let resolved = tokio::net::lookup_host(target.as_str()).await;
    match resolved {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            tracing::debug!(%upstream, "cannot resolve the call's upstream: {e}");
            Vec::new()
        }
    }
}
