//! The rules and overrides through the admin API: read and replace the rules (with an
//! `ETag` for a change that must not lose another's), add, list and remove overrides, read
//! the violations log. A change is published to every node through the store
//! ([`crate::rules_source`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sluice_core::rules::{format_rfc3339, parse_rfc3339, Override, RuleSet, RulesError};

use super::console::object;
use crate::console::SourceKind;
use crate::http::{bad, body, ApiError};
use crate::node::Node;
use crate::rules_source;
use crate::store::{Publish, StoreError};

/// `GET /v1/admin/rules`: the rules in force, with their published version as the `ETag`.
pub async fn get_rules(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
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
pub async fn put_rules(
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
pub async fn change_rules(
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

/// `DELETE /v1/admin/overrides?rule=NAME&identity=VALUE`: 404 when there is none.
pub async fn remove_override(
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

/// `GET /v1/admin/violations?rule=&identity=&count=`: the most recent first.
pub async fn violations(
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

/// A 400 about one field of a body: `{"error", "field"}`, so the page shows it by the field.
pub struct FieldError {
    field: String,
    message: String,
}

impl IntoResponse for FieldError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.message, "field": self.field});
        (StatusCode::BAD_REQUEST, Json(body)).into_response()
    }
}

fn field_error(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// `GET /v1/admin/overrides`: every override held, by rule and identity.
pub async fn list_overrides(State(node): State<Arc<Node>>) -> Response {
    let rules = node.rules();
    let mut list: Vec<&Override> = rules.overrides().collect();
    list.sort_by(|a, b| (&a.rule, &a.identity).cmp(&(&b.rule, &b.identity)));
    let list: Vec<Value> = list
        .iter()
        .map(|o| {
            json!({"rule": o.rule, "identity": o.identity, "limit": o.limit,
                   "until": format_rfc3339(o.until_ms), "until_ms": o.until_ms})
        })
        .collect();
    Json(json!({ "overrides": list })).into_response()
}

/// `POST /v1/admin/overrides`: adds (or replaces) an override; a 400 names its `field`.
pub async fn add_override(State(node): State<Arc<Node>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let o = match object(raw).map(read_override) {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return e.into_response(),
        Err(e) => return e.into_response(),
    };
    // Checked against the rules in force first, to name the field; checked again in the change.
    if let Err(RulesError::Override { field, message, .. }) = (*node.rules()).clone().add_override(o.clone()) {
        return field_error(field, format!("{field}: {message}")).into_response();
    }
    let what = format!("override of {:?} for {:?} added", o.rule, o.identity);
    let changed = change_rules(&node, &what, |rules| {
        rules.add_override(o.clone()).map_err(|e| bad(e.to_string()))
    })
    .await;
    match changed {
        Ok(()) => (StatusCode::CREATED, Json(json!({"status": "ok"}))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// An override from a body's fields, or a 400 naming the first bad one.
fn read_override(mut body: serde_json::Map<String, Value>) -> Result<Override, FieldError> {
    let mut text = |field: &str| match body.remove(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(_) => Err(field_error(field, format!("{field} must be a non-empty string"))),
        None => Err(field_error(field, format!("{field} is missing"))),
    };
    let (rule, identity, until) = (text("rule")?, text("identity")?, text("until")?);
    let limit = match body.remove("limit") {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| field_error("limit", "limit must be a whole number, 1 or more"))?,
        None => return Err(field_error("limit", "limit is missing")),
    };
    if let Some(other) = body.keys().next() {
        return Err(field_error(
            other,
            format!("unknown field {other:?}: an override has rule, identity, limit and until"),
        ));
    }
    let until_ms = parse_rfc3339(&until).map_err(|e| field_error("until", format!("until: {e}")))?;
    Ok(Override {
        rule,
        identity,
        limit,
        until_ms,
    })
}
