//! The filter under arbitrary traffic and arbitrary check answers, on both hosts: header
//! bytes of any kind, methods and paths no client should send, answers that are malformed,
//! empty, huge, late or missing, streams that end before their answer, the clock jumping.
//! Property: the module never traps, and every answer it gives itself is a 429 or a 503
//! with a body and well-formed headers (token names; no CR, LF or NUL in values).

mod common;

use std::time::Duration;

use common::{cluster, config, plugin};
use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, HostOptions};

/// Header values: text, bytes no client should send, obs-text, long runs.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
        (any::<u8>(), 0usize..8_192).prop_map(|(b, n)| vec![b; n]),
        Just(b"203.0.113.9, 10.0.0.1".to_vec()),
        Just(b"\xff\xfe".to_vec()),
    ]
}

#[derive(Debug, Clone)]
struct Request {
    method: Vec<u8>,
    path: Vec<u8>,
    xff: Vec<u8>,
    identities: Vec<(&'static str, Vec<u8>)>,
}

fn request() -> impl Strategy<Value = Request> {
    let method = prop_oneof![
        Just(b"GET".to_vec()),
        Just(b"POST".to_vec()),
        value(),
        "[A-Z]{30,60}".prop_map(String::into_bytes)
    ];
    let path = prop_oneof![
        Just(b"/api/upload".to_vec()),
        "/[ -~]{0,64}".prop_map(String::into_bytes),
        value()
    ];
    let name = prop::sample::select(vec!["x-user-id", "x-api-key", "x-user-tier"]);
    (method, path, value(), prop::collection::vec((name, value()), 0..3)).prop_map(|(method, path, xff, identities)| {
        Request {
            method,
            path,
            xff,
            identities,
        }
    })
}

/// A JSON value of a field of the answer: right, wrong type, extreme, absent (`None`).
fn field() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        (0u64..100_000).prop_map(|n| Some(json!(n))),
        prop::sample::select(vec![
            json!(0),
            json!(u64::MAX),
            json!(-1),
            json!(1.5),
            json!(1e300),
            json!("10"),
            json!(null),
            json!(true),
            json!([]),
        ])
        .prop_map(Some),
    ]
}

fn answer() -> impl Strategy<Value = Answer> {
    let names = [
        "limit",
        "remaining",
        "reset_after_ms",
        "retry_after_ms",
        "reset_at",
        "window_ms",
        "delay_ms",
    ];
    let json = (
        prop::sample::select(vec![json!(true), json!(false), json!(null), json!("yes"), json!(1)]),
        any::<bool>(),
        prop::collection::vec(field(), names.len()),
        prop::option::of(prop_oneof![
            Just(json!("p")),
            "[ -~]{0,300}".prop_map(Value::from),
            Just(json!(7))
        ]),
    )
        .prop_map(move |(allowed, has_allowed, fields, policy)| {
            let mut body = serde_json::Map::new();
            if has_allowed {
                body.insert("allowed".into(), allowed);
            }
            for (name, v) in names.iter().zip(fields) {
                if let Some(v) = v {
                    body.insert((*name).into(), v);
                }
            }
            if let Some(p) = policy {
                body.insert("policy".into(), p);
            }
            Answer::Respond(200, Value::Object(body).to_string().into_bytes())
        });
    let status = prop::sample::select(vec![100u16, 200, 204, 400, 404, 429, 500, 503, 999]);
    prop_oneof![
        4 => json,
        1 => (status, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(s, b)| Answer::Respond(s, b)),
        1 => Just(Answer::Respond(200, b"{}".to_vec())),
        1 => Just(Answer::Respond(200, b"{\"allowed\": tru".to_vec())),
        1 => Just(Answer::Fail),
    ]
}

#[derive(Debug, Clone)]
enum Answer {
    Respond(u16, Vec<u8>),
    Fail,
}

#[derive(Debug, Clone)]
enum Event {
    Request(Request),
    /// Answers the pending call at this index (modulo their number).
    Answer(usize, Answer),
    /// Ends the open stream at this index (modulo), its calls cancelled.
    Finish(usize),
    /// Moves the clock: calls past their timeout fail.
    Advance(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => request().prop_map(Event::Request),
        3 => (any::<usize>(), answer()).prop_map(|(i, a)| Event::Answer(i, a)),
        1 => any::<usize>().prop_map(Event::Finish),
        1 => prop_oneof![0u64..50, 0u64..70_000].prop_map(Event::Advance),
    ]
}

