//! The harness as a test library, driven through a module written with the proxy-wasm Rust
//! SDK (harness/probe-module): every supported host function and Envoy's stream semantics.

mod common;

use std::time::Duration;

use common::{header, host, host_with, request};
use sluice_harness::abi::{LogLevel, Status};
use sluice_harness::{CallResponse, Flavor, HarnessError, Host, HostOptions, Outcome};

fn logged(host: &Host, level: LogLevel, needle: &str) -> bool {
    host.logs()
        .iter()
        .any(|l| l.level == level && l.message.contains(needle))
}

#[test]
fn start_runs_vm_start_and_configure_with_their_configurations() {
    let host = host_with("tick=250", HostOptions::default());
    assert!(logged(&host, LogLevel::Info, "probe vm started (9 bytes): vm-config"));
    assert!(logged(&host, LogLevel::Info, "probe configured: tick=250"));
    assert_eq!(host.next_tick_ns(), Some(host.now_ns() + 250_000_000));
}

#[test]
fn configure_returning_false_is_a_failed_start() {
    let mut host = Host::from_plugin(common::plugin(), HostOptions::default()).unwrap();
    let err = host.start(b"", b"fail").unwrap_err();
    assert!(matches!(err, HarnessError::StartRefused("proxy_on_configure")), "{err}");
    assert!(logged(&host, LogLevel::Error, "probe refuses its configuration"));
}

#[test]
fn streams_get_their_own_context_ids_and_share_the_root() {
    let mut host = host();
    let (a, oa) = request(&mut host, "shared", &[]);
    let (b, ob) = request(&mut host, "shared", &[]);
    assert_eq!((oa, ob), (Outcome::Continue, Outcome::Continue));
    assert_ne!(a, b);
    assert!(a > 1 && b > 1, "context 1 is the root's");
    assert_eq!(header(&host, a, "x-context-id"), Some(a.to_string()));
    assert_eq!(header(&host, b, "x-context-id"), Some(b.to_string()));
    // One VM: the second stream sees the first one's shared data, via CAS.
    assert_eq!(header(&host, a, "x-shared").as_deref(), Some("1"));
    assert_eq!(header(&host, b, "x-shared").as_deref(), Some("2"));
    let (value, cas) = host.shared_data("probe_counter").unwrap();
    assert_eq!(value, b"2");
    assert!(cas >= 2);
}

#[test]
fn header_map_functions_get_replace_remove_add_and_set_all() {
    let mut host = host();
    let (s, _) = request(
        &mut host,
        "headers",
        &[("x-get", "got it"), ("x-replace", "old"), ("x-remove", "bye")],
    );
    let st = host.stream(s).unwrap();
    assert_eq!(header(&host, s, "x-got").as_deref(), Some("got it"));
    assert_eq!(header(&host, s, "x-replace").as_deref(), Some("replaced"));
    assert_eq!(header(&host, s, "x-remove"), None);
    assert_eq!(header(&host, s, "x-count-arg").as_deref(), Some("7"));
    assert_eq!(header(&host, s, "x-end-of-stream").as_deref(), Some("false"));
    assert_eq!(header(&host, s, ":path").as_deref(), Some("/probe?q=1"));
    assert!(st.request_headers.iter().any(|(k, _)| k == "x-context-id"));

    let (s, _) = request(&mut host, "set-all", &[("x-drop", "1"), ("x-keep", "2")]);
    assert_eq!(header(&host, s, "x-drop"), None);
    assert_eq!(header(&host, s, "x-keep").as_deref(), Some("2"));
    assert_eq!(header(&host, s, "x-set-all").as_deref(), Some("yes"));
    assert_eq!(header(&host, s, ":method").as_deref(), Some("GET"));
}

#[test]
fn a_local_response_ends_the_stream() {
    let mut host = host();
    let (s, outcome) = request(&mut host, "respond", &[]);
    let Outcome::LocalResponse(r) = outcome else {
        panic!("expected a local response, got {outcome:?}");
    };
    assert_eq!(r.status, 418);
    assert_eq!(r.header("x-probe"), Some("teapot"));
    assert_eq!(r.body, b"short and stout");
    assert_eq!(host.stream(s).unwrap().request_resumes, 0);
    assert!(host.pending_calls().is_empty());
}

