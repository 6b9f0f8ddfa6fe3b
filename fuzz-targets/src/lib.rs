//! The fuzz targets of Sluice's readers of outside bytes (docs/testing.md, "Fuzzing").
//!
//! Each target is a function of the input's bytes that feeds them to the real reader and
//! asserts what must hold of any input: it never panics, and where a writer exists, what is
//! read and written back reads again the same. cargo-fuzz drives them from `fuzz/`
//! (`bash scripts/fuzz`); this crate's test `tests/corpus.rs` replays every file of
//! `fuzz/corpus/<target>/` through them on stable Rust, as part of the workspace's tests.
//! A target that needs text skips input that is not UTF-8.

mod differential;
mod host_events;

use std::borrow::Cow;

use sluice_core::json::{self, Json, JsonError};
use sluice_core::lease::wire::{LeaseRequest, LeaseResponse};
use sluice_core::rules::RuleSet;
use sluice_core::wire::{CheckRequest, CheckResponse, MAX_IDENTITY_BYTES};

pub use differential::json_differential;
pub use host_events::{host_events, init as host_events_init};

/// A fuzz target: the input's bytes in, a panic on what must not happen.
pub type Target = fn(&[u8]);

/// Every target by name: `fuzz/fuzz_targets/<name>.rs` calls it, `fuzz/corpus/<name>/` is
/// its corpus.
pub const TARGETS: &[(&str, Target)] = &[
    ("json", json),
    ("json_differential", json_differential),
    ("wire", wire),
    ("rules_toml", rules_toml),
    ("rules_yaml", rules_yaml),
    ("canonical", canonical),
    ("pace_headers", pace_headers),
    ("filter_config", filter_config),
    ("host_events", host_events),
    ("edge_sniff", edge_sniff),
    ("redis_address", redis_address),
    ("redis_replies", redis_replies),
    ("rls_descriptors", rls_descriptors),
    ("held_leases", held_leases),
    ("rlqs_reports", rlqs_reports),
];

/// Core's JSON reader (`sluice_core::json::parse`), every value walked through its
/// accessors. A document read is within the depth bound, its objects' names are unique, an
/// error's offset lies within the text, and the value written back with core's writers
/// (`json::Object`, `write_each`, `write_str`) reads again the same.
pub fn json(data: &[u8]) {
    match json::parse(data) {
        Ok(doc) => {
            walk(&doc, 0);
            let mut out = String::new();
            write_value(&mut out, &doc);
            let again = json::parse(out.as_bytes());
            assert_eq!(again.as_ref(), Ok(&doc), "written back as {out}");
        }
        Err(e) => {
            // Formatting must not panic; a syntax error's offset is a place in the text.
            let _ = e.to_string();
            if let Some(at) = e.offset() {
                assert!(
                    at <= data.len(),
                    "error offset {at} past the end ({} bytes): {e}",
                    data.len()
                );
            }
        }
    }
}

/// Every accessor on every value of `value`, `depth` containers deep.
fn walk(value: &Json<'_>, depth: usize) {
    assert!(depth <= json::MAX_DEPTH, "a value {depth} containers deep");
    let _ = value.bool();
    let _ = value.str();
    let _ = value.uint::<u32>();
    let _ = value.uint::<u8>();
    if let (Json::Number(text), Ok(n)) = (value, value.u64()) {
        // The JSON grammar allows no sign and no leading zero: an integer reads as itself.
        let mut again = String::new();
        sluice_core::text::push_u64(&mut again, n);
        assert_eq!(*text, again);
    }
    match value {
        Json::Array(items) => {
            let read = value.each(|item| Ok::<_, JsonError>(item.clone()));
            assert_eq!(read.as_deref().ok(), Some(&items[..]));
            for item in items {
                walk(item, depth + 1);
            }
        }
        Json::Object(members) => {
            let mut names: Vec<&str> = members.iter().map(|(k, _)| k.as_ref()).collect();
            names.sort_unstable();
            assert!(names.windows(2).all(|w| w.first() != w.last()), "a repeated name");
            // `Fields` reads objects of up to MAX_FIELDS members; nothing taken, a
            // non-empty one is refused by `finish` and accepted by `finish_lenient`.
            match value.object() {
                Ok(fields) => assert_eq!(fields.finish().is_ok(), members.is_empty()),
                Err(_) => assert!(members.len() > json::MAX_FIELDS),
            }
            if let Ok(fields) = value.object() {
                assert!(fields.finish_lenient().is_ok());
            }
            for (_, member) in members {
                walk(member, depth + 1);
            }
        }
        _ => {}
    }
}

