//! The filter under arbitrary traffic and arbitrary check answers, on both hosts: header
//! bytes of any kind, methods and paths no client should send, answers that are malformed,
//! empty, huge, late or missing, streams that end before their answer, the clock jumping.
//! With leasing on or off, and the rules and lease answers as arbitrary as the checks'.
//! Property: the module never traps; every answer it gives itself is a 429 or a 503 with a
//! body and well-formed headers (token names; no CR, LF or NUL in values); and every request
//! ends: it goes on, is answered, or is resumed once its calls have run out (unless its
//! client leaves first).

mod common;

use std::time::Duration;

use common::{cluster, config, plugin};
use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_harness::{CallResponse, Flavor, Host, HostOptions, Outcome, PendingCall};

/// Leased rules: every request is limited by `per-ip`, one with a user also by `per-user`.
const RULES: &str = r#"{"rule": [
  {"name": "per-ip", "by": "ip", "algorithm": "fixed_window", "limit": 100, "window": "1m", "lease": true},
  {"name": "per-user", "by": "user", "algorithm": "token_bucket", "limit": 5, "window": "1s", "lease": true}
]}"#;

/// Longer than any call may wait: a shaping hold's most (`MAX_HOLD_MS`) and its timeout.
const CALLS_RUN_OUT: Duration = Duration::from_millis(61_000);

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
        prop_oneof![
            4 => Just(json!(true)),
            2 => Just(json!(false)),
            1 => prop::sample::select(vec![json!(null), json!("yes"), json!(1)]),
        ],
        prop::bool::weighted(0.8),
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
    prop_oneof![
        4 => json,
        1 => Just(Answer::Respond(200, b"{\"allowed\": tru".to_vec())),
        3 => anything(),
    ]
}

#[derive(Debug, Clone)]
enum Answer {
    Respond(u16, Vec<u8>),
    /// 200 with a body over the filter's 1 MiB read (a JSON value cut short there).
    Huge,
    Fail,
}

/// Answers any call may get: a status and bytes, `{}`, a huge body, none.
fn anything() -> impl Strategy<Value = Answer> {
    let status = prop::sample::select(vec![100u16, 200, 204, 304, 400, 404, 429, 500, 503, 999]);
    prop_oneof![
        (status, prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(s, b)| Answer::Respond(s, b)),
        Just(Answer::Respond(200, b"{}".to_vec())),
        Just(Answer::Huge),
        Just(Answer::Fail),
    ]
}

/// Answers to `GET /v1/rules`: the leased rules, malformed ones, anything.
fn rules_answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => Just(Answer::Respond(200, RULES.as_bytes().to_vec())),
        1 => Just(Answer::Respond(200, br#"{"rule": [{"name": 5}]}"#.to_vec())),
        1 => Just(Answer::Respond(200, RULES.as_bytes()[..40].to_vec())),
        2 => anything(),
    ]
}

/// An answer to `POST /v1/lease`: grants with arbitrary numbers (as many as asked, or
/// one more or fewer), or anything.
#[derive(Debug, Clone)]
enum LeaseAnswer {
    Grants {
        /// units, expires_in_ms, limit, remaining, reset_after_ms, window_ms.
        numbers: [u64; 6],
        /// Grants more than asked for (`asked + extra - 1`: 0 is one fewer).
        extra: usize,
    },
    Other(Answer),
}

