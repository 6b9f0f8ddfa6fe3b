//! Dispatched HTTP calls (Envoy clusters, or ngx_wasm_module `host:port` upstreams).

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: Ctx<'_>,
         uptr: i32,
         ulen: i32,
         hptr: i32,
         hlen: i32,
         bptr: i32,
         blen: i32,
         _tptr: i32,
         _tlen: i32,
         timeout: i32,
         ret: i32|
         -> HostResult {
            let Some(upstream) = read_str(&mut c, uptr, ulen) else {
                return status(Status::BadArgument);
            };
            let Some(headers) = read(&mut c, hptr, hlen).and_then(|b| map::deserialize_text(&b)) else {
                return status(Status::BadArgument);
            };
            let Some(body) = read(&mut c, bptr, blen) else {
                return status(Status::BadArgument);
            };
            let s = c.data();
            let has = |p: &str| headers.iter().any(|(k, _)| k == p);
            if s.options.flavor == Flavor::Nginx {
                // ngx_wasm_module fails the dispatch inside the host call, which traps, for an
                // upstream that is not `host[:port]` or a call without :method or :path; a
                // name is resolved later, and a failure then is delivered as a failed call.
                let problem = nginx_upstream_problem(&upstream)
                    .or_else(|| (!has(":method")).then(|| "no :method".to_owned()))
                    .or_else(|| (!has(":path")).then(|| "no :path".to_owned()));
                if let Some(problem) = problem {
                    return nginx_trap_with(&mut c, &format!("dispatch failed: {problem}"));
                }
            } else {
                let known = s.options.clusters.is_empty() || s.options.clusters.contains(&upstream);
                if !known || ![":method", ":path", ":authority"].iter().all(|p| has(p)) {
                    // Envoy refuses a call to an unknown cluster or without :method/:path/:authority.
                    return status(Status::BadArgument);
                }
            }
            let s = c.data_mut();
            s.next_token += 1;
            let token = s.next_token;
            let call = PendingCall {
                token,
                context_id: s.current,
                upstream,
                headers,
                body,
                timeout_ms: timeout as u32,
                dispatched_at_ns: s.clock_ns,
            };
            s.calls.insert(token, call);
            return_u32(&mut c, ret, token)
        },
    )?;
    Ok(())
}

/// Why ngx_wasm_module's `ngx_wasm_socket_tcp_init` refuses `upstream` (`host[:port]`, port
/// 80 by default, IPv6 in brackets, or `unix:PATH`), if it does.
pub(crate) fn nginx_upstream_problem(upstream: &str) -> Option<String> {
    if let Some(path) = upstream.strip_prefix("unix:") {
        return path
            .is_empty()
            .then(|| "tcp socket - no path in the unix domain socket".into());
    }
    let (host, port) = match upstream.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => return Some("tcp socket - invalid host".into()),
        },
        None => match upstream.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (upstream, None),
        },
    };
    if host.is_empty() {
        return Some("tcp socket - no host".into());
    }
    if let Some(port) = port {
        if !matches!(port.parse::<u32>(), Ok(1..=65_535)) {
            return Some("tcp socket - invalid port".into());
        }
    }
    None
}