/// `value` as JSON, with core's writers.
fn write_value(out: &mut String, value: &Json<'_>) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(text) => out.push_str(text),
        Json::String(s) => json::write_str(out, s),
        Json::Array(items) => json::write_each(out, items, write_value),
        Json::Object(members) => {
            let mut o = json::Object::new(out);
            for (name, member) in members {
                o.key(name);
                write_value(o.out(), member);
            }
            o.end();
        }
    }
}

/// Every reader of the check and lease calls' bodies (`CheckRequest`, `CheckResponse`,
/// `LeaseRequest`, `LeaseResponse`): what one reads, its `to_json` writes so that it reads
/// back the same.
pub fn wire(data: &[u8]) {
    if let Ok(req) = CheckRequest::from_json(data) {
        assert_eq!(CheckRequest::from_json(req.to_json().as_bytes()), Ok(req));
    }
    if let Ok(answer) = CheckResponse::from_json(data) {
        assert_eq!(CheckResponse::from_json(answer.to_json().as_bytes()), Ok(answer));
    }
    if let Ok(req) = LeaseRequest::from_json(data) {
        assert_eq!(LeaseRequest::from_json(req.to_json().as_bytes()), Ok(req));
    }
    if let Ok(answer) = LeaseResponse::from_json(data) {
        assert_eq!(LeaseResponse::from_json(answer.to_json().as_bytes()), Ok(answer));
    }
}

