//! The functions of the proxy-wasm ABI 0.2.1 the host calls, each answering the default.

use std::mem::MaybeUninit;

/// `Continue`: the stream goes on (the ABI's `Action`).
const CONTINUE: u32 = 0;

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

/// Memory for what the host hands the module (it never does: the module reads nothing), a
/// boxed slice of `size` bytes, left to the module as the SDK leaves it.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let memory: Box<[MaybeUninit<u8>]> = Box::new_uninit_slice(size);
    Box::into_raw(memory).cast()
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_id: u32, _root_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_id: u32, _vm_configuration_size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_id: u32, _plugin_configuration_size: usize) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_id: u32, _headers: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_id: u32, _body_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(_id: u32, _trailers: usize) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_id: u32, _headers: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_id: u32, _body_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(_id: u32, _trailers: usize) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(_id: u32, _token: u32, _headers: usize, _body: usize, _trailers: usize) {}

#[no_mangle]
pub extern "C" fn proxy_on_log(_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_done(_id: u32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(_id: u32, _queue_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_new_connection(_id: u32) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_downstream_data(_id: u32, _data_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn proxy_on_downstream_connection_close(_id: u32, _peer_type: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_upstream_data(_id: u32, _data_size: usize, _end_of_stream: bool) -> u32 {
    CONTINUE
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
