//! The HTTP interface: the data API (`/v1/check`, `/v1/lease`, `/v1/wait`, `/v1/rules`),
//! health and metrics on the data listener ([`router`]), and the admin API on a listener of
//! its own ([`admin_router`]).
//!
//! Every error is JSON `{"error": "..."}` with a 4xx status that names the client's mistake,
//! or 503 when the store is down; nothing a client sends produces a 500. With a data token
//! set, a data call without it is a 401 that decides nothing.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use sluice_core::lease::wire::LeaseRequest;
use sluice_core::rules::RuleSet;
use sluice_core::wire::{CheckRequest, MAX_HOLD_MS};

use crate::admin::{self, Access};
use crate::check::check;
use crate::console::SourceKind;
use crate::exchange::LeaseError;
use crate::lease;
use crate::node::Node;
use crate::rules_source;
use crate::store::{Publish, StoreError};

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

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

/// The data listener's routes: the data API (behind the data token, when one is set),
/// health and metrics. The admin API is not among them: see [`admin_router`].
pub fn router(node: Arc<Node>) -> Router {
    let data = Router::new()
        .route("/v1/check", post(check_handler))
        .route("/v1/debit", post(debit_handler))
        .route("/v1/wait", get(wait))
        .route("/v1/lease", post(lease_handler))
        .route("/v1/rules", get(rules_for_proxies));
    common(data, "see /v1/check")
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(node)
}

/// The admin listener's routes (`--admin-listen`): the admin API behind its bearer tokens
/// (the read-only one changes nothing), the console's page, health and metrics; every
/// answer with the console's security headers ([`admin::security_headers`]).
pub fn admin_router(node: Arc<Node>) -> Router {
    // Every admin route behind the token by construction: a layer on the routes, not a call
    // each handler must remember (health, metrics and the page, added after, stay open).
    let admin = Router::new()
        .route("/v1/admin/node", get(admin::node_info))
        .route("/v1/admin/rules", get(get_rules).put(put_rules))
        .route("/v1/admin/rules/status", get(admin::rules_status))
        .route(
            "/v1/admin/overrides",
            get(admin::list_overrides)
                .post(admin::add_override)
                .delete(remove_override),
        )
        .route("/v1/admin/violations", get(violations))
        .route("/v1/admin/top", get(admin::top))
        .route("/v1/admin/explain", post(admin::explain))
        .route("/v1/admin/reset", post(admin::reset))
        .route_layer(middleware::from_fn_with_state(node.clone(), admin_only));
    common(admin.merge(admin::console_files()), "see /v1/admin/rules")
        .layer(DefaultBodyLimit::max(ADMIN_BODY_LIMIT))
        .layer(middleware::map_response(admin::security_headers))
        .with_state(node)
}

/// Health, metrics and the JSON fallbacks every listener has.
fn common(routes: Router<Arc<Node>>, hint: &'static str) -> Router<Arc<Node>> {
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

fn body(result: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    result.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {BODY_LIMIT} bytes (the admin API takes up to {ADMIN_BODY_LIMIT})"),
        ),
        status => ApiError(status, format!("cannot read request body: {e}")),
    })
}

async fn check_handler(State(node): State<Arc<Node>>, _: Authorized, raw: Result<Bytes, BytesRejection>) -> Response {
    let raw = match body(raw) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match CheckRequest::from_json(&raw) {
        Ok(req) => {
            let req = crate::check::canonical(req, node.config.ipv6_prefix);
            Json(check(&node, &req).await).into_response()
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
        Ok(answer) => Json(answer).into_response(),
        Err(e) => ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("nothing spent: {e}")).into_response(),
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
        Ok(answer) => Json(answer).into_response(),
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
    let text = node.metrics.render();
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// Lets a request on to the admin API only with a token: the admin token for anything, the
/// read-only token for reading (and explain, which spends nothing); 403 for a change with
/// the read-only token. The caller's [`Access`] goes on as a request extension.
async fn admin_only(State(node): State<Arc<Node>>, mut request: Request, next: Next) -> Response {
    let access = match authorize(&node, request.headers()) {
        Ok(access) => access,
        Err(e) => return e.into_response(),
    };
    if access == Access::Read {
        if let Some(what) = changes(request.method(), request.uri().path()) {
            return ApiError(
                StatusCode::FORBIDDEN,
                format!("this token is read-only: changing {what} needs the admin token"),
            )
            .into_response();
        }
    }
    request.extensions_mut().insert(access);
    next.run(request).await
}

/// What a request to the admin API changes, if it changes anything.
fn changes(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    use axum::http::Method;
    if method == Method::GET || method == Method::HEAD || (method == Method::POST && path == "/v1/admin/explain") {
        return None;
    }
    Some(match path {
        "/v1/admin/rules" => "the rules",
        "/v1/admin/overrides" => "overrides",
        "/v1/admin/reset" => "counters",
        _ => "anything",
    })
}

/// Which token the request's bearer token is, compared in constant time with both.
fn authorize(node: &Node, headers: &HeaderMap) -> Result<Access, ApiError> {
    let (admin, read) = (
        node.config.admin_token.as_deref(),
        node.config.admin_read_token.as_deref(),
    );
    if admin.is_none() && read.is_none() {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "the admin API is disabled: start sluice-service with --admin-token-file".into(),
        ));
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let is = |token: Option<&str>| token.is_some_and(|t| crate::node::constant_time_eq(given.as_bytes(), t.as_bytes()));
    let (is_admin, is_read) = (is(admin), is(read));
    if is_admin {
        Ok(Access::Admin)
    } else if is_read {
        Ok(Access::Read)
    } else {
        Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        ))
    }
}

