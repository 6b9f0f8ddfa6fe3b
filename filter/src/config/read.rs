//! Reading the configuration's JSON into [`Config`], field by field (`sluice_core::json`):
//! each absent field takes its default, and an error names the field's whole path.

use sluice_core::headers::HeaderMode;
use sluice_core::json::{Json, JsonError};
use sluice_core::rules::FailureMode;

use super::*;

impl Config {
    /// The configuration in `doc`, before validation.
    pub(super) fn read(doc: &Json<'_>) -> Result<Config, JsonError> {
        let mut f = doc.object()?;
        let c = Config {
            check: f.req("check", Check::read),
            identities: f.opt("identities", Identities::read).unwrap_or_default(),
            local: f.opt("local", Local::read),
            failure: f.opt("failure", Failure::read).unwrap_or_default(),
            headers: f
                .opt("headers", |v| {
                    named(v, HeaderMode::from_name, "all, legacy, ietf or none")
                })
                .unwrap_or_default(),
            cors_expose: f.opt("cors_expose", Json::bool).unwrap_or(true),
            lease: f.opt("lease", Lease::read),
            debit: f.opt("debit", Debit::read),
            concurrency: f.opt("concurrency", Concurrency::read),
            share: f.opt("share", |v| named(v, Share::from_name, "process or worker")),
            slots: f.opt("slots", Json::u64).unwrap_or(DEFAULT_SLOTS),
        };
        f.finish().map(|()| c)
    }
}

/// A string naming one of a few values.
fn named<T>(v: &Json<'_>, from_name: fn(&str) -> Option<T>, expected: &str) -> Result<T, JsonError> {
    let name = v.str()?;
    from_name(name).ok_or_else(|| JsonError::new(format!("{name:?} is not one of {expected}")))
}

impl Lease {
    fn read(v: &Json<'_>) -> Result<Lease, JsonError> {
        let mut f = v.object()?;
        let l = Lease {
            rules_path: f.opt("rules_path", Json::string).unwrap_or_else(default_rules_path),
            lease_path: f.opt("lease_path", Json::string).unwrap_or_else(default_lease_path),
            poll_ms: f.opt("poll_ms", Json::u64).unwrap_or_else(default_poll_ms),
            tick_ms: f.opt("tick_ms", Json::u64).unwrap_or_else(default_tick_ms),
        };
        f.finish().map(|()| l)
    }
}

impl Debit {
    fn read(v: &Json<'_>) -> Result<Debit, JsonError> {
        let mut f = v.object()?;
        let d = Debit {
            header: f.req("header", Json::string),
            path: f.opt("path", Json::string).unwrap_or_else(default_debit_path),
            tick_ms: f.opt("tick_ms", Json::u64).unwrap_or_else(default_tick_ms),
        };
        f.finish().map(|()| d)
    }
}

impl Concurrency {
    fn read(v: &Json<'_>) -> Result<Concurrency, JsonError> {
        let mut f = v.object()?;
        let c = Concurrency {
            path: f.opt("path", Json::string).unwrap_or_else(default_slots_path),
            tick_ms: f.opt("tick_ms", Json::u64).unwrap_or_else(default_slots_tick_ms),
            local: f.opt("local", LocalConcurrency::read),
        };
        f.finish().map(|()| c)
    }
}

impl LocalConcurrency {
    fn read(v: &Json<'_>) -> Result<LocalConcurrency, JsonError> {
        let mut f = v.object()?;
        let l = LocalConcurrency {
            by: f.opt("by", Json::string).unwrap_or_else(default_by),
            limit: f.req("limit", Json::u64),
            expiry_ms: f
                .opt("expiry_ms", Json::u64)
                .unwrap_or_else(default_in_flight_expiry_ms),
            max_keys: f.opt("max_keys", Json::uint).unwrap_or_else(default_max_keys),
        };
        f.finish().map(|()| l)
    }
}

impl Check {
    fn read(v: &Json<'_>) -> Result<Check, JsonError> {
        let mut f = v.object()?;
        let c = Check {
            cluster: f.req("cluster", Json::string),
            authority: f.opt("authority", Json::string).unwrap_or_else(default_authority),
            path: f.opt("path", Json::string).unwrap_or_else(default_path),
            wait_path: f.opt("wait_path", Json::string).unwrap_or_else(default_wait_path),
            timeout_ms: f.opt("timeout_ms", Json::uint).unwrap_or_else(default_timeout),
            token: f.opt("token", Json::string),
            token_header: f.opt("token_header", Json::string).unwrap_or_else(default_token_header),
        };
        f.finish().map(|()| c)
    }
}

impl Identities {
    fn read(v: &Json<'_>) -> Result<Identities, JsonError> {
        let mut f = v.object()?;
        let i = Identities {
            ip: f.opt("ip", IpSource::read),
            user: f.opt("user", Source::read),
            api_key: f.opt("api_key", Source::read),
            tier: f.opt("tier", Source::read),
        };
        f.finish().map(|()| i)
    }
}

impl IpSource {
    fn read(v: &Json<'_>) -> Result<IpSource, JsonError> {
        let mut f = v.object()?;
        let ip = IpSource {
            header: f.opt("header", Json::string).unwrap_or_else(default_xff),
            trusted_hops: f.opt("trusted_hops", Json::uint).unwrap_or(0),
            ipv6_prefix: f.opt("ipv6_prefix", Json::uint).unwrap_or_else(default_ipv6_prefix),
        };
        f.finish().map(|()| ip)
    }
}

impl Source {
    fn read(v: &Json<'_>) -> Result<Source, JsonError> {
        let mut f = v.object()?;
        let s = Source {
            header: f.opt("header", Json::string),
            property: f.opt("property", |v| v.each(Json::string)),
        };
        f.finish().map(|()| s)
    }
}

impl Local {
    fn read(v: &Json<'_>) -> Result<Local, JsonError> {
        let mut f = v.object()?;
        let l = Local {
            by: f.opt("by", Json::string).unwrap_or_else(default_by),
            rate_per_s: f.req("rate_per_s", Json::u64),
            burst: f.req("burst", Json::u64),
            max_keys: f.opt("max_keys", Json::uint).unwrap_or_else(default_max_keys),
        };
        f.finish().map(|()| l)
    }
}

impl Failure {
    fn read(v: &Json<'_>) -> Result<Failure, JsonError> {
        let mut f = v.object()?;
        let failure = Failure {
            mode: f
                .opt("mode", |v| named(v, FailureMode::from_name, "open or closed"))
                .unwrap_or_default(),
            fallback: f.opt("fallback", Rate::read).unwrap_or_default(),
            breaker: f.opt("breaker", BreakerConfig::read).unwrap_or_default(),
        };
        f.finish().map(|()| failure)
    }
}

impl Rate {
    fn read(v: &Json<'_>) -> Result<Rate, JsonError> {
        let mut f = v.object()?;
        let r = Rate {
            rate_per_s: f.req("rate_per_s", Json::u64),
            burst: f.req("burst", Json::u64),
        };
        f.finish().map(|()| r)
    }
}

impl BreakerConfig {
    fn read(v: &Json<'_>) -> Result<BreakerConfig, JsonError> {
        let mut f = v.object()?;
        let b = BreakerConfig {
            failures: f.req("failures", Json::uint),
            cooldown_ms: f.req("cooldown_ms", Json::u64),
        };
        f.finish().map(|()| b)
    }
}
