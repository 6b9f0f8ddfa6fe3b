//! A proxy-wasm (ABI 0.2.1) host on wasmtime, behaving like Envoy.
//!
//! Two uses: a **test library** that drives a module step by step under a virtual clock,
//! and a **proxy** ([`proxy`]) that runs a module on real HTTP traffic. The host knows
//! nothing of any particular module.
//!
//! ```no_run
//! use sluice_harness::{CallResponse, Host, HostOptions, Outcome};
//! # fn main() -> Result<(), sluice_harness::HarnessError> {
//! let wasm = std::fs::read("filter.wasm").unwrap();
//! let mut host = Host::new(&wasm, HostOptions::default())?;
//! host.start(b"", br#"{"some": "config"}"#)?;
//! let s = host.new_stream()?;
//! let outcome = host.request_headers(s, &[(":method", "GET"), (":path", "/"), (":authority", "x")], true)?;
//! if outcome == Outcome::Pause {
//!     let call = host.pending_calls().remove(0);
//!     host.respond_call(call.token, CallResponse::new(200, r#"{"allowed":true}"#))?;
//!     assert_eq!(host.stream(s).unwrap().request_resumes, 1);
//! }
//! host.advance(std::time::Duration::from_millis(100))?; // fires ticks, times out calls
//! # Ok(()) }
//! ```
//!
//! Envoy semantics kept: a paused stream resumes only on `proxy_continue_stream`; a local
//! response ends the stream; a call that times out is delivered with no headers; all
//! streams share one VM and its root context (id 1; streams 2, 3, …).
// No panics outside tests (clippy.toml allows them in a crate's own unit tests).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod abi;
mod host;
mod imports;
mod map;
pub mod proxy;
mod state;

pub use host::{CallResponse, Host, Outcome, Plugin};
pub use state::{HeaderMap, LocalResponse, LogRecord, PendingCall, Stream};

/// Which proxy's behaviour to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// Envoy (proxy-wasm-cpp-host).
    #[default]
    Envoy,
    /// Nginx's ngx_wasm_module: traps on some calls, no pause in response headers,
    /// `end_of_stream` always false in header callbacks, millisecond clock.
    Nginx,
}

/// How to run a module.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Which host to imitate.
    pub flavor: Flavor,
    /// Upstreams `proxy_http_call` accepts (Envoy clusters); empty accepts any.
    pub clusters: Vec<String>,
    /// The clock's start, ns since the unix epoch.
    pub start_time_ns: u64,
    /// Host functions that do nothing but answer a status, by name
    /// (`proxy_send_local_response`): a host refusing calls, to test that a module copes
    /// with statuses its SDK does not expect. Empty: every function does its work.
    pub refused_calls: Vec<(String, abi::Status)>,
    /// The process's shared data (`proxy_get_shared_data`, `proxy_set_shared_data`): hosts
    /// given clones of one handle share it, as the workers of one Envoy (one `vm_id`) or of
    /// one Nginx do.
    pub shared_data: SharedData,
    /// ngx_wasm_module's `shm_kv` zones (`*` is the default zone): a key whose `zone/`
    /// prefix names none of them, with no default zone, traps there, as in a real Nginx.
    /// The Envoy flavor ignores it.
    pub shm_kv: Vec<String>,
    /// A hostile host: every buffer it hands the guest is reported this many bytes longer
    /// than it allocated and wrote. 0: honest, as Envoy and ngx_wasm_module are.
    pub overstated_sizes: u32,
}

/// Shared data's keys, each with its value and CAS.
pub(crate) type SharedMap = std::collections::HashMap<String, (Vec<u8>, u32)>;

/// Shared data across the hosts of one process: each key's value and CAS.
#[derive(Debug, Clone, Default)]
pub struct SharedData(std::sync::Arc<std::sync::Mutex<SharedMap>>);

impl SharedData {
    /// Runs `f` on the map (a poisoned lock is taken as it is: the map is always whole).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut SharedMap) -> R) -> R {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut map)
    }

    /// Key `key`'s value and CAS.
    pub fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.with(|m| m.get(key).cloned())
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys held, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.with(|m| m.keys().cloned().collect());
        keys.sort();
        keys
    }

    /// Overwrites key `key` with `value` as another writer would, bumping its CAS: a
    /// hostile or corrupted host's shared data, to test the module's readers of it.
    pub fn corrupt(&self, key: &str, value: Vec<u8>) {
        self.with(|m| {
            let cas = m.get(key).map_or(1, |(_, cas)| cas.wrapping_add(1));
            m.insert(key.to_owned(), (value, cas));
        });
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            flavor: Flavor::Envoy,
            clusters: Vec::new(),
            start_time_ns: 1_774_312_800_000_000_000,
            refused_calls: Vec::new(),
            shared_data: SharedData::default(),
            // examples/nginx.conf's zone.
            shm_kv: vec!["sluice".into()],
            overstated_sizes: 0,
        }
    }
}

/// What went wrong hosting a module.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The module could not be compiled, linked or instantiated.
    #[error("cannot load the module: {0}")]
    Load(String),
    /// `proxy_on_vm_start` or `proxy_on_configure` returned false.
    #[error("the plugin refused to start: {0} returned false")]
    StartRefused(&'static str),
    /// The module trapped (a panic, or a call the host flavor traps on).
    #[error("the module trapped in {function}: {message}")]
    Trap {
        /// The export that was running.
        function: String,
        /// Why.
        message: String,
    },
    /// No stream with this context id.
    #[error("no stream with context id {0}")]
    NoSuchStream(u32),
    /// No pending call with this token.
    #[error("no pending HTTP call with token {0}")]
    NoSuchCall(u32),
}

impl HarnessError {
    fn load(e: impl std::fmt::Display) -> HarnessError {
        HarnessError::Load(format!("{e:#}"))
    }
}

/// The (module, name) of every function `wasm` imports, to compare with what a host offers.
pub fn function_imports(wasm: &[u8]) -> Result<Vec<(String, String)>, HarnessError> {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, wasm).map_err(HarnessError::load)?;
    Ok(module
        .imports()
        .filter(|i| i.ty().func().is_some())
        .map(|i| (i.module().to_owned(), i.name().to_owned()))
        .collect())
}