fn lease_answer() -> impl Strategy<Value = LeaseAnswer> {
    let number = prop_oneof![4 => 0u64..200_000, 1 => Just(u64::MAX)];
    let extra = prop_oneof![6 => Just(1usize), 1 => Just(0usize), 1 => Just(2usize)];
    prop_oneof![
        3 => (prop::array::uniform6(number), extra).prop_map(|(numbers, extra)| LeaseAnswer::Grants { numbers, extra }),
        1 => Just(LeaseAnswer::Other(Answer::Respond(200, br#"{"rules_version": 1, "grants": [{"lease": 7"#.to_vec()))),
        2 => anything().prop_map(LeaseAnswer::Other),
    ]
}

/// The bytes of `answer` to `call` (a lease answer grants what the call asked for).
fn lease_reply(call: &PendingCall, answer: LeaseAnswer) -> Answer {
    let (numbers, extra) = match answer {
        LeaseAnswer::Grants { numbers, extra } => (numbers, extra),
        LeaseAnswer::Other(other) => return other,
    };
    let asked: Value = serde_json::from_slice(&call.body).unwrap_or_default();
    let asks = asked["grants"].as_array().map_or(0, Vec::len);
    let [units, expires_in_ms, limit, remaining, reset_after_ms, window_ms] = numbers;
    let grant = json!({"lease": 1, "units": units, "expires_in_ms": expires_in_ms, "limit": limit,
                       "remaining": remaining, "reset_after_ms": reset_after_ms, "window_ms": window_ms});
    let grants = vec![grant; (asks + extra).saturating_sub(1)];
    let body = json!({"rules_version": 1, "returned": [], "grants": grants});
    Answer::Respond(200, body.to_string().into_bytes())
}

/// Replies for each kind of call; the one for the call's path is used.
#[derive(Debug, Clone)]
struct Replies {
    check: Answer,
    rules: Answer,
    lease: LeaseAnswer,
}

fn replies() -> impl Strategy<Value = Replies> {
    (answer(), rules_answer(), lease_answer()).prop_map(|(check, rules, lease)| Replies { check, rules, lease })
}

/// Gives `call` its reply from `replies`.
fn reply(host: &mut Host, call: &PendingCall, replies: Replies) -> Result<(), sluice_harness::HarnessError> {
    let answer = match call.header(":path") {
        Some("/v1/rules") => replies.rules,
        Some("/v1/lease") => lease_reply(call, replies.lease),
        _ => replies.check,
    };
    match answer {
        Answer::Respond(status, body) => {
            let mut response = CallResponse::new(status, body);
            response.headers.push(("etag".into(), "\"1\"".into()));
            host.respond_call(call.token, response)
        }
        Answer::Huge => {
            let body = format!("{{\"rule\": [{}]}}", " ".repeat(1_100_000));
            host.respond_call(call.token, CallResponse::new(200, body))
        }
        Answer::Fail => host.fail_call(call.token),
    }
}

#[derive(Debug, Clone)]
enum Event {
    Request(Request),
    /// Answers the pending call at this index (modulo their number).
    Answer(usize, Replies),
    /// Ends the open stream at this index (modulo), its calls cancelled.
    Finish(usize),
    /// Moves the clock: calls past their timeout fail.
    Advance(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => request().prop_map(Event::Request),
        3 => (any::<usize>(), replies()).prop_map(|(i, r)| Event::Answer(i, r)),
        1 => any::<usize>().prop_map(Event::Finish),
        1 => prop_oneof![0u64..50, 0u64..70_000].prop_map(Event::Advance),
    ]
}

/// How the filter is configured.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Fail closed, else open.
    closed: bool,
    /// With the local prefilter.
    local: bool,
    /// With leases of the rules polled every second, on a 50 ms timer.
    lease: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(closed, local, lease)| Setup { closed, local, lease })
}

/// The filter's configuration for `flavor`: fail open or closed, with or without the local
/// prefilter and leasing, a breaker that opens after 2 failures.
fn configuration(flavor: Flavor, Setup { closed, local, lease }: Setup) -> Value {
    let mut c = config();
    c["check"]["cluster"] = cluster(flavor).into();
    c["failure"]["mode"] = if closed { "closed" } else { "open" }.into();
    c["failure"]["breaker"] = json!({"failures": 2, "cooldown_ms": 500});
    if local {
        c["local"] = json!({"by": "ip", "rate_per_s": 5, "burst": 3, "max_keys": 50});
    } else {
        c.as_object_mut().map(|o| o.remove("local"));
    }
    if lease {
        c["lease"] = json!({"tick_ms": 50, "poll_ms": 1000});
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

/// Lets every call run out, then checks that each request still open has ended: it went
/// on, or was answered or resumed.
fn every_request_ends(host: &mut Host, flavor: Flavor, paused: &[u32]) -> Result<(), TestCaseError> {
    let result = host.advance(CALLS_RUN_OUT);
    prop_assert!(
        result.is_ok(),
        "{flavor:?}: the calls running out trapped: {:?}",
        result.err()
    );
    for s in paused {
        let stream = host.stream(*s);
        let ended = stream.is_some_and(|st| st.local_response.is_some() || st.request_resumes > 0);
        prop_assert!(ended, "{flavor:?}: request {s} left paused: {stream:?}");
    }
    Ok(())
}

fn run(flavor: Flavor, setup: Setup, events: Vec<Event>) -> Result<(), TestCaseError> {
    let options = HostOptions {
        flavor,
        ..HostOptions::default()
    };
    let mut host = Host::from_plugin(plugin(), options).expect("module loads");
    let config = configuration(flavor, setup).to_string();
    host.start(b"", config.as_bytes()).expect("filter starts");
    let mut open: Vec<u32> = Vec::new();
    let mut seen: Vec<u32> = Vec::new();
    let mut paused: Vec<u32> = Vec::new();
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
                let outcome = host.request_headers(s, &headers, true);
                if matches!(outcome, Ok(Outcome::Pause)) {
                    paused.push(s);
                }
                outcome.map(drop)
            }
            Event::Answer(i, replies) => {
                let calls = host.pending_calls();
                if calls.is_empty() {
                    continue;
                }
                reply(&mut host, &calls[i % calls.len()], replies)
            }
            Event::Finish(i) => {
                if open.is_empty() {
                    continue;
                }
                let s = open.remove(i % open.len());
                paused.retain(|p| *p != s); // its client left: it need not end
                host.finish_stream(s)
            }
            Event::Advance(ms) => host.advance(Duration::from_millis(ms)),
        };
        prop_assert!(result.is_ok(), "{flavor:?}: {step} trapped: {:?}", result.err());
        local_answers_are_well_formed(&host, &seen)?;
    }
    every_request_ends(&mut host, flavor, &paused)?;
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
        setup in setup(), events in prop::collection::vec(event(), 1..30)
    ) {
        run(Flavor::Envoy, setup, events)?;
    }

    #[test]
    fn arbitrary_traffic_and_answers_never_trap_the_filter_on_nginx(
        setup in setup(), events in prop::collection::vec(event(), 1..30)
    ) {
        run(Flavor::Nginx, setup, events)?;
    }
}
