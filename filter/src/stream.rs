//! One HTTP stream's context: each callback borrows the VM's shared state once and hands it,
//! with the proxy, to the request's [`Flow`].

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::clock::now_us;
use crate::flow::Flow;
use crate::host::{resume_request, Abi};
use crate::shared::Shared;

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
}

// The one `borrow_mut` of each callback ends with it; a host never calls a context back from
// inside a host call (an answer comes in a callback of its own), so no two borrows overlap.
impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, _body: usize, _trailers: usize) {
        let go_on = self
            .flow
            .on_call_response(&mut self.shared.borrow_mut(), &mut Abi, now_us());
        if go_on {
            resume_request();
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.flow
            .on_request_headers(&mut self.shared.borrow_mut(), &mut Abi, now_us())
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        self.flow.on_response_headers(&mut self.shared.borrow_mut(), &mut Abi)
    }

    fn on_log(&mut self) {
        self.flow.on_log(&mut self.shared.borrow_mut(), now_us());
    }
}
