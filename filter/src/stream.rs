//! One HTTP stream's context: each callback borrows the VM's shared state once and hands it,
//! with the proxy, to the request's [`Flow`].

use std::cell::RefCell;
use std::rc::Rc;

use crate::clock::now_us;
use crate::flow::Flow;
use crate::host::{log, resume_request, Abi};
use crate::proxy::{Action, LogLevel};
use crate::shared::Shared;

/// Runs `f` on the VM's shared state, borrowed for one callback; `None` (logged) when it is
/// borrowed already — a host calling a context back from inside a host call, which neither
/// Envoy (it posts a local reply) nor ngx_wasm_module (it sends one after the callback) does.
/// A second borrow is never a panic, so never a trap.
pub fn with_shared<R>(shared: &RefCell<Shared>, f: impl FnOnce(&mut Shared) -> R) -> Option<R> {
    match shared.try_borrow_mut() {
        Ok(mut s) => Some(f(&mut s)),
        Err(_) => {
            log(
                LogLevel::Warn,
                "sluice-filter: called back from inside a host call; this callback is skipped",
            );
            None
        }
    }
}

/// The HTTP context of one stream.
pub struct Stream {
    shared: Rc<RefCell<Shared>>,
    flow: Flow,
}

impl Stream {
    pub fn new(shared: Rc<RefCell<Shared>>) -> Stream {
        Stream {
            shared,
            flow: Flow::default(),
        }
    }

    // Each callback borrows the shared state once ([`with_shared`]); a skipped one lets the
    // request go on rather than hold it.
    /// The answer to this stream's call.
    pub fn on_http_call_response(&mut self) {
        let flow = &mut self.flow;
        let go_on = with_shared(&self.shared, |s| flow.on_call_response(s, &mut Abi, now_us()));
        if go_on.unwrap_or(true) {
            resume_request();
        }
    }

    /// The request's headers came.
    pub fn on_http_request_headers(&mut self) -> Action {
        let flow = &mut self.flow;
        with_shared(&self.shared, |s| {
            s.count_memory(&mut Abi, crate::host::memory_bytes());
            flow.on_request_headers(s, &mut Abi, now_us())
        })
        .unwrap_or(Action::Continue)
    }

    /// The upstream's response headers came.
    pub fn on_http_response_headers(&mut self) -> Action {
        let flow = &mut self.flow;
        with_shared(&self.shared, |s| flow.on_response_headers(s, &mut Abi)).unwrap_or(Action::Continue)
    }

    /// The stream ended.
    pub fn on_log(&mut self) {
        if !self.flow.holds_anything() {
            return;
        }
        let flow = &mut self.flow;
        with_shared(&self.shared, |s| flow.on_log(s, &mut Abi, now_us()));
    }
}
