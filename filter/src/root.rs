//! The root context: reads the configuration and builds the VM's [`Shared`] state, then
//! gives every HTTP stream a [`Stream`] over it.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use crate::config::Config;
use crate::host::log;
use crate::shared::Shared;
use crate::stream::Stream;

/// The root context.
#[derive(Default)]
pub struct Root {
    shared: Option<Rc<RefCell<Shared>>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = if size == 0 {
            None
        } else {
            self.get_plugin_configuration()
        };
        let Some(bytes) = bytes else {
            log(
                LogLevel::Error,
                "sluice-filter: no plugin configuration; give at least {\"check\": {\"cluster\": \"...\"}}",
            );
            return false;
        };
        let shared = match Config::parse(&bytes).map_err(|e| e.to_string()).and_then(Shared::new) {
            Ok(s) => s,
            Err(e) => {
                log(LogLevel::Error, &format!("sluice-filter: configuration refused: {e}"));
                return false;
            }
        };
        log(
            LogLevel::Info,
            &format!(
                "sluice-filter: configured, checking with {}",
                shared.config.check.cluster
            ),
        );
        self.shared = Some(Rc::new(RefCell::new(shared)));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Stream::new(shared)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