#[test]
fn a_dispatched_call_pauses_until_its_response_then_resumes() {
    let mut host = host();
    let (s, outcome) = request(&mut host, "call", &[("x-timeout-ms", "300")]);
    assert_eq!(outcome, Outcome::Pause);
    let calls = host.pending_calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.upstream, "backend");
    assert_eq!(call.context_id, s);
    assert_eq!(call.timeout_ms, 300);
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":path"), Some("/probe"));
    assert_eq!(call.body, b"ping");

    // Time passing short of the timeout resumes nothing: only continue_stream does.
    host.advance(Duration::from_millis(299)).unwrap();
    assert_eq!(host.stream(s).unwrap().request_resumes, 0);

    let mut answer = CallResponse::new(201, "pong");
    answer.headers.push(("x-backend".into(), "yes".into()));
    host.respond_call(call.token, answer).unwrap();
    assert_eq!(host.stream(s).unwrap().request_resumes, 1);
    assert_eq!(header(&host, s, "x-call-status").as_deref(), Some("201"));
    assert_eq!(header(&host, s, "x-call-headers").as_deref(), Some("2"));
    assert_eq!(header(&host, s, "x-call-body").as_deref(), Some("pong"));
    assert!(host.pending_calls().is_empty());
    assert!(matches!(
        host.respond_call(call.token, CallResponse::new(200, "")),
        Err(HarnessError::NoSuchCall(_))
    ));
}

#[test]
fn a_call_that_times_out_arrives_with_no_headers() {
    let mut host = host();
    let (s, _) = request(&mut host, "call", &[("x-timeout-ms", "50")]);
    host.advance(Duration::from_millis(49)).unwrap();
    assert!(host.stream(s).unwrap().local_response.is_none());
    host.advance(Duration::from_millis(1)).unwrap();
    let r = host.stream(s).unwrap().local_response.clone().expect("answered");
    assert_eq!((r.status, r.body.as_slice()), (504, &b"call timed out"[..]));
    assert_eq!(host.stream(s).unwrap().request_resumes, 0);
    assert!(host.pending_calls().is_empty());
}

#[test]
fn a_call_to_an_unknown_cluster_is_refused() {
    let mut host = host();
    let (s, outcome) = request(&mut host, "bad-cluster", &[]);
    assert_eq!(outcome, Outcome::Continue);
    assert_eq!(header(&host, s, "x-call-error").as_deref(), Some("BadArgument"));
    assert!(host.pending_calls().is_empty());
}

#[test]
fn finishing_a_stream_cancels_its_calls_and_runs_on_log() {
    let mut host = host();
    let (s, _) = request(&mut host, "call", &[]);
    assert_eq!(host.pending_calls().len(), 1);
    host.finish_stream(s).unwrap();
    assert!(host.pending_calls().is_empty());
    assert!(host.stream(s).is_none());
    assert!(logged(&host, LogLevel::Debug, &format!("probe stream {s} done")));
    assert!(matches!(host.finish_stream(s), Err(HarnessError::NoSuchStream(_))));
}

#[test]
fn ticks_follow_the_virtual_clock_and_can_resume_streams() {
    let mut host = host_with("tick=100", HostOptions::default());
    let (s, outcome) = request(&mut host, "pause", &[]);
    assert_eq!(outcome, Outcome::Pause);
    host.advance(Duration::from_millis(99)).unwrap();
    assert_eq!(host.metric("probe_ticks"), Some(0));
    assert_eq!(host.stream(s).unwrap().request_resumes, 0);
    host.advance(Duration::from_millis(1)).unwrap();
    assert_eq!(host.metric("probe_ticks"), Some(1));
    assert_eq!(host.stream(s).unwrap().request_resumes, 1);
    host.advance(Duration::from_millis(1000)).unwrap();
    assert_eq!(host.metric("probe_ticks"), Some(11));
    assert_eq!(host.stream(s).unwrap().request_resumes, 1, "resumed once");
}

