//! A response together with the quota it advertised.

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use sluice_pace::headers::RateLimitInfo;

use crate::error::{Error, Result};

/// The final response to a request (after any retries) and the quota it advertised.
#[derive(Debug)]
pub struct Response {
    inner: reqwest::Response,
    quota: RateLimitInfo,
    retries: u32,
}

impl Response {
    pub(crate) fn new(inner: reqwest::Response, quota: RateLimitInfo, retries: u32) -> Response {
        Response { inner, quota, retries }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        self.inner.headers()
    }

    /// The quota read from the rate-limit headers (every field `None` when there were none).
    pub fn quota(&self) -> &RateLimitInfo {
        &self.quota
    }

    /// How many times the request was retried before this response.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The underlying `reqwest` response.
    pub fn inner(&self) -> &reqwest::Response {
        &self.inner
    }

    /// The underlying `reqwest` response, to read the body as it streams.
    pub fn into_inner(self) -> reqwest::Response {
        self.inner
    }

    /// The underlying response and the quota.
    pub fn into_parts(self) -> (reqwest::Response, RateLimitInfo) {
        (self.inner, self.quota)
    }

    /// Reads the whole body as text.
    pub async fn text(self) -> Result<String> {
        self.inner.text().await.map_err(Error::Request)
    }
}