/// The filter's configuration for `flavor`: fail open or closed, with or without the local
/// prefilter, a breaker that opens after 2 failures.
fn configuration(flavor: Flavor, closed: bool, local: bool) -> Value {
    let mut c = config();
    c["check"]["cluster"] = cluster(flavor).into();
    c["failure"]["mode"] = if closed { "closed" } else { "open" }.into();
    c["failure"]["breaker"] = json!({"failures": 2, "cooldown_ms": 500});
    if local {
        c["local"] = json!({"by": "ip", "rate_per_s": 5, "burst": 3, "max_keys": 50});
    } else {
        c.as_object_mut().map(|o| o.remove("local"));
    }
    c
}

/// Checks every answer the filter gave itself so far.
fn local_answers_are_well_formed(host: &Host, streams: &[u32]) -> Result<(), TestCaseError> {
    for s in streams {
        let Some(r) = host.stream(*s).and_then(|st| st.local_response.as_ref()) else {
            continue;
        };
        prop_assert!(r.status == 429 || r.status == 503, "local answer {}", r.status);
        prop_assert!(!r.body.is_empty(), "{} without a body", r.status);
        for (name, value) in &r.headers {
            prop_assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)),
                "header name {name:?} is not a token"
            );
            prop_assert!(
                !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
                "{name}: {value:?}"
            );
        }
    }
    Ok(())
}

fn run(flavor: Flavor, closed: bool, local: bool, events: Vec<Event>) -> Result<(), TestCaseError> {
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options).expect("module loads");
    let config = configuration(flavor, closed, local).to_string();
    host.start(b"", config.as_bytes()).expect("filter starts");
    let mut open: Vec<u32> = Vec::new();
    let mut seen: Vec<u32> = Vec::new();
    for event in events {
        let step = format!("{event:?}");
        let result = match event {
            Event::Request(r) => {
                let s = host.new_stream().expect("stream");
                host.set_property(s, "source.address", "127.0.0.1:5555");
                let mut headers: Vec<(&str, &[u8])> = vec![
                    (":method", &r.method),
                    (":path", &r.path),
                    (":authority", b"example.com"),
                    ("x-forwarded-for", &r.xff),
                ];
                headers.extend(r.identities.iter().map(|(k, v)| (*k, v.as_slice())));
                open.push(s);
                seen.push(s);
                host.request_headers(s, &headers, true).map(|_| ())
            }
            Event::Answer(i, answer) => {
                let calls = host.pending_calls();
                if calls.is_empty() {
                    continue;
                }
                let token = calls[i % calls.len()].token;
                match answer {
                    Answer::Respond(status, body) => host.respond_call(token, CallResponse::new(status, body)),
                    Answer::Fail => host.fail_call(token),
                }
            }
            Event::Finish(i) => {
                if open.is_empty() {
                    continue;
                }
                let s = open.remove(i % open.len());
                host.finish_stream(s)
            }
            Event::Advance(ms) => host.advance(Duration::from_millis(ms)),
        };
        prop_assert!(result.is_ok(), "{flavor:?}: {step} trapped: {:?}", result.err());
        local_answers_are_well_formed(&host, &seen)?;
    }
    for s in open {
        let result = host.finish_stream(s);
        prop_assert!(result.is_ok(), "{flavor:?}: finishing {s} trapped: {:?}", result.err());
    }
    Ok(())
}

proptest! {
    // 256 cases per host unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_traffic_and_answers_never_trap_the_filter_on_envoy(
        closed in any::<bool>(), local in any::<bool>(), events in prop::collection::vec(event(), 1..30)
    ) {
        run(Flavor::Envoy, closed, local, events)?;
    }

    #[test]
    fn arbitrary_traffic_and_answers_never_trap_the_filter_on_nginx(
        closed in any::<bool>(), local in any::<bool>(), events in prop::collection::vec(event(), 1..30)
    ) {
        run(Flavor::Nginx, closed, local, events)?;
    }
}
