//! The operator's console on the admin listener (issue 43): its JSON endpoints beside the
//! admin API's own ([`crate::admin::router`] routes them, behind the token), its page
//! compiled into the binary, and the security headers of every admin answer.
//!
//! - `GET /v1/admin/node`: which node answers, its store, the caller's access, and how many
//!   refusals it remembers ([`crate::refusals`]);
//! - `GET /v1/admin/rules/status`: the rules in force, where they came from, each rule's
//!   rates on this node ([`crate::console`]);
//! - `GET /v1/admin/top`: each rule's most refused identities;
//! - `GET /v1/admin/overrides`, `POST /v1/admin/overrides` (errors name their `field`);
//! - `POST /v1/admin/explain`: how the rules read a request and what it would get, spending
//!   nothing;
//! - `POST /v1/admin/reset`: forgets one identity's counter of one rule, logged with who asked.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_core::identity::{bounded, ip_identity};
use sluice_core::rules::{Identity, Rule, RuleSet, MISSING};
use sluice_core::wire::CheckRequest;
use sluice_core::{Algorithm, Decision};

use super::Access;
use crate::console::{self, Console, POINTS, STEP_S, TOP_CAPACITY};
use crate::edge::Peer;
use crate::http::{bad, ApiError};
use crate::node::Node;

/// The Content-Security-Policy of every admin answer: the page loads its own script and
/// style only, never framed.
pub const CSP: &str = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

const INDEX_HTML: &str = include_str!("../../console/index.html");
const APP_JS: &str = include_str!("../../console/app.js");
const APP_CSS: &str = include_str!("../../console/app.css");

/// The console's page (no token: it holds no data; its calls carry the token).
pub fn files() -> Router<Arc<Node>> {
    let file =
        |kind: &'static str, text: &'static str| get(move || async move { ([(header::CONTENT_TYPE, kind)], text) });
    Router::new()
        .route("/", get(|| async { Redirect::permanent("/console/") }))
        .route("/console", get(|| async { Redirect::permanent("/console/") }))
        .route("/console/", file("text/html; charset=utf-8", INDEX_HTML))
        .route("/console/app.js", file("text/javascript; charset=utf-8", APP_JS))
        .route("/console/app.css", file("text/css; charset=utf-8", APP_CSS))
}

/// Adds the security headers to an admin answer: the [`CSP`], `nosniff`, no referrer; and
/// `Cache-Control: no-store` to everything but the page's files (answers hold live data).
pub async fn security_headers(mut response: Response) -> Response {
    let page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html") || v.starts_with("text/javascript") || v.starts_with("text/css"));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    let cache = if page { "no-cache" } else { "no-store" };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    response
}

