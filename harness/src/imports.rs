//! The `env.proxy_*` host functions, registered on a wasmtime linker.
//!
//! Each reads its arguments from guest memory with bounds checks and answers with an ABI
//! status: a bad pointer is `BadArgument`, never a trap. Returned buffers are allocated in
//! the guest with its `proxy_on_memory_allocate` (or `malloc`), as Envoy does.

use std::collections::VecDeque;

use wasmtime::{Caller, Extern, Linker, Memory, Module, Val, ValType};

use crate::abi::{BufferType, LogLevel, MapType, MetricType, Status};
use crate::map;
use crate::state::{HeaderMap, HostState, LocalResponse, LogRecord, Metric, PendingCall, Stream};
use crate::Flavor;

type Ctx<'a> = Caller<'a, HostState>;
type HostResult = wasmtime::Result<i32>;

const OK: HostResult = Ok(Status::Ok as i32);

fn status(s: Status) -> HostResult {
    Ok(s as i32)
}

fn memory(c: &mut Ctx<'_>) -> Option<Memory> {
    c.get_export("memory").and_then(Extern::into_memory)
}

fn read(c: &mut Ctx<'_>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let mem = memory(c)?;
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    mem.data(&*c).get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
}

fn read_str(c: &mut Ctx<'_>, ptr: i32, len: i32) -> Option<String> {
    read(c, ptr, len).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn write(c: &mut Ctx<'_>, ptr: i32, bytes: &[u8]) -> Option<()> {
    let mem = memory(c)?;
    let start = ptr as u32 as usize;
    mem.data_mut(&mut *c)
        .get_mut(start..start.checked_add(bytes.len())?)?
        .copy_from_slice(bytes);
    Some(())
}

fn write_u32(c: &mut Ctx<'_>, ptr: i32, v: u32) -> Option<()> {
    write(c, ptr, &v.to_le_bytes())
}

/// Copies `data` into a fresh guest allocation and stores its address and size.
fn give(c: &mut Ctx<'_>, data: &[u8], ret_data: i32, ret_size: i32) -> HostResult {
    let addr = if data.is_empty() {
        0
    } else {
        let alloc = c
            .get_export("proxy_on_memory_allocate")
            .or_else(|| c.get_export("malloc"))
            .and_then(Extern::into_func);
        let Some(alloc) = alloc else {
            return status(Status::InternalFailure);
        };
        let mut out = [Val::I32(0)];
        alloc.call(&mut *c, &[Val::I32(data.len() as i32)], &mut out)?;
        let addr = out[0].i32().unwrap_or(0);
        if addr == 0 || write(c, addr, data).is_none() {
            return status(Status::InternalFailure);
        }
        addr
    };
    match (
        write_u32(c, ret_data, addr as u32),
        write_u32(c, ret_size, data.len() as u32),
    ) {
        (Some(()), Some(())) => OK,
        _ => status(Status::BadArgument),
    }
}

/// The map of `kind` for the current context, if it has one.
fn map_mut(s: &mut HostState, kind: MapType) -> Option<&mut HeaderMap> {
    match kind {
        MapType::CallResponseHeaders => s.call_reply.as_mut().map(|r| &mut r.headers),
        MapType::CallResponseTrailers => s.call_reply.as_mut().map(|r| &mut r.trailers),
        _ => {
            let stream = s.streams.get_mut(&s.current)?;
            Some(match kind {
                MapType::RequestHeaders => &mut stream.request_headers,
                MapType::RequestTrailers => &mut stream.request_trailers,
                MapType::ResponseHeaders => &mut stream.response_headers,
                _ => &mut stream.response_trailers,
            })
        }
    }
}

fn nginx_trap(c: &mut Ctx<'_>, name: &str) -> wasmtime::Result<()> {
    if c.data().options.flavor == Flavor::Nginx {
        nginx_trap_with(
            c,
            &format!("{name} is not supported by ngx_wasm_module: the call traps there"),
        )?;
    }
    Ok(())
}

/// Traps as ngx_wasm_module does, with its message.
fn nginx_trap_with(c: &mut Ctx<'_>, msg: &str) -> HostResult {
    c.data_mut().nginx_trap = Some(msg.to_owned());
    Err(wasmtime::Error::msg(msg.to_owned()))
}

fn current_stream(s: &mut HostState) -> Option<&mut Stream> {
    let id = s.current;
    s.streams.get_mut(&id)
}

/// Values a histogram keeps (the first ones recorded): 8 bytes each, 1 MiB at most.
const MAX_HISTOGRAM_RECORDS: usize = 128 * 1024;

/// Registers every host function the proxy-wasm Rust SDK 0.2 may import.
pub(crate) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: Ctx<'_>, level: i32, ptr: i32, len: i32| -> HostResult {
            let Some(message) = read_str(&mut c, ptr, len) else {
                return status(Status::BadArgument);
            };
            let context_id = c.data().current;
            let level = LogLevel::from_raw(level);
            tracing::debug!(target: "wasm", ?level, context_id, "{message}");
            c.data_mut().logs.push(LogRecord {
                level,
                context_id,
                message,
            });
            OK
        },
    )?;
    linker.func_wrap("env", "proxy_get_log_level", |mut c: Ctx<'_>, ret: i32| -> HostResult {
        nginx_trap(&mut c, "proxy_get_log_level")?;
        match write_u32(&mut c, ret, 0) {
            Some(()) => OK,
            None => status(Status::BadArgument),
        }
    })?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Ctx<'_>, ret: i32| -> HostResult {
            let mut now = c.data().clock_ns;
            if c.data().options.flavor == Flavor::Nginx {
                now -= now % 1_000_000; // ngx_wasm_module's clock has millisecond resolution
            }
            match write(&mut c, ret, &now.to_le_bytes()) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: Ctx<'_>, period: i32| -> HostResult {
            if c.data().options.flavor == Flavor::Nginx {
                // ngx_proxy_wasm_hfuncs_set_tick_period: root context only, and once.
                if c.data().current != c.data().root_id {
                    return nginx_trap_with(&mut c, "can only set tick_period in root context");
                }
                if period != 0 && c.data().tick_period_ms != 0 {
                    return nginx_trap_with(&mut c, "tick_period already set");
                }
            }
            let s = c.data_mut();
            s.tick_period_ms = period as u32;
            s.next_tick_ns = s.clock_ns + u64::from(period as u32) * 1_000_000;
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Ctx<'_>, kind: i32, start: i32, max: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let s = c.data();
            let buffer: Option<&[u8]> = match BufferType::from_raw(kind) {
                Some(BufferType::PluginConfiguration) => Some(&s.plugin_config),
                Some(BufferType::VmConfiguration) => Some(&s.vm_config),
                Some(BufferType::CallResponseBody) => s.call_reply.as_ref().map(|r| r.body.as_slice()),
                Some(BufferType::RequestBody) => s.streams.get(&s.current).map(|st| st.request_body.as_slice()),
                Some(BufferType::ResponseBody) => s.streams.get(&s.current).map(|st| st.response_body.as_slice()),
                None => return status(Status::BadArgument),
            };
            let Some(buffer) = buffer else {
                return status(Status::NotFound);
            };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            if buffer.is_empty() {
                return status(Status::NotFound);
            }
            let end = start.saturating_add(max).min(buffer.len());
            let slice = buffer.get(start..end).unwrap_or_default().to_vec();
            give(&mut c, &slice, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Ctx<'_>, kind: i32, start: i32, size: i32, ptr: i32, len: i32| -> HostResult {
            let Some(data) = read(&mut c, ptr, len) else {
                return status(Status::BadArgument);
            };
            let kind = BufferType::from_raw(kind);
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            let buffer = match kind {
                Some(BufferType::RequestBody) => &mut stream.request_body,
                Some(BufferType::ResponseBody) => &mut stream.response_body,
                _ => return status(Status::BadArgument),
            };
            let start = (start as u32 as usize).min(buffer.len());
            let end = start.saturating_add(size as u32 as usize).min(buffer.len());
            buffer.splice(start..end, data);
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Ctx<'_>, kind: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let bytes = map_mut(c.data_mut(), kind)
                .map(|m| map::serialize(m))
                .unwrap_or_else(|| map::serialize::<&[u8]>(&[]));
            give(&mut c, &bytes, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Ctx<'_>, kind: i32, ptr: i32, len: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let Some(pairs) = read(&mut c, ptr, len).and_then(|b| map::deserialize(&b)) else {
                return status(Status::BadArgument);
            };
            match map_mut(c.data_mut(), kind) {
                Some(m) => {
                    *m = pairs;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let Some(key) = read_str(&mut c, kptr, klen) else {
                return status(Status::BadArgument);
            };
            let value = map_mut(c.data_mut(), kind).and_then(|m| {
                m.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(&key))
                    .map(|(_, v)| v.clone())
            });
            match value {
                Some(v) => give(&mut c, &v, ret_data, ret_size),
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, Some((vptr, vlen)), true)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, Some((vptr, vlen)), false)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, None, true)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: Ctx<'_>, pptr: i32, plen: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(path) = read(&mut c, pptr, plen) else {
                return status(Status::BadArgument);
            };
            let path = property_path(&path);
            let s = c.data();
            let value = s
                .streams
                .get(&s.current)
                .and_then(|st| st.properties.get(&path))
                .or_else(|| s.root_properties.get(&path))
                .cloned();
            match value {
                Some(v) => give(&mut c, &v, ret_data, ret_size),
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: Ctx<'_>, pptr: i32, plen: i32, vptr: i32, vlen: i32| -> HostResult {
            let (Some(path), Some(value)) = (read(&mut c, pptr, plen), read(&mut c, vptr, vlen)) else {
                return status(Status::BadArgument);
            };
            let path = property_path(&path);
            let s = c.data_mut();
            match s.streams.get_mut(&s.current) {
                Some(st) => st.properties.insert(path, value),
                None => s.root_properties.insert(path, value),
            };
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: Ctx<'_>, kptr: i32, klen: i32, ret_data: i32, ret_size: i32, ret_cas: i32| -> HostResult {
            let Some(key) = read_str(&mut c, kptr, klen) else {
                return status(Status::BadArgument);
            };
            let Some((value, cas)) = c.data().shared.get(&key).cloned() else {
                return status(Status::NotFound);
            };
            if write_u32(&mut c, ret_cas, cas).is_none() {
                return status(Status::BadArgument);
            }
            give(&mut c, &value, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Ctx<'_>, kptr: i32, klen: i32, vptr: i32, vlen: i32, cas: i32| -> HostResult {
            let (Some(key), Some(value)) = (read_str(&mut c, kptr, klen), read(&mut c, vptr, vlen)) else {
                return status(Status::BadArgument);
            };
            let shared = &mut c.data_mut().shared;
            let current = shared.get(&key).map_or(0, |(_, v)| *v);
            if cas != 0 && cas as u32 != current {
                return status(Status::CasMismatch);
            }
            shared.insert(key, (value, current.wrapping_add(1).max(1)));
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: Ctx<'_>, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let queues = &mut c.data_mut().queues;
            let id = match queues.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    queues.push((name, VecDeque::new()));
                    queues.len() - 1
                }
            };
            match write_u32(&mut c, ret, id as u32 + 1) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: Ctx<'_>, _vptr: i32, _vlen: i32, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_resolve_shared_queue")?;
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let Some(i) = c.data().queues.iter().position(|(n, _)| *n == name) else {
                return status(Status::NotFound);
            };
            match write_u32(&mut c, ret, i as u32 + 1) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: Ctx<'_>, id: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some((_, q)) = c.data_mut().queues.get_mut((id as u32 as usize).wrapping_sub(1)) else {
                return status(Status::NotFound);
            };
            match q.pop_front() {
                Some(v) => give(&mut c, &v, ret_data, ret_size),
                None => status(Status::Empty),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: Ctx<'_>, id: i32, vptr: i32, vlen: i32| -> HostResult {
            let Some(value) = read(&mut c, vptr, vlen) else {
                return status(Status::BadArgument);
            };
            match c.data_mut().queues.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some((_, q)) => {
                    q.push_back(value);
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: Ctx<'_>, kind: i32| -> HostResult {
            if c.data().options.flavor == Flavor::Nginx && c.data().current == c.data().root_id {
                // With set_effective_context a no-op, a root's on_tick that resumes a stream
                // reaches ngx_wasm_module with no request to resume (its source dereferences
                // the root's missing request context): never rely on it.
                return nginx_trap_with(
                    &mut c,
                    "resume outside a request context: the root has no request to resume",
                );
            }
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            match kind {
                0 => stream.request_resumes += 1,
                1 => stream.response_resumes += 1,
                _ => return status(Status::BadArgument),
            }
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: Ctx<'_>, _kind: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_close_stream")?;
            match current_stream(c.data_mut()) {
                Some(stream) => {
                    stream.closed = true;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Ctx<'_>,
         code: i32,
         dptr: i32,
         dlen: i32,
         bptr: i32,
         blen: i32,
         hptr: i32,
         hlen: i32,
         _grpc: i32|
         -> HostResult {
            let details = read_str(&mut c, dptr, dlen).unwrap_or_default();
            let Some(body) = read(&mut c, bptr, blen) else {
                return status(Status::BadArgument);
            };
            let headers = if hlen == 0 {
                Some(Vec::new())
            } else {
                read(&mut c, hptr, hlen).and_then(|b| map::deserialize_text(&b))
            };
            let Some(headers) = headers else {
                return status(Status::BadArgument);
            };
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            stream.local_response = Some(LocalResponse {
                status: code as u16,
                details,
                headers,
                body,
            });
            OK
        },
    )?;
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
            match write_u32(&mut c, ret, token) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: Ctx<'_>, code: i32, ret_data: i32, ret_size: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_get_status")?;
            if write_u32(&mut c, code, 0).is_none() {
                return status(Status::BadArgument);
            }
            give(&mut c, &[], ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: Ctx<'_>, id: i32| -> HostResult {
            let id = id as u32;
            let s = c.data_mut();
            if s.options.flavor == Flavor::Nginx {
                return OK; // ngx_proxy_wasm_hfuncs_set_effective_context: answers Ok, does nothing
            }
            if id != s.root_id && !s.streams.contains_key(&id) {
                return status(Status::BadArgument);
            }
            s.current = id;
            OK
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut c: Ctx<'_>| -> HostResult {
        nginx_trap(&mut c, "proxy_done")?;
        OK
    })?;
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |_c: Ctx<'_>, _n: i32, _nl: i32, _a: i32, _al: i32, _rd: i32, _rs: i32| -> HostResult {
            status(Status::NotFound)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: Ctx<'_>, kind: i32, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let kind = match kind {
                0 => MetricType::Counter,
                1 => MetricType::Gauge,
                2 => MetricType::Histogram,
                _ => return status(Status::BadArgument),
            };
            let metrics = &mut c.data_mut().metrics;
            let id = match metrics.iter().position(|m| m.name == name) {
                Some(i) => i,
                None => {
                    metrics.push(Metric {
                        name,
                        kind,
                        value: 0,
                        records: Vec::new(),
                    });
                    metrics.len() - 1
                }
            };
            match write_u32(&mut c, ret, id as u32 + 1) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: Ctx<'_>, id: i32, offset: i64| -> HostResult {
            match c.data_mut().metrics.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some(m) if m.kind != MetricType::Histogram => {
                    m.value = m.value.saturating_add(offset);
                    OK
                }
                Some(_) => status(Status::BadArgument),
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: Ctx<'_>, id: i32, value: i64| -> HostResult {
            match c.data_mut().metrics.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some(m) if m.kind == MetricType::Histogram => {
                    // A long-running proxy keeps the first records only, so its memory stays
                    // flat; tests read far fewer than this.
                    if m.records.len() < MAX_HISTOGRAM_RECORDS {
                        m.records.push(value as u64);
                    }
                    OK
                }
                Some(m) => {
                    m.value = value;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: Ctx<'_>, id: i32, ret: i32| -> HostResult {
            let Some(value) = c
                .data()
                .metrics
                .get((id as u32 as usize).wrapping_sub(1))
                .map(|m| m.value)
            else {
                return status(Status::NotFound);
            };
            match write(&mut c, ret, &(value as u64).to_le_bytes()) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    Ok(())
}

fn edit_map(c: &mut Ctx<'_>, kind: i32, kptr: i32, klen: i32, value: Option<(i32, i32)>, replace: bool) -> HostResult {
    let Some(kind) = MapType::from_raw(kind) else {
        return status(Status::BadArgument);
    };
    let Some(key) = read_str(c, kptr, klen) else {
        return status(Status::BadArgument);
    };
    let value = match value {
        Some((p, l)) => match read(c, p, l) {
            Some(v) => Some(v),
            None => return status(Status::BadArgument),
        },
        None => None,
    };
    let Some(m) = map_mut(c.data_mut(), kind) else {
        return status(Status::NotFound);
    };
    if replace {
        m.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
    }
    if let Some(v) = value {
        m.push((key.to_ascii_lowercase(), v));
    }
    OK
}

/// A property path from the ABI's NUL-separated segments to the dotted form.
fn property_path(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).trim_end_matches('\0').replace('\0', ".")
}

