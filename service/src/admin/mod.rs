//! The admin API, on a listener of its own (`--admin-listen`): the rules and overrides
//! ([`rules`]), and the operator's console ([`console`]): its JSON endpoints and its page.
//!
//! Who may call what is decided once, by a layer on every admin route ([`router`]): no
//! token, no answer (401); the read-only token reads and explains, and anything that
//! changes state needs the admin token (403). A route added to the router is behind it by
//! construction; health, metrics and the page's files (no data) stay open.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::http::{common, ApiError, ADMIN_BODY_LIMIT};
use crate::node::Node;

pub mod console;
pub mod rules;

pub use console::CSP;

/// The admin listener's routes (`--admin-listen`): the admin API behind its bearer tokens
/// (the read-only one changes nothing), the console's page, health and metrics; every
/// answer with the console's security headers ([`console::security_headers`]).
pub fn router(node: Arc<Node>) -> Router {
    // Every admin route behind the token by construction: a layer on the routes, not a call
    // each handler must remember (health, metrics and the page, added after, stay open).
    let admin = Router::new()
        .route("/v1/admin/node", get(console::node_info))
        .route("/v1/admin/rules", get(rules::get_rules).put(rules::put_rules))
        .route("/v1/admin/rules/status", get(console::rules_status))
        .route(
            "/v1/admin/overrides",
            get(rules::list_overrides)
                .post(rules::add_override)
                .delete(rules::remove_override),
        )
        .route("/v1/admin/violations", get(rules::violations))
        .route("/v1/admin/top", get(console::top))
        .route("/v1/admin/explain", post(console::explain))
        .route("/v1/admin/reset", post(console::reset))
        .route_layer(middleware::from_fn_with_state(node.clone(), admin_only));
    common(admin.merge(console::files()), "see /v1/admin/rules")
        .layer(DefaultBodyLimit::max(ADMIN_BODY_LIMIT))
        .layer(middleware::map_response(console::security_headers))
        .with_state(node)
}

/// Which token a caller of the admin API showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The admin token: read and change.
    Admin,
    /// The read-only token: `GET`s and explain.
    Read,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Admin => "admin",
            Access::Read => "read",
        }
    }
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
