//! The host's way in: the functions of the proxy-wasm ABI 0.2.1 the module exports, and the
//! contexts they reach. The host creates a root context per plugin and an HTTP context per
//! stream (`proxy_on_context_create`), then calls each back by its id; a call's answer comes
//! by its token, which [`host::answered`] maps to the context that dispatched it.
//!
//! The filter does this itself rather than through the proxy-wasm SDK's dispatcher: that
//! one `panic!`s (a trap in the host) on an id or token it does not know and on a status it
//! does not expect, and its trait objects and maps were a sixth of the module. Here nothing
//! traps: a callback for an id or token not known here (a context the host deleted, a call
//! it answers twice) is skipped, as is one that comes while another runs (a host calling
//! back from inside a host call, which neither Envoy nor ngx_wasm_module does; logged), and
//! each answers what the SDK answers by default (`Continue`, `true`). The callbacks the filter
//! has no use for (bodies, trailers, gRPC, connections, queues, foreign functions) are
//! exported all the same, answering those defaults, as the SDK exported them (ngx_wasm_module
//! calls a callback it finds no export for through a null reference). Flags the host passes
//! (`end_of_stream`) are taken as the `u32` they are: a Rust `bool` of any value but 0 or 1
//! would be undefined behaviour.

use std::alloc::Layout;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ptr::NonNull;

use crate::host::{self, log};
use crate::proxy::{Action, LogLevel};
use crate::root::Root;
use crate::stream::Stream;

/// A context the host created: a plugin's root, or an HTTP stream's.
#[allow(
    clippy::large_enum_variant,
    reason = "nearly every context is a stream: boxing it would cost an allocation a request and save no memory"
)]
enum Context {
    Root(Root),
    Stream(Stream),
}

thread_local! {
    /// The VM's contexts, by id.
    static CONTEXTS: RefCell<BTreeMap<u32, Context>> = const { RefCell::new(BTreeMap::new()) };
}

/// Runs `f` on the contexts, for callback `id` (the context whose calls are its own
/// meanwhile); `skipped` when a callback is running already.
fn with_contexts<R>(id: u32, skipped: R, f: impl FnOnce(&mut BTreeMap<u32, Context>) -> R) -> R {
    CONTEXTS.with(|contexts| match contexts.try_borrow_mut() {
        Ok(mut contexts) => {
            host::calling(id);
            f(&mut contexts)
        }
        Err(_) => {
            log(
                LogLevel::Warn,
                "sluice-filter: called back from inside a host call; this callback is skipped",
            );
            skipped
        }
    })
}

/// Runs `f` on stream `id`'s context, if there is one.
fn with_stream<R>(id: u32, skipped: R, f: impl FnOnce(&mut Stream) -> R) -> R {
    with_contexts(id, None, |c| match c.get_mut(&id) {
        Some(Context::Stream(stream)) => Some(f(stream)),
        _ => None,
    })
    .unwrap_or(skipped)
}

/// Runs `f` on root context `id`, if there is one.
fn with_root<R>(id: u32, skipped: R, f: impl FnOnce(&mut Root) -> R) -> R {
    with_contexts(id, None, |c| match c.get_mut(&id) {
        Some(Context::Root(root)) => Some(f(root)),
        _ => None,
    })
    .unwrap_or(skipped)
}

/// The module's start (a WASI reactor's): its static constructors.
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    {
        extern "C" {
            fn __wasm_call_ctors();
        }
        // SAFETY: the linker's function, called once, first, as a reactor's `_initialize` does.
        unsafe { __wasm_call_ctors() }
    }
}

/// The ABI version this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory for what the host hands the module: `size` bytes of `u8`s, which `host` frees as a
/// `Vec<u8>` of that capacity. When there is none (the VM's memory cannot grow, or `size`
/// is past what a layout allows) the answer is 0, which both hosts turn into a failed call,
/// as the ABI says: never a trap, which would take the VM down with it.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let data = if size == 0 {
        NonNull::<u8>::dangling().as_ptr() // what a `Vec` of nothing holds
    } else {
        match Layout::array::<u8>(size) {
            // SAFETY: the layout's size is not zero; `alloc` answers null when memory runs out.
            Ok(layout) => unsafe { std::alloc::alloc(layout) },
            Err(_) => std::ptr::null_mut(),
        }
    };
    host::allocated(data, size);
    data
}

/// A new root context (`root_id` 0, one per plugin), or an HTTP stream's of root `root_id`.
/// An id already in use keeps its context: a host creating it again must not drop a root's
/// state (its tick, which ngx_wasm_module lets a root set once) or a stream's call.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(id: u32, root_id: u32) {
    with_contexts(id, (), |c| {
        if c.contains_key(&id) {
            log(
                LogLevel::Warn,
                &format!("sluice-filter: context {id} created again; it keeps what it was"),
            );
            return;
        }
        if root_id == 0 {
            c.insert(id, Context::Root(Root::default()));
            return;
        }
        let stream = match c.get_mut(&root_id) {
            Some(Context::Root(root)) => root.create_http_context(),
            _ => {
                log(
                    LogLevel::Warn,
                    &format!("sluice-filter: stream {id} is not limited: root context {root_id} is unknown"),
                );
                None
            }
        };
        if let Some(stream) = stream {
            c.insert(id, Context::Stream(stream));
        }
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_id: u32, _vm_configuration_size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(id: u32, plugin_configuration_size: usize) -> bool {
    with_root(id, false, |root| root.on_configure(plugin_configuration_size))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(id: u32) {
    with_root(id, (), Root::on_tick);
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(id: u32, _headers: usize, _end_of_stream: u32) -> Action {
    with_stream(id, Action::Continue, Stream::on_http_request_headers)
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(id: u32, _headers: usize, _end_of_stream: u32) -> Action {
    with_stream(id, Action::Continue, Stream::on_http_response_headers)
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(_id: u32, token: u32, _headers: usize, body: usize, _trailers: usize) {
    let Some(id) = host::answered(token) else { return };
    with_contexts(id, (), |c| match c.get_mut(&id) {
        Some(Context::Stream(stream)) if host::set_effective_context(id) => stream.on_http_call_response(),
        Some(Context::Root(root)) if host::set_effective_context(id) => root.on_http_call_response(token, body),
        _ => {}
    });
}

#[no_mangle]
pub extern "C" fn proxy_on_log(id: u32) {
    with_stream(id, (), Stream::on_log);
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_id: u32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(id: u32) {
    with_contexts(id, (), |c| {
        c.remove(&id);
    });
    host::forget_calls_of(id);
}

// The callbacks the filter has no use for: the SDK's defaults.

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_id: u32, _body_size: usize, _end_of_stream: u32) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(_id: u32, _trailers: usize) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_id: u32, _body_size: usize, _end_of_stream: u32) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(_id: u32, _trailers: usize) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(_id: u32, _queue_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_new_connection(_id: u32) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_downstream_data(_id: u32, _data_size: usize, _end_of_stream: u32) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_downstream_connection_close(_id: u32, _peer_type: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_upstream_data(_id: u32, _data_size: usize, _end_of_stream: u32) -> Action {
    Action::Continue
}

#[no_mangle]
pub extern "C" fn proxy_on_upstream_connection_close(_id: u32, _peer_type: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_initial_metadata(_id: u32, _token: u32, _headers: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive(_id: u32, _token: u32, _response_size: usize) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_receive_trailing_metadata(_id: u32, _token: u32, _trailers: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_grpc_close(_id: u32, _token: u32, _status_code: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_foreign_function(_id: u32, _function_id: u32, _arguments_size: usize) {}