/// The JSON object of a body, or why not.
pub(super) fn object(raw: Result<Bytes, BytesRejection>) -> Result<serde_json::Map<String, Value>, ApiError> {
    let raw = raw.map_err(|e| ApiError(e.status(), format!("cannot read request body: {e}")))?;
    match serde_json::from_slice(&raw) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

/// `GET /v1/admin/node`.
pub async fn node_info(State(node): State<Arc<Node>>, Extension(access): Extension<Access>) -> Response {
    Json(json!({
        "node": node.config.node_name,
        "version": env!("CARGO_PKG_VERSION"),
        "store": node.store.deployment(),
        "started_at_ms": node.started_at_ms,
        "now_ms": console::now_ms(),
        "access": access.name(),
        "refusals_remembered": node.refusals.len(),
    }))
    .into_response()
}

/// `GET /v1/admin/rules/status`: the rules in force in evaluation order, their source, and
/// each rule's rates on this node.
pub async fn rules_status(State(node): State<Arc<Node>>) -> Response {
    let (rules, version) = node.rules_in_force();
    let now = console::now_ms();
    node.console.sample(&node.metrics.rule_counts(), now);
    let mut overrides: HashMap<&str, usize> = HashMap::new();
    for o in rules.overrides() {
        *overrides.entry(o.rule.as_str()).or_default() += 1;
    }
    let listed: Vec<Value> = rules
        .rules()
        .iter()
        .map(|r| {
            let rates = node.console.rates(&r.name, now).unwrap_or_else(Console::no_rates);
            json!({
                "name": r.name,
                "by": r.by.key(),
                "algorithm": r.limit.algorithm().to_string(),
                "limit": r.limit.limit(),
                "window_ms": r.window_ms,
                "shadow": r.shadow,
                "failure": r.failure,
                "match": r.conditions(),
                "overrides": overrides.get(r.name.as_str()).copied().unwrap_or(0),
                "rates": rates,
            })
        })
        .collect();
    Json(json!({
        "version": version,
        "source": node.console.source(),
        "step_s": STEP_S,
        "points": POINTS,
        "now_ms": now,
        "rules": listed,
    }))
    .into_response()
}

/// `GET /v1/admin/top?rule=NAME`: 404 for a rule neither in force nor refusing.
pub async fn top(
    State(node): State<Arc<Node>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let rule = q.get("rule").map(String::as_str);
    let mut top = node.console.top(rule);
    if let Some(name) = rule.filter(|_| top.is_empty()) {
        if node.rules().rule(name).is_none() {
            return Err(ApiError(StatusCode::NOT_FOUND, format!("no rule {name:?} is in force")));
        }
        top.push(console::TopRule {
            rule: name.to_owned(),
            refused: 0,
            identities: Vec::new(),
        });
    }
    Ok(Json(json!({"capacity": TOP_CAPACITY, "rules": top})).into_response())
}

/// `POST /v1/admin/explain` (read token allowed: it spends nothing).
pub async fn explain(State(node): State<Arc<Node>>, raw: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req = explain_request(object(raw)?, node.config.ipv6_prefix).map_err(bad)?;
    let rules = node.rules();
    Ok(Json(explain_rules(&node, &rules, &req).await).into_response())
}

/// The check request an explain body (`method`, `path`, `host`, `ip`, `identities`) stands
/// for, canonical as a check's is: identities bounded (long values digested), the `ip`
/// grouped by `ipv6_prefix`, the path canonical; or why it cannot be one.
pub fn explain_request(mut body: serde_json::Map<String, Value>, ipv6_prefix: u8) -> Result<CheckRequest, String> {
    let mut identities: BTreeMap<String, String> = match body.remove("identities") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v).map_err(|_| "identities must be an object of strings".to_owned())?,
    };
    if let Some(ip) = body.remove("ip").filter(|v| !v.is_null()) {
        let ip = ip.as_str().ok_or("ip must be a string")?;
        identities.insert("ip".into(), ip.to_owned());
    }
    for value in identities.values_mut() {
        *value = bounded(value).into_owned();
    }
    let method = body.remove("method").filter(|v| !v.is_null()).unwrap_or(json!("GET"));
    let check = json!({
        "identities": identities,
        "method": method,
        "path": body.remove("path").unwrap_or(Value::Null),
        "host": body.remove("host").unwrap_or(Value::Null),
        "cost": 0,
    });
    if let Some(other) = body.keys().next() {
        return Err(format!(
            "unknown field {other:?}: explain takes method, path, host, ip and identities"
        ));
    }
    let req = CheckRequest::from_json(check.to_string().as_bytes()).map_err(|e| e.0)?;
    Ok(crate::check::canonical(req, ipv6_prefix))
}

/// Whether each rule applies to `req` and the identity it limits it by, or why it does not
/// (the reasons of [`Rule::explain`] as text), in evaluation order.
pub fn explain_matching<'r>(rules: &'r RuleSet, req: &'r CheckRequest) -> Vec<(&'r Rule, Result<&'r str, String>)> {
    rules
        .rules()
        .iter()
        .map(|r| {
            let found = r.explain(&req.identities, &req.method, req.host.as_deref(), &req.path);
            (r, found.map_err(|why| why.to_string()))
        })
        .collect()
}

/// What each rule makes of `req`, and the counters' state now (a peek: nothing spent).
async fn explain_rules(node: &Node, rules: &RuleSet, req: &CheckRequest) -> Value {
    let now_ms = node.clock.now().instant_ms();
    let explained = explain_matching(rules, req);
    // Peeked: the rules that matched, have their identity and are decided in this store.
    let peekable: Vec<(&Rule, &str)> = explained
        .iter()
        .filter_map(|(r, found)| found.as_ref().ok().map(|id| (*r, *id)))
        .filter(|(r, id)| !r.refuses(id) && (node.region.is_none() || r.global.is_none()))
        .collect();
    let mut peeked = crate::decide::matched(node, rules, peekable, 1, now_ms);
    let degraded = crate::quota::peek_limits(node, &mut peeked).await;
    let states: HashMap<&str, Decision> = peeked.iter().filter_map(|m| Some((m.name, m.decision?))).collect();
    let mut would_pass = true;
    let answers: Vec<Value> = explained
        .iter()
        .map(|(r, found)| {
            let state = states.get(r.name.as_str());
            let refused = found.as_ref().is_ok_and(|id| r.refuses(id));
            if !r.shadow && (refused || state.is_some_and(|d| !d.allowed)) {
                would_pass = false;
            }
            explain_rule(node, rules, r, found, state, now_ms)
        })
        .collect();
    json!({
        "path": req.path,
        "host": req.host,
        "identities": req.identities,
        "would_pass": would_pass,
        "degraded": degraded,
        "rules": answers,
    })
}