/// `GET /v1/admin/rules`: the rules in force, with their published version as the `ETag`.
async fn get_rules(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
    let (rules, version) = node.rules_in_force();
    Ok((
        [
            (header::CONTENT_TYPE, "application/toml".to_owned()),
            (header::ETAG, format!("\"{version}\"")),
        ],
        rules.to_toml(),
    )
        .into_response())
}

/// `PUT /v1/admin/rules`: replaces the rules everywhere. With `If-Match: "<version>"` (the
/// `ETag` of a GET) only if they are still that version, else 412 Precondition Failed (RFC
/// 9110's answer to a failed `If-Match`); without, unconditionally.
async fn put_rules(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let expected = match headers.get(header::IF_MATCH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().trim_matches('"').parse::<u64>().ok())
                .ok_or_else(|| bad("If-Match must be the ETag of GET /v1/admin/rules, e.g. \"3\""))?,
        ),
    };
    let raw = body(raw)?;
    let text = std::str::from_utf8(&raw).map_err(|_| bad("rules must be UTF-8 text"))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let rules = if is_json {
        RuleSet::from_json(text)
    } else {
        RuleSet::from_toml(text)
    }
    .map_err(|e| bad(format!("rules not changed: {e}")))?;
    let count = rules.rules().len();
    match rules_source::replace(&node, rules, expected, (SourceKind::Admin, "PUT /v1/admin/rules"))
        .await
        .map_err(not_stored)?
    {
        Publish::Done(version) => Ok((
            [(header::ETAG, format!("\"{version}\""))],
            Json(json!({"status": "ok", "rules": count, "version": version})),
        )
            .into_response()),
        Publish::Conflict(now) => Err(ApiError(
            StatusCode::PRECONDITION_FAILED,
            format!(
                "rules not changed: they are version {now} now, not {}; GET them again and reapply your change",
                expected.unwrap_or_default()
            ),
        )),
    }
}

fn not_stored(e: StoreError) -> ApiError {
    ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("rules not stored: {e}"))
}

/// Applies `change` to the rules in force and publishes them; when another change came
/// first, adopts it and applies `change` again (so concurrent overrides are all kept).
pub(crate) async fn change_rules(
    node: &Node,
    what: &str,
    change: impl Fn(&mut RuleSet) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    for _ in 0..5 {
        let (in_force, version) = node.rules_in_force();
        let mut rules = (*in_force).clone();
        change(&mut rules)?;
        match rules_source::replace(node, rules, Some(version), (SourceKind::Admin, what))
            .await
            .map_err(not_stored)?
        {
            Publish::Done(_) => return Ok(()),
            Publish::Conflict(_) => rules_source::adopt_published(node).await.map_err(not_stored)?,
        }
    }
    Err(ApiError(
        StatusCode::CONFLICT,
        "rules not changed: they kept changing under this update; try again".into(),
    ))
}

async fn remove_override(
    State(node): State<Arc<Node>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (Some(rule), Some(identity)) = (q.get("rule"), q.get("identity")) else {
        return Err(bad("give the override as ?rule=NAME&identity=VALUE"));
    };
    let what = format!("override of {rule:?} for {identity:?} removed");
    change_rules(&node, &what, |rules| {
        if rules.remove_override(rule, identity) {
            Ok(())
        } else {
            Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no override for rule {rule:?} and identity {identity:?}"),
            ))
        }
    })
    .await?;
    Ok(Json(json!({"status": "ok"})).into_response())
}

async fn violations(
    State(node): State<Arc<Node>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let count = match q.get("count") {
        Some(c) => c
            .parse::<usize>()
            .map_err(|_| bad(format!("count {c:?} is not a number")))?
            .min(10_000),
        None => 100,
    };
    let list = node
        .violations
        .recent(
            &node.store,
            q.get("rule").map(String::as_str),
            q.get("identity").map(String::as_str),
            count,
        )
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(Json(json!({"violations": list, "dropped": node.violations.dropped()})).into_response())
}