#[test]
fn the_module_reads_the_virtual_clock() {
    let mut host = host();
    let (a, _) = request(&mut host, "time", &[]);
    let t0: u128 = header(&host, a, "x-now-ns").unwrap().parse().unwrap();
    assert_eq!(t0, u128::from(host.now_ns()));
    host.advance(Duration::from_millis(1500)).unwrap();
    let (b, _) = request(&mut host, "time", &[]);
    let t1: u128 = header(&host, b, "x-now-ns").unwrap().parse().unwrap();
    assert_eq!(t1 - t0, 1_500_000_000);
}

#[test]
fn properties_come_from_the_request_and_can_be_set() {
    let mut host = host();
    let (s, _) = request(&mut host, "props", &[]);
    assert_eq!(header(&host, s, "x-source").as_deref(), Some("192.0.2.7:4242"));
    assert_eq!(header(&host, s, "x-path").as_deref(), Some("/probe?q=1"));
    assert_eq!(header(&host, s, "x-method").as_deref(), Some("GET"));
    assert_eq!(header(&host, s, "x-mark").as_deref(), Some("set by the module"));
    assert_eq!(header(&host, s, "x-log-level").as_deref(), Some("Trace"));
}

#[test]
fn shared_queues_register_resolve_enqueue_and_dequeue() {
    let mut host = host();
    let (s, _) = request(&mut host, "queue", &[]);
    assert_eq!(header(&host, s, "x-queue"), Some(format!("true:hello from {s}")));
}

#[test]
fn metrics_are_defined_incremented_recorded_and_read() {
    let mut host = host();
    for _ in 0..3 {
        request(&mut host, "metrics", &[]);
    }
    let (s, _) = request(&mut host, "metrics", &[("x-extra", "1")]);
    assert_eq!(header(&host, s, "x-metric").as_deref(), Some("4"));
    assert_eq!(host.metric("probe_requests"), Some(4));
    assert_eq!(host.metric("probe_gauge"), Some(42));
    assert_eq!(host.histogram("probe_header_count"), Some(&[4, 4, 4, 5][..]));
    let mut names = host.metric_names();
    names.sort();
    assert_eq!(
        names,
        ["probe_gauge", "probe_header_count", "probe_requests", "probe_ticks"]
    );
}

#[test]
fn an_unsupported_host_function_answers_unimplemented_and_is_logged() {
    let mut host = host();
    let (s, outcome) = request(&mut host, "unimplemented", &[]);
    assert_eq!(outcome, Outcome::Continue, "the module did not trap");
    assert_eq!(header(&host, s, "x-status").as_deref(), Some("12"));
    assert_eq!(host.unimplemented_calls(), ["proxy_probe_missing_function"]);
}

#[test]
fn refused_calls_answer_their_status_in_place_of_the_host_function() {
    let options = HostOptions {
        refused_calls: vec![
            ("proxy_resolve_shared_queue".into(), Status::NotFound),
            ("proxy_grpc_cancel".into(), Status::BadArgument),
        ],
        ..HostOptions::default()
    };
    let mut host = host_with("", options);
    let (s, _) = request(&mut host, "queue", &[]);
    assert_eq!(header(&host, s, "x-queue").as_deref(), Some("NotFound"));
    let (s, _) = request(&mut host, "grpc", &[]);
    assert_eq!(header(&host, s, "x-status").as_deref(), Some("2"));
    assert!(host.unimplemented_calls().is_empty(), "refused, not stubbed");
}

#[test]
fn logs_carry_level_and_context() {
    let mut host = host();
    let (s, _) = request(&mut host, "log", &[]);
    let record = host.logs().iter().find(|l| l.message.contains("says hello")).unwrap();
    assert_eq!(record.level, LogLevel::Warn);
    assert_eq!(record.context_id, s);
}

