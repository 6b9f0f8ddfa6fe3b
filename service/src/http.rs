//! The HTTP interface of the data listener: the data API (`/v1/check`, `/v1/debit`,
//! `/v1/lease`, `/v1/wait`, `/v1/rules`), health and metrics ([`router`]); and what every
//! listener shares ([`ApiError`], the health and metrics routes). The admin API, on a
//! listener of its own, is [`crate::admin`].
//!
//! Every error is JSON `{"error": "..."}` with a 4xx status that names the client's mistake,
//! or 503 when the store is down; nothing a client sends produces a 500. With a data token
//! set, a data call without it is a 401 that decides nothing.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use sluice_core::lease::wire::LeaseRequest;
use sluice_core::wire::{CheckRequest, SlotsCall, MAX_BATCH_BYTES, MAX_HOLD_MS};

use crate::check::check;
use crate::exchange::LeaseError;
use crate::lease;
use crate::node::Node;
use crate::trace;

/// Largest request body of the data API (a check, a lease exchange).
pub const BODY_LIMIT: usize = 16 * 1024;
/// Largest request body of the admin API (a whole rule set).
pub const ADMIN_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// An error answer: status and message.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

/// The data listener's routes: the data API (behind the data token, when one is set),
/// health and metrics. The admin API is not among them: see [`crate::admin::router`].
pub fn router(node: Arc<Node>) -> Router {
    let data = Router::new()
        .route("/v1/check", post(check_handler))
        .route("/v1/debit", post(debit_handler))
        // A proxy's releases of a tick come in one batch: a larger body than a check's.
        .route(
            "/v1/slots",
            post(slots_handler).layer(DefaultBodyLimit::max(MAX_BATCH_BYTES)),
        )
        .route("/v1/wait", get(wait))
        .route("/v1/lease", post(lease_handler))
        .route("/v1/rules", get(rules_for_proxies));
    common(data, "see /v1/check")
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(node)
}

/// Health, metrics and the JSON fallbacks every listener has.
pub(crate) fn common(routes: Router<Arc<Node>>, hint: &'static str) -> Router<Arc<Node>> {
    routes
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(move || async move {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("no such endpoint on this listener; {hint}"),
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint".into(),
            )
        })
}

/// Proof that a data call carries the node's data token (every call does when none is
/// set): each data handler takes one, so a call without the token is a 401 before anything
/// is read or decided. (An extractor rather than a middleware layer: `from_fn` cost the
/// check path about a tenth of its CPU, measured with scripts/bench-edge.)
struct Authorized;

impl FromRequestParts<Arc<Node>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, node: &Arc<Node>) -> Result<Self, Self::Rejection> {
        let given = parts.headers.get(node.config.token_header.as_str());
        if node.authenticated(given.map(|v| v.as_bytes())) {
            return Ok(Authorized);
        }
        let how = if node.config.token_header.eq_ignore_ascii_case("authorization") {
            "Authorization: Bearer <token>".to_owned()
        } else {
            format!("{}: <token>", node.config.token_header)
        };
        let mut answer = ApiError(
            StatusCode::UNAUTHORIZED,
            format!("missing or wrong credential: send {how}, the token of the node's --data-token-file"),
        )
        .into_response();
        answer
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        Err(answer)
    }
}

/// A check's span, begun from the request's `traceparent` when the node traces
/// ([`crate::trace`]); nothing is read or copied when it does not (axum's `HeaderMap`
/// extractor would copy every header of every check).
struct CheckSpan(Option<opentelemetry::Context>);

impl FromRequestParts<Arc<Node>> for CheckSpan {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, node: &Arc<Node>) -> Result<Self, Self::Rejection> {
        let traces = &node.config.traces;
        Ok(CheckSpan(
            traces
                .on()
                .then(|| traces.start("http", &trace::HttpHeaders(&parts.headers)))
                .flatten(),
        ))
    }
}

/// Whether a check asks for the brief answer, RFC 7240's `Prefer: return=minimal` (the
/// filter does: it reads no rule's own result, and the per-rule list was most of the answer
/// it parsed on every check). The brief answer's `rules` list is empty; every other field
/// is there. A client that does not ask gets the whole answer.
struct ReturnMinimal(bool);

impl FromRequestParts<Arc<Node>> for ReturnMinimal {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &Arc<Node>) -> Result<Self, Self::Rejection> {
        let asked = parts.headers.get_all("prefer").iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',').any(|p| {
                    let preference = p.split(';').next().unwrap_or_default();
                    let (name, value) = preference.split_once('=').unwrap_or((preference, ""));
                    name.trim().eq_ignore_ascii_case("return") && value.trim().eq_ignore_ascii_case("minimal")
                })
            })
        });
        Ok(ReturnMinimal(asked))
    }
}

/// A 200 answer of JSON written by a wire type's own codec (`sluice_core::json`).
pub(crate) fn json_body(json: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

pub(crate) fn body(result: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    result.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body larger than {BODY_LIMIT} bytes (POST /v1/slots takes up to {MAX_BATCH_BYTES}, the admin API \
                 up to {ADMIN_BODY_LIMIT})"
            ),
        ),
        status => ApiError(status, format!("cannot read request body: {e}")),
    })
}