/// The rules file readers of `RuleSet`: TOML (`from_toml`) and its JSON form
/// (`from_json`). A set read is written by `to_toml` and `to_json` as files that read back
/// to the same set (compared by what `to_toml` writes of it).
pub fn rules_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for set in [RuleSet::from_toml(text), RuleSet::from_json(text)] {
        match set {
            Ok(set) => {
                let toml = set.to_toml();
                let from_toml = RuleSet::from_toml(&toml).map(|s| s.to_toml());
                assert_eq!(from_toml.as_ref(), Ok(&toml), "written as TOML:\n{toml}");
                let json = set.to_json();
                let from_json = RuleSet::from_json(&json).map(|s| s.to_toml());
                assert_eq!(from_json.as_ref(), Ok(&toml), "written as JSON: {json}");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// The service's reader of envoyproxy/ratelimit YAML files (`grpc::config`): `parse`, and
/// `check`, which validates the descriptor tree and finds each problem's line.
pub fn rules_yaml(data: &[u8]) {
    use sluice_service::grpc::config;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = config::parse(text);
    let checked = config::check(text);
    // What `check` counts, `parse` has read (a blank file is no domain, and no error).
    if checked.is_ok() && !config::is_blank(text) {
        assert!(parsed.is_ok(), "checked but not parsed: {checked:?}");
    }
}

/// The canonical forms of request paths and identities (`path::canonical`,
/// `identity::bounded`, `identity::ip_identity`): each is idempotent, as its documentation
/// says; a path starts with `/`; a bounded identity fits [`MAX_IDENTITY_BYTES`] and is the
/// value itself when that fits.
pub fn canonical(data: &[u8]) {
    use sluice_core::identity::{bounded, ip_identity, DEFAULT_IPV6_PREFIX};
    use sluice_core::path;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let once = path::canonical(text);
    assert!(once.starts_with('/'), "{once:?}");
    assert_eq!(path::canonical(&once), once, "canonical twice");

    let id = bounded(text);
    assert!(id.len() <= MAX_IDENTITY_BYTES, "{} bytes", id.len());
    if text.len() <= MAX_IDENTITY_BYTES {
        assert!(matches!(id, Cow::Borrowed(b) if b == text));
    }
    assert_eq!(bounded(&id), id, "bounded twice");

    for prefix in [DEFAULT_IPV6_PREFIX, 48, 128, 0] {
        let ip = ip_identity(text, prefix);
        assert_eq!(ip_identity(&ip, prefix), ip, "ip_identity twice, prefix {prefix}");
    }
}

/// sluice-pace's reader of rate-limit response headers (`parse_headers`), which never
/// fails and never panics. The input is text: a first line `<status> <now_ms>` (either
/// may be missing or malformed: 429 and a fixed clock then), then one `name: value` header
/// a line.
pub fn pace_headers(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let mut first = lines.next().unwrap_or("").split(' ');
    let status = first.next().and_then(|s| s.parse().ok()).unwrap_or(429);
    let now_ms = first.next().and_then(|s| s.parse().ok()).unwrap_or(1_800_000_000_000);
    let headers: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(':')).collect();
    let info = sluice_pace::parse_headers(status, headers, now_ms);
    let _ = info.is_empty();
    let _ = info.bucket_name();
    for quota in &info.quotas {
        let _ = info.quota(&quota.unit);
        let _ = quota.to_info();
    }
}

/// The filter's configuration reader (`sluice_filter::config::Config::parse`), which the
/// module runs on whatever `proxy_on_configure` hands it. A configuration it accepts is
/// within the bounds its validation promises; one it refuses is refused with a message
/// that says so (the module logs it and refuses to start).
pub fn filter_config(data: &[u8]) {
    use sluice_filter::config::Config;
    let config = match Config::parse(data) {
        Ok(config) => config,
        Err(e) => {
            assert!(!e.0.is_empty(), "an empty refusal");
            return;
        }
    };
    assert!(!config.check.cluster.trim().is_empty(), "no cluster: {config:?}");
    assert!((1..=60_000).contains(&config.check.timeout_ms), "timeout: {config:?}");
    for value in [&config.check.cluster, &config.check.authority] {
        assert!(
            value.bytes().all(|b| b.is_ascii_graphic()),
            "a header value unsendable: {value:?}"
        );
    }
    for path in [&config.check.path, &config.check.wait_path] {
        let printable = path.bytes().all(|b| b.is_ascii_graphic());
        assert!(path.starts_with('/') && printable, "an endpoint not a path: {path:?}");
    }
    if let Some(tick) = config.tick_ms() {
        assert!((10..=1_000).contains(&tick), "tick: {config:?}");
    }
    let _ = config.check.credential();
}

/// The service edge's sniffer of a connection's first bytes (`edge::sniffed`), which reads
/// raw client bytes before any HTTP parser: the input's first byte says how to cut the rest
/// into reads. However they are cut, the state is the same, and the one a reference reading
/// of the whole gives: HTTP/2 exactly when the bytes begin with its 24-byte preface, still
/// sniffing while they are a proper prefix of it, else HTTP/1.1 whose headers have ended
/// exactly when a CRLFCRLF came.
pub fn edge_sniff(data: &[u8]) {
    use sluice_service::edge::sniffed;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const END: &[u8] = b"\r\n\r\n";
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let expected = if bytes.starts_with(PREFACE) {
        "H2".to_owned()
    } else if PREFACE.starts_with(bytes) {
        format!("Start {{ seen: {} }}", bytes.len())
    } else if bytes.windows(END.len()).any(|w| w == END) {
        "Busy".to_owned()
    } else {
        let matched = (0..END.len()).rev().find(|&j| bytes.ends_with(&END[..j])).unwrap_or(0);
        format!("Headers {{ matched: {matched} }}")
    };
    let step = usize::from(cut).max(1);
    let reads: Vec<&[u8]> = bytes.chunks(step).collect();
    assert_eq!(sniffed(&reads), expected, "read {step} bytes at a time: {bytes:?}");
    let (a, b) = bytes.split_at(usize::from(cut).min(bytes.len()));
    assert_eq!(sniffed(&[a, &[], b]), expected, "read as {a:?}, nothing, then {b:?}");
}

/// The Redis address parser (`Address::parse`, `--store`'s URL): any text is an address or an
/// error that says how to write one; an address has a host and nonzero ports; and a password
/// given in the URL shows in neither the address's `Debug`, its error, nor `redact`.
pub fn redis_address(data: &[u8]) {
    use sluice_service::store::redis::{redact, Address};
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    // The password as the URL writes it (percent-encoded), when it is long enough, written
    // once, and holds neither `*` nor `@`, so that finding it elsewhere means it leaked (the
    // redaction's own `***` and the host after it could spell one otherwise: the target's
    // first find, `regression-password-spelled-by-the-redaction`).
    // Only past a scheme the parser knows: an unknown one is quoted as written, escaped (a
    // NUL shows as `\0`), which can spell anything (its fourth find).
    const SCHEMES: [&str; 6] = [
        "redis",
        "rediss",
        "redis+cluster",
        "rediss+cluster",
        "redis+sentinel",
        "rediss+sentinel",
    ];
    let secret = url
        .split_once("://")
        .filter(|(scheme, _)| SCHEMES.contains(scheme))
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password)
        .filter(|p| p.len() >= 4 && url.matches(*p).count() == 1 && !p.contains(['*', '@']))
        // Nor a word of the message every error ends with (its second find: "diss", in "rediss").
        .filter(|p| {
            !Address::parse("")
                .map_or_else(|e| e.to_string(), |_| String::new())
                .contains(*p)
        });
    let redacted = redact(url);
    let shown = match Address::parse(url) {
        Ok(address) => {
            assert!(!address.hosts.is_empty(), "no host: {address:?}");
            for (host, port) in &address.hosts {
                assert!(!host.is_empty() && *port > 0, "{host:?}:{port} in {address:?}");
            }
            format!("{address:?}")
        }
        Err(e) => {
            let said = e.to_string();
            assert!(
                said.contains("redis://"),
                "an error that does not say the forms: {said}"
            );
            said
        }
    };
    if let Some(secret) = secret {
        // What the same URL shows with another password: text the password happens to spell
        // there (the default port, a host) is not the password shown (its fifth find).
        let other = url.replacen(&format!(":{secret}@"), ":Zq9xZq9x@", 1);
        let shown_other = Address::parse(&other).map_or_else(|e| e.to_string(), |a| format!("{a:?}"));
        if !shown_other.contains(secret) && !redact(&other).contains(secret) {
            assert!(!redacted.contains(secret), "redact shows the password: {redacted}");
            assert!(!shown.contains(secret), "the password shows: {shown}");
        }
    }
}

/// The readers of the check script's replies (`store::redis::reply`): numbers of any count
/// and value (the input, eight bytes a number; its first byte the group's number of rules)
/// are a decision a rule, or a grant, only when there are exactly as many as the script
/// sends, each decision keeping its rule's limit; anything else is a protocol error.
pub fn redis_replies(data: &[u8]) {
    use sluice_service::store::redis::reply::{decisions, grant};
    let Some((&rules, rest)) = data.split_first() else {
        return;
    };
    let reply: Vec<i64> = rest
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            i64::from_le_bytes(b)
        })
        .collect();
    let limits: Vec<u64> = (0..u64::from(rules % 8)).map(|i| 10 + i).collect();
    match decisions(&reply, &limits) {
        Ok(stamped) => {
            assert_eq!(reply.len(), 1 + 5 * limits.len(), "{reply:?}");
            let kept: Vec<u64> = stamped.iter().map(|s| s.decision.limit).collect();
            assert_eq!(kept, limits);
        }
        Err(e) => assert_ne!(reply.len(), 1 + 5 * limits.len(), "{reply:?}: {e}"),
    }
    match grant(&reply, 7, "grant") {
        Ok(g) => assert!(reply.len() == 8 && g.decision.limit == 7, "{reply:?}"),
        Err(e) => assert_ne!(reply.len(), 8, "{reply:?}: {e}"),
    }
}