/// One rule's part of an explain answer.
fn explain_rule(
    node: &Node,
    rules: &RuleSet,
    r: &Rule,
    found: &Result<&str, String>,
    state: Option<&Decision>,
    now_ms: u64,
) -> Value {
    let Ok(identity) = found else {
        let why = found.as_ref().err().cloned().unwrap_or_default();
        return json!({"rule": r.name, "matches": false, "why": why, "identity": null, "key": null,
                      "shadow": r.shadow, "algorithm": r.limit.algorithm().to_string(),
                      "limit": r.limit.limit(), "override": false, "state": null});
    };
    let mut why = format!("{} matches; by {}", r.conditions(), r.by.key());
    if r.limit.algorithm() == Algorithm::Concurrency {
        why.push_str(&format!(
            "; requests in flight: a slot is held until the request ends (or {} ms after its holder's last renewal)",
            r.window_ms
        ));
    }
    if *identity == MISSING && r.by != Identity::Global {
        why.push_str(if r.refuses(identity) {
            "; the identity is missing and the rule refuses such requests"
        } else {
            "; the identity is missing: counted in the bucket such requests share"
        });
    }
    if state.is_none() && !r.refuses(identity) {
        why.push_str("; a global rule: decided from this region's leases, not peeked here");
    }
    let overridden = rules
        .overrides()
        .any(|o| o.rule == r.name && o.identity == *identity && now_ms < o.until_ms);
    let state = state.map(|d| {
        json!({"remaining": d.remaining, "limit": d.limit, "reset_after_ms": d.reset_after.wait_ms(),
               "retry_after_ms": d.retry_after.wait_ms(), "would_pass": d.allowed})
    });
    json!({"rule": r.name, "matches": true, "why": why, "identity": identity,
           "key": node.store.keys().limit(&r.name, identity), "shadow": r.shadow,
           "algorithm": r.limit.algorithm().to_string(),
           "limit": rules.limit_for(r, identity, now_ms).limit(), "override": overridden, "state": state})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    rule: String,
    identity: String,
}

/// `POST /v1/admin/reset`: forgets one identity's counter of one rule in the store (and
/// this node's fallback bucket), logged as a warning naming who asked.
pub async fn reset(
    State(node): State<Arc<Node>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = raw.map_err(|e| ApiError(e.status(), format!("cannot read request body: {e}")))?;
    let body: ResetBody = serde_json::from_slice(&raw)
        .map_err(|e| bad(format!("a reset is {{\"rule\": NAME, \"identity\": VALUE}}: {e}")))?;
    let rules = node.rules();
    let Some(rule) = rules.rule(&body.rule) else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no rule {:?} is in force", body.rule),
        ));
    };
    let identity = match rule.by {
        Identity::Ip => ip_identity(&body.identity, node.config.ipv6_prefix).into_owned(),
        _ => body.identity.clone(),
    };
    let identity = bounded(&identity).into_owned();
    let key = node.store.keys().limit(&rule.name, &identity);
    let existed = crate::store::within(node.config.store_timeout * 4, node.store.reset(&key))
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("nothing reset: {e}")))?;
    node.fallback.reset(&key);
    node.refusals.forget(&key);
    let operator = headers
        .get("x-sluice-operator")
        .and_then(|v| v.to_str().ok())
        .map(|v| sluice_core::text::truncate(v, 64).to_owned())
        .unwrap_or_else(|| "(not given)".into());
    let peer = peer.map_or_else(|| "(unknown)".to_owned(), |Extension(Peer(p))| p);
    let shown = sluice_core::text::visible;
    tracing::warn!(rule = %shown(&rule.name), identity = %shown(&identity), operator = %shown(&operator), peer = %peer,
        existed, "counter reset from the admin API");
    Ok(Json(json!({"status": "ok", "rule": rule.name, "identity": identity})).into_response())
}