async fn check_handler(
    State(node): State<Arc<Node>>,
    _: Authorized,
    CheckSpan(span): CheckSpan,
    ReturnMinimal(minimal): ReturnMinimal,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let raw = match body(raw) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match CheckRequest::from_json(&raw) {
        Ok(req) => {
            let req = crate::check::canonical(req, node.config.ipv6_prefix);
            let mut answer = trace::within(span.as_ref(), check(&node, &req)).await;
            trace::finish(span, answer.policy.as_deref(), answer.allowed);
            if !minimal {
                return json_body(answer.to_json());
            }
            answer.rules.clear();
            let mut brief = json_body(answer.to_json());
            brief.headers_mut().insert(
                header::HeaderName::from_static("preference-applied"),
                header::HeaderValue::from_static("return=minimal"),
            );
            brief
        }
        Err(e) => bad(e.0).into_response(),
    }
}

/// `POST /v1/debit`: spends a cost learnt after the response (see [`crate::quota::debit`]);
/// the body is a check's, its `cost` at least 1. 503 when the store cannot answer: nothing
/// was spent.
async fn debit_handler(State(node): State<Arc<Node>>, _: Authorized, raw: Result<Bytes, BytesRejection>) -> Response {
    let raw = match body(raw) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let req = match CheckRequest::from_json(&raw) {
        Ok(req) if req.cost == 0 => {
            return bad("a debit of cost 0 spends nothing: send the cost to spend, 1 or more").into_response()
        }
        Ok(req) => crate::check::canonical(req, node.config.ipv6_prefix),
        Err(e) => return bad(e.0).into_response(),
    };
    match crate::quota::debit(&node, &req).await {
        Ok(answer) => json_body(answer.to_json()),
        Err(e) => ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("nothing spent: {e}")).into_response(),
    }
}

/// `POST /v1/slots`: a request's concurrency slots given back or renewed, or a batch of
/// requests' (see [`crate::slots`]). 503 when the store cannot answer: those slots stay as
/// they were, and expire unless renewed.
async fn slots_handler(State(node): State<Arc<Node>>, _: Authorized, raw: Result<Bytes, BytesRejection>) -> Response {
    let raw = match body(raw) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let call = match SlotsCall::from_json(&raw) {
        Ok(call) => call,
        Err(e) => return bad(e.0).into_response(),
    };
    match crate::slots::call(&node, call).await {
        Ok(answer) => json_body(answer),
        Err(e) => ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("slots unchanged: {e}")).into_response(),
    }
}

/// `GET /v1/rules`: the rules in force without overrides, as JSON (`RuleSet::from_json`
/// reads it), for proxies that match requests to leased rules themselves; `ETag` is the
/// rules' version, and `If-None-Match` with it answers 304.
async fn rules_for_proxies(State(node): State<Arc<Node>>, _: Authorized, headers: HeaderMap) -> Response {
    let (rules, version) = node.rules_in_force();
    let etag = format!("\"{version}\"");
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::ETAG, etag),
        ],
        rules.rules_json(),
    )
        .into_response()
}

/// `POST /v1/lease`: leases granted and given back (see [`crate::lease`]); 400 for a rule
/// that is not leased, 503 when the store cannot answer (the proxy then checks exactly).
async fn lease_handler(State(node): State<Arc<Node>>, _: Authorized, raw: Result<Bytes, BytesRejection>) -> Response {
    let raw = match body(raw) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let req = match LeaseRequest::from_json(&raw) {
        Ok(req) => req,
        Err(e) => return bad(e.0).into_response(),
    };
    match lease::lease(&node, &req).await {
        Ok(answer) => json_body(answer.to_json()),
        Err(e @ LeaseError::NotLeased(_)) => bad(e.to_string()).into_response(),
        Err(e @ LeaseError::Store(_)) => ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// `GET /v1/wait?ms=N`: answers after `N` milliseconds. A filter that got `delay_ms` from a
/// check holds its request on this call: proxy-wasm hosts can resume a stream from a call's
/// answer, but not all of them from a timer (ngx_wasm_module cannot).
async fn wait(
    State(node): State<Arc<Node>>,
    _: Authorized,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let ms = match q.get("ms") {
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| bad(format!("ms {v:?} is not a whole number of milliseconds")))?,
        None => return Err(bad("ms is missing: /v1/wait?ms=N holds the answer N milliseconds")),
    };
    if ms > MAX_HOLD_MS {
        return Err(bad(format!("ms {ms} is longer than the longest wait, {MAX_HOLD_MS}")));
    }
    let Ok(_held) = node.waits.clone().try_acquire_owned() else {
        node.metrics.wait_refused();
        return Err(ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "this node holds {} waits already (--max-waits); forward the request now",
                node.config.max_waits
            ),
        ));
    };
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    Ok(Json(json!({ "waited_ms": ms })).into_response())
}

async fn readyz(State(node): State<Arc<Node>>) -> Response {
    let ping = tokio::time::timeout(node.config.store_timeout * 4, node.store.ping()).await;
    let breaker = node.breaker.state().name();
    let kind = node.store.kind();
    match ping {
        Ok(Ok(())) => Json(json!({"store": kind, "status": "ok", "breaker": breaker})).into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"store": kind, "status": "unreachable", "breaker": breaker, "error": e.to_string()})),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"store": kind, "status": "unreachable", "breaker": breaker, "error": "ping timed out"})),
        )
            .into_response(),
    }
}

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    node.metrics.fallback_keys(node.fallback.len());
    let text = node.metrics.render();
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}