/// Defines every other `env` import of `module` as a function that logs and returns
/// `Unimplemented`, so a module never traps because the harness lacks a host function. In
/// the Nginx flavor it traps instead: ngx_wasm_module's not-yet-implemented host functions
/// (the `proxy_grpc_*` calls among them) do.
pub(crate) fn stub_missing(linker: &mut Linker<HostState>, module: &Module) -> wasmtime::Result<()> {
    let missing: Vec<_> = module
        .imports()
        .filter(|i| i.module() == "env")
        .filter_map(|i| i.ty().func().cloned().map(|f| (i.name().to_owned(), f)))
        .collect();
    for (name, ty) in missing {
        let fname = name.clone();
        let result_types: Vec<ValType> = ty.results().collect();
        let defined = linker.func_new("env", &name, ty, move |mut c: Caller<'_, HostState>, _args, results| {
            c.data_mut().unimplemented.push(fname.clone());
            if c.data().options.flavor == Flavor::Nginx {
                let msg = format!("{fname} is not implemented by ngx_wasm_module (NYI): it traps");
                c.data_mut().nginx_trap = Some(msg.clone());
                return Err(wasmtime::Error::msg(msg));
            }
            tracing::warn!(function = %fname, "host function not implemented by the harness: returning Unimplemented");
            for (r, t) in results.iter_mut().zip(&result_types) {
                *r = match t {
                    ValType::I64 => Val::I64(Status::Unimplemented as i64),
                    _ => Val::I32(Status::Unimplemented as i32),
                };
            }
            Ok(())
        });
        // Already defined: a function the harness implements.
        drop(defined);
    }
    Ok(())
}

/// Why ngx_wasm_module's `ngx_wasm_socket_tcp_init` refuses `upstream` (`host[:port]`, port
/// 80 by default, IPv6 in brackets), if it does.
pub(crate) fn nginx_upstream_problem(upstream: &str) -> Option<String> {
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