/// Envoy RLS descriptor matching (`DescriptorSet::find`, `limits_for`) over
/// examples/ratelimit.yaml: the input's first line is the domain, then `key=value` entries a
/// line, a blank line between descriptors. Whatever a proxy sends: one answer a descriptor,
/// a lone descriptor's the same as `find`'s, and the same twice.
pub fn rls_descriptors(data: &[u8]) {
    use sluice_service::grpc::config::parse;
    use sluice_service::grpc::descriptors::DescriptorSet;
    static SET: std::sync::OnceLock<DescriptorSet> = std::sync::OnceLock::new();
    let set = SET.get_or_init(|| {
        let yaml = include_str!("../../examples/ratelimit.yaml");
        DescriptorSet::new(vec![parse(yaml).expect("the example reads")]).expect("the example builds")
    });
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (domain, rest) = text.split_once('\n').unwrap_or((text, ""));
    let descriptors: Vec<Vec<(&str, &str)>> = rest
        .split("\n\n")
        .map(|d| d.lines().map(|l| l.split_once('=').unwrap_or((l, ""))).collect())
        .collect();
    let found = set.limits_for(domain, descriptors.iter().map(Vec::as_slice));
    assert_eq!(found.len(), descriptors.len());
    let again = set.limits_for(domain, descriptors.iter().map(Vec::as_slice));
    let ids = |f: &[Option<(&_, String)>]| {
        f.iter()
            .map(|l| l.as_ref().map(|(_, id)| id.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&found), ids(&again), "not the same twice");
    if let [one] = &descriptors[..] {
        let alone = set.find(domain, one).map(|(_, id)| id);
        assert_eq!(ids(&found), vec![alone], "limits_for and find differ");
    }
}

/// Core's decoder of a held lease as shared data keeps it (`Held::decode`): the filter reads
/// whatever another worker, an older module or a corrupted zone left. Any bytes decode or
/// not without a panic, and what decodes encodes back to bytes that decode the same.
pub fn held_leases(data: &[u8]) {
    use sluice_core::lease::held::Held;
    if let Some((key, held)) = Held::decode(data) {
        let again = Held::decode(&held.encode(&key));
        assert_eq!(again, Some((key, held)), "{data:?}");
    }
}

/// What the RLQS server makes of Envoy's reports (`grpc::rlqs::bucket`, `assign`): a bucket id
/// of any entries (the input's text: `key=value` a line, after eight bytes of numbers: the
/// requests used, the seconds they took, a grant, a ttl) read into a key or refused, resolved
/// against examples/rlqs.toml, and the demand it shows sized into a bucket. A key holds at
/// most 32 entries of 1 to 1,024 bytes; a resolved rule is a leased one of the set; a demand
/// is at most what was used; a plan stays within the rule's rate and, where a grant can pay
/// for a token a second at all, within what one grant holds; a fit within what was granted.
pub fn rlqs_reports(data: &[u8]) {
    use std::collections::HashMap;

    use sluice_service::grpc::rlqs::assign::{demand_per_s, fit, plan, Room, Strategy};
    use sluice_service::grpc::rlqs::bucket::{key_of, resolve, Resolved, MAX_ENTRIES, MAX_ENTRY_BYTES};
    static RULES: std::sync::OnceLock<RuleSet> = std::sync::OnceLock::new();
    let rules =
        RULES.get_or_init(|| RuleSet::from_toml(include_str!("../../examples/rlqs.toml")).expect("the example reads"));
    let Some((numbers, text)) = data.split_first_chunk::<8>() else {
        return;
    };
    let [used, seconds, granted, ttl, per_s, capacity, domain, prefix] = numbers.map(u64::from);
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let entries: HashMap<String, String> = text
        .lines()
        .map(|l| l.split_once('=').unwrap_or((l, "")))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    if let Ok(key) = key_of(&entries) {
        assert!(key.len() <= MAX_ENTRIES);
        assert!(key
            .iter()
            .all(|(k, v)| (1..=MAX_ENTRY_BYTES).contains(&k.len()) && (1..=MAX_ENTRY_BYTES).contains(&v.len())));
        let domain = ["", "per-user-leased", "edge"][(domain % 3) as usize];
        if let Resolved::Of { rule, .. } = resolve(&key, domain, rules, (prefix % 129) as u8) {
            assert!(rules.rule(&rule).is_some_and(|r| r.lease_ttl.is_some()), "{rule}");
        }
    }
    // Scaled so that every size meets every other: counts of a few to thousands.
    let used = used * used;
    let demand = demand_per_s(used, seconds * 1_000);
    assert!(demand <= used, "{demand}/s of {used} used");
    let ttl = ttl % 10 + 1;
    let room = Room {
        per_s: per_s * 4,
        capacity: capacity * capacity,
    };
    let planned = plan(demand, room, ttl);
    if let Strategy::Bucket { burst, per_s } = planned {
        assert!(
            burst >= 1 && per_s >= 1 && per_s <= room.per_s.max(1),
            "{planned:?} in {room:?}"
        );
        if room.capacity > ttl {
            assert!(
                planned.units(ttl) <= room.capacity,
                "{planned:?} for {ttl} s in {room:?}"
            );
        }
    }
    let given = fit(granted * granted, planned, ttl);
    assert!(
        given.units(ttl) <= granted * granted,
        "{given:?} of {}",
        granted * granted
    );
}
