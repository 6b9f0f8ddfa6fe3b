//! The `env.proxy_*` host functions, registered on a wasmtime linker.
//!
//! Each reads its arguments from guest memory with bounds checks and answers with an ABI
//! status: a bad pointer is `BadArgument`, never a trap. Returned buffers are allocated in
//! the guest with its `proxy_on_memory_allocate` (or `malloc`), as Envoy does.
//!
//! One file per area of the ABI; each takes the helpers and imports below with `use super::*`.

mod buffers;
mod calls;
mod context;
mod headers;
mod logging;
mod metrics;
mod properties;
mod shared;
mod streams;
mod stubs;
mod timers;

use std::collections::VecDeque;

use wasmtime::{Caller, Linker, Memory, Module, Val, ValType};

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
    c.data().memory
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

/// Writes `v` at `ret`: `Ok`, or `BadArgument` for a bad pointer.
fn return_u32(c: &mut Ctx<'_>, ret: i32, v: u32) -> HostResult {
    match write_u32(c, ret, v) {
        Some(()) => OK,
        None => status(Status::BadArgument),
    }
}

/// [`give`]s `value`, or answers `NotFound` when there is none.
fn give_found(c: &mut Ctx<'_>, value: Option<Vec<u8>>, ret_data: i32, ret_size: i32) -> HostResult {
    match value {
        Some(v) => give(c, &v, ret_data, ret_size),
        None => status(Status::NotFound),
    }
}

/// Copies `data` into a fresh guest allocation and stores its address and size.
fn give(c: &mut Ctx<'_>, data: &[u8], ret_data: i32, ret_size: i32) -> HostResult {
    let addr = if data.is_empty() {
        0
    } else {
        let Some(alloc) = c.data().allocate.clone() else {
            return status(Status::InternalFailure);
        };
        let addr = alloc.call(&mut *c, data.len() as i32)?;
        if addr == 0 || write(c, addr, data).is_none() {
            return status(Status::InternalFailure);
        }
        addr
    };
    match (
        write_u32(c, ret_data, addr as u32),
        write_u32(
            c,
            ret_size,
            (data.len() as u32).saturating_add(c.data().options.overstated_sizes),
        ),
    ) {
        (Some(()), Some(())) => OK,
        _ => status(Status::BadArgument),
    }
}

/// The map of `kind` for the current context, if it has one.
fn map_mut(s: &mut HostState, kind: MapType) -> Option<&mut HeaderMap> {
    // Envoy lends a filter the request's headers in its request callbacks, not its response
    // ones (seen in Envoy 1.40: `Origin` read in `proxy_on_response_headers` came back empty).
    let responding = s.hook.is_some_and(|h| h.starts_with("proxy_on_response"));
    if responding
        && s.options.flavor == Flavor::Envoy
        && matches!(kind, MapType::RequestHeaders | MapType::RequestTrailers)
    {
        return None;
    }
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

pub(crate) use stubs::{refuse, stub_missing};

/// Registers every host function the proxy-wasm Rust SDK 0.2 may import.
pub(crate) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    logging::register(linker)?;
    timers::register(linker)?;
    buffers::register(linker)?;
    headers::register(linker)?;
    properties::register(linker)?;
    shared::register(linker)?;
    streams::register(linker)?;
    calls::register(linker)?;
    context::register(linker)?;
    metrics::register(linker)?;
    Ok(())
}