#[test]
fn bodies_are_buffered_until_end_of_stream_and_can_be_replaced() {
    let mut host = host();
    let (s, _) = request(&mut host, "body", &[]);
    assert_eq!(host.request_body(s, b"hello ", false).unwrap(), Outcome::Pause);
    assert_eq!(host.request_body(s, b"world", true).unwrap(), Outcome::Continue);
    assert_eq!(host.stream(s).unwrap().request_body, b"HELLO WORLD");
    assert_eq!(host.request_trailers(s, &[("x-t", "1")]).unwrap(), Outcome::Continue);
    let trailers = &host.stream(s).unwrap().request_trailers;
    assert!(
        trailers.contains(&("x-probe-trailer".into(), "seen".into())),
        "{trailers:?}"
    );

    let outcome = host.response_headers(s, &[(":status", "200")], false).unwrap();
    assert_eq!(outcome, Outcome::Continue);
    let rh = &host.stream(s).unwrap().response_headers;
    assert!(rh.contains(&("x-probe-response".into(), "body 200".into())), "{rh:?}");
    assert_eq!(host.response_body(s, b"SHOUTED", true).unwrap(), Outcome::Continue);
    assert_eq!(host.stream(s).unwrap().response_body, b"shouted");
}

#[test]
fn nginx_flavor_never_reports_end_of_stream_in_header_callbacks() {
    let mut host = host_with(
        "",
        HostOptions {
            flavor: Flavor::Nginx,
            ..HostOptions::default()
        },
    );
    let s = host.new_stream().unwrap();
    let headers = [(":method", "GET"), (":path", "/"), ("x-probe", "headers")];
    host.request_headers(s, &headers, true).unwrap();
    assert_eq!(header(&host, s, "x-end-of-stream").as_deref(), Some("false"));

    let mut envoy = host_with("", HostOptions::default());
    let s = envoy.new_stream().unwrap();
    envoy.request_headers(s, &headers, true).unwrap();
    assert_eq!(header(&envoy, s, "x-end-of-stream").as_deref(), Some("true"));
}

fn nginx(config: &str) -> Host {
    host_with(
        config,
        HostOptions {
            flavor: Flavor::Nginx,
            ..HostOptions::default()
        },
    )
}

/// Delivers `x-probe: mode` request headers; a trap is the error.
fn try_request(host: &mut Host, mode: &str, extra: &[(&str, &str)]) -> Result<(u32, Outcome), String> {
    let s = host.new_stream().expect("stream");
    let mut headers = vec![(":method", "GET"), (":path", "/"), ("x-probe", mode)];
    headers.extend_from_slice(extra);
    host.request_headers(s, &headers, false)
        .map(|o| (s, o))
        .map_err(|e| e.to_string())
}

#[test]
fn nginx_flavor_traps_on_a_tick_period_set_outside_the_root_context_or_twice() {
    let mut envoy = host();
    let (s, _) = try_request(&mut envoy, "tick-here", &[]).expect("Envoy allows it");
    assert_eq!(header(&envoy, s, "x-tick").as_deref(), Some("Ok(())"));

    let err = try_request(&mut nginx(""), "tick-here", &[]).expect_err("Nginx traps");
    assert!(err.contains("can only set tick_period in root context"), "{err}");

    let mut twice = Host::from_plugin(common::plugin(), HostOptions::default()).unwrap();
    twice.start(b"", b"tick-twice=10").expect("Envoy allows it");
    let mut twice = Host::from_plugin(
        common::plugin(),
        HostOptions {
            flavor: Flavor::Nginx,
            ..HostOptions::default()
        },
    )
    .unwrap();
    let err = twice.start(b"", b"tick-twice=10").expect_err("Nginx traps").to_string();
    assert!(err.contains("tick_period already set"), "{err}");
}

#[test]
fn nginx_flavor_cannot_resume_a_stream_from_a_tick() {
    // proxy_set_effective_context answers Ok and does nothing: the resume acts on the root.
    let mut host = nginx("tick=10");
    let (s, outcome) = request(&mut host, "pause", &[]);
    assert_eq!(outcome, Outcome::Pause);
    let err = host
        .advance(Duration::from_millis(10))
        .expect_err("the resume traps")
        .to_string();
    assert!(err.contains("resume outside a request context"), "{err}");
    assert_eq!(host.stream(s).unwrap().request_resumes, 0, "resumed from on_tick");
}

#[test]
fn nginx_flavor_traps_on_grpc_calls_where_envoy_answers_unimplemented() {
    let mut envoy = host();
    let (s, outcome) = request(&mut envoy, "grpc", &[]);
    assert_eq!(outcome, Outcome::Continue);
    assert_eq!(header(&envoy, s, "x-status").as_deref(), Some("12"));
    let err = try_request(&mut nginx(""), "grpc", &[]).expect_err("Nginx traps");
    assert!(
        err.contains("proxy_grpc_cancel is not implemented by ngx_wasm_module"),
        "{err}"
    );
}

#[test]
fn nginx_flavor_traps_on_the_calls_ngx_wasm_module_refuses_where_envoy_answers() {
    // (probe mode, host function, what Envoy answers): every case is checked, then the
    // problems are reported together.
    let cases = [
        ("log-level", "proxy_get_log_level", "Ok(Trace)"),
        ("done", "proxy_done", "Ok(())"),
        ("close-stream", "proxy_close_stream", "Ok(())"),
        ("get-status", "proxy_get_status", "Ok((0, None))"),
        ("resolve-queue", "proxy_resolve_shared_queue", "Ok(None)"),
    ];
    let mut problems = Vec::new();
    for (mode, function, answer) in cases {
        let mut envoy = host();
        match try_request(&mut envoy, mode, &[]) {
            Ok((s, _)) if header(&envoy, s, "x-status").as_deref() == Some(answer) => {}
            Ok((s, _)) => problems.push(format!("Envoy {mode}: {:?}", header(&envoy, s, "x-status"))),
            Err(e) => problems.push(format!("Envoy {mode} trapped: {e}")),
        }
        let expected = format!("{function} is not supported by ngx_wasm_module");
        match try_request(&mut nginx(""), mode, &[]) {
            Err(e) if e.contains(&expected) => {}
            Err(e) => problems.push(format!("Nginx {mode} trapped for another reason: {e}")),
            Ok(_) => problems.push(format!("Nginx {mode}: {function} did not trap")),
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn nginx_flavor_dispatches_to_host_port_or_a_unix_socket_and_traps_on_what_it_cannot_parse() {
    let mut host = nginx("");
    let upstreams = [
        "127.0.0.1:8081",
        "[::1]:8081",
        "check.internal",
        "localhost:80",
        "unix:/run/check.sock",
    ];
    for upstream in upstreams {
        let (_, outcome) = try_request(&mut host, "dispatch-to", &[("x-upstream", upstream)]).expect(upstream);
        assert_eq!(outcome, Outcome::Pause, "{upstream}");
    }
    let calls: Vec<String> = host.pending_calls().into_iter().map(|c| c.upstream).collect();
    assert_eq!(calls, upstreams);
    for (upstream, omit, problem) in [
        (":80", "", "no host"),
        ("127.0.0.1:66000", "", "invalid port"),
        ("localhost:http", "", "invalid port"),
        ("[::1", "", "invalid host"),
        ("unix:", "", "no path in the unix domain socket"),
        ("127.0.0.1:8081", ":method", "no :method"),
        ("127.0.0.1:8081", ":path", "no :path"),
    ] {
        let err = try_request(
            &mut nginx(""),
            "dispatch-to",
            &[("x-upstream", upstream), ("x-omit", omit)],
        )
        .expect_err(upstream);
        assert!(
            err.contains("dispatch failed: ") && err.contains(problem),
            "{upstream} {omit}: {err}"
        );
    }
    // Envoy: a missing :authority is refused, Nginx fills it in.
    let (_, outcome) = try_request(
        &mut host,
        "dispatch-to",
        &[("x-upstream", "127.0.0.1:1"), ("x-omit", ":authority")],
    )
    .unwrap();
    assert_eq!(outcome, Outcome::Pause);
}
