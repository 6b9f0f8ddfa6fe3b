//! The host: one VM running one plugin, driven step by step.

use std::collections::HashMap;
use std::time::Duration;

use wasmtime::{Config, Engine, Func, Instance, Linker, Module, Store, Val};
use wasmtime_wasi::WasiCtxBuilder;

use crate::abi::{Action, MetricType};
use crate::imports;
use crate::state::{CallReply, HeaderMap, HostState, LocalResponse, LogRecord, PendingCall, Stream};
use crate::{Flavor, HarnessError, HostOptions};

/// What a stream step ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The stream goes on.
    Continue,
    /// The stream is held until the module resumes it or answers.
    Pause,
    /// The module answered; the stream ends and the upstream is never called.
    LocalResponse(LocalResponse),
}

/// The answer to a dispatched HTTP call.
#[derive(Debug, Clone, Default)]
pub struct CallResponse {
    /// Response headers, `:status` included.
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
}

impl CallResponse {
    /// A response with `status` and `body`.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> CallResponse {
        CallResponse {
            headers: vec![(":status".into(), status.to_string())],
            body: body.into(),
        }
    }
}

/// A compiled module, to start many hosts from without compiling again.
#[derive(Clone)]
pub struct Plugin {
    engine: Engine,
    module: Module,
}

impl Plugin {
    /// Compiles `wasm` (Cranelift; the slow part of starting a host).
    pub fn compile(wasm: &[u8]) -> Result<Plugin, HarnessError> {
        Plugin::compile_with(wasm, &Config::new())
    }

    /// Compiles `wasm` to count the instructions it runs ([`Host::instructions`]): wasmtime's
    /// fuel, about one unit a wasm instruction, the same on every run and machine. Its hosts
    /// run a little slower than [`Plugin::compile`]'s.
    pub fn compile_metered(wasm: &[u8]) -> Result<Plugin, HarnessError> {
        Plugin::compile_with(wasm, Config::new().consume_fuel(true))
    }

    /// With `SLUICE_HARNESS_PERFMAP` set, the module's compiled functions are named in
    /// `/tmp/perf-PID.map`, so that `perf record` of a test or bench names the module's own
    /// functions (a build that keeps them: `CARGO_PROFILE_WASM_STRIP=false`; docs/testing.md).
    fn compile_with(wasm: &[u8], config: &Config) -> Result<Plugin, HarnessError> {
        let mut config = config.clone();
        if std::env::var_os("SLUICE_HARNESS_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(HarnessError::load)?;
        let module = Module::new(&engine, wasm).map_err(HarnessError::load)?;
        Ok(Plugin { engine, module })
    }
}

/// A proxy-wasm VM with one plugin: the library's entry point.
pub struct Host {
    store: Store<HostState>,
    instance: Instance,
    /// Exports looked up so far, with how many results each returns: a lookup by name
    /// costs more than a short callback.
    exports: HashMap<&'static str, Option<(Func, usize)>>,
}

impl Host {
    /// Compiles and instantiates `wasm`; call [`Host::start`] next.
    pub fn new(wasm: &[u8], options: HostOptions) -> Result<Host, HarnessError> {
        Host::from_plugin(&Plugin::compile(wasm)?, options)
    }

    /// Instantiates an already compiled module; call [`Host::start`] next.
    pub fn from_plugin(plugin: &Plugin, options: HostOptions) -> Result<Host, HarnessError> {
        let (engine, module) = (&plugin.engine, &plugin.module);
        let mut linker: Linker<HostState> = Linker::new(engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut HostState| &mut s.wasi)
            .map_err(HarnessError::load)?;
        imports::register(&mut linker).map_err(HarnessError::load)?;
        imports::stub_missing(&mut linker, module).map_err(HarnessError::load)?;
        imports::refuse(&mut linker, module, &options.refused_calls).map_err(HarnessError::load)?;
        // Envoy names itself in its node (a real Envoy answers `xds.node.user_agent_name`
        // with "envoy" from configuration on); ngx_wasm_module has no `xds` properties.
        // `plugin_root_id` is the `root_id` of Envoy's plugin configuration (the examples'
        // "sluice") and the context's number in ngx_wasm_module ("0" for the root: its
        // getter prints `pwctx->root_id`, and its tests read `plugin_root_id: 0` on a tick).
        let root_properties = match options.flavor {
            Flavor::Envoy => [
                ("xds.node.user_agent_name".to_owned(), b"envoy".to_vec()),
                ("plugin_root_id".to_owned(), b"sluice".to_vec()),
            ]
            .into(),
            Flavor::Nginx => [("plugin_root_id".to_owned(), b"0".to_vec())].into(),
        };
        let state = HostState {
            wasi: WasiCtxBuilder::new().inherit_stderr().build_p1(),
            clock_ns: options.start_time_ns,
            options,
            tick_period_ms: 0,
            next_tick_ns: 0,
            vm_config: Vec::new(),
            plugin_config: Vec::new(),
            root_id: 1,
            next_context: 1,
            current: 1,
            hook: None,
            streams: Default::default(),
            calls: Default::default(),
            next_token: 0,
            call_reply: None,
            metrics: Vec::new(),
            queues: Vec::new(),
            logs: Vec::new(),
            unimplemented: Vec::new(),
            root_properties,
            nginx_trap: None,
            host_errors: Vec::new(),
            memory: None,
            allocate: None,
            host_calls: 0,
        };
        let mut store = Store::new(engine, state);
        // A metered plugin's fuel never runs out; an unmetered one has none to set.
        let _ = store.set_fuel(u64::MAX);
        store.call_hook(|mut c, hook| {
            if matches!(hook, wasmtime::CallHook::CallingHost) {
                c.data_mut().host_calls += 1;
            }
            Ok(())
        });
        let instance = linker.instantiate(&mut store, module).map_err(HarnessError::load)?;
        let memory = instance.get_memory(&mut store, "memory");
        let allocate = ["proxy_on_memory_allocate", "malloc"]
            .into_iter()
            .find_map(|name| instance.get_typed_func::<i32, i32>(&mut store, name).ok());
        let data = store.data_mut();
        (data.memory, data.allocate) = (memory, allocate);
        Ok(Host {
            store,
            instance,
            exports: HashMap::new(),
        })
    }

    /// Export `name` and its number of results, if the module has it.
    fn func(&mut self, name: &'static str) -> Option<(Func, usize)> {
        if let Some(f) = self.exports.get(name) {
            return *f;
        }
        let f = self.instance.get_func(&mut self.store, name);
        let f = f.map(|f| (f, f.ty(&self.store).results().len()));
        self.exports.insert(name, f);
        f
    }

    /// Calls export `name` with i32 arguments; `Ok(None)` if the module does not export it.
    fn call(&mut self, name: &'static str, args: &[i32]) -> Result<Option<i32>, HarnessError> {
        let Some((f, results)) = self.func(name) else {
            return Ok(None);
        };
        let args: Vec<Val> = args.iter().map(|&a| Val::I32(a)).collect();
        let mut out = vec![Val::I32(0); results];
        f.call(&mut self.store, &args, &mut out).map_err(|e| {
            let why = self.store.data_mut().nginx_trap.take();
            HarnessError::Trap {
                function: name.to_owned(),
                message: why.unwrap_or_else(|| format!("{e:#}")),
            }
        })?;
        Ok(Some(out.first().and_then(Val::i32).unwrap_or(0)))
    }

    fn with_context<R>(&mut self, id: u32, f: impl FnOnce(&mut Host) -> R) -> R {
        self.store.data_mut().current = id;
        f(self)
    }

    /// Starts the VM and the plugin: `proxy_on_vm_start`, then `proxy_on_configure`.
    ///
    /// A `false` from either is reported as [`HarnessError::StartRefused`].
    pub fn start(&mut self, vm_config: &[u8], plugin_config: &[u8]) -> Result<(), HarnessError> {
        if self.func("_initialize").is_some() {
            self.call("_initialize", &[])?;
        } else if self.func("_start").is_some() {
            self.call("_start", &[])?;
        }
        let root = self.store.data().root_id as i32;
        self.store.data_mut().vm_config = vm_config.to_vec();
        self.with_context(root as u32, |h| h.call("proxy_on_context_create", &[root, 0]))?;
        if self.with_context(root as u32, |h| {
            h.call("proxy_on_vm_start", &[root, vm_config.len() as i32])
        })? == Some(0)
        {
            return Err(HarnessError::StartRefused("proxy_on_vm_start"));
        }
        self.configure(plugin_config)
    }

    /// Hands the root `plugin_config` (`proxy_on_configure`), as [`Host::start`] does and
    /// as a host may again later; a `false` is [`HarnessError::StartRefused`].
    pub fn configure(&mut self, plugin_config: &[u8]) -> Result<(), HarnessError> {
        let root = self.store.data().root_id as i32;
        self.store.data_mut().plugin_config = plugin_config.to_vec();
        if self.with_context(root as u32, |h| {
            h.call("proxy_on_configure", &[root, plugin_config.len() as i32])
        })? == Some(0)
        {
            return Err(HarnessError::StartRefused("proxy_on_configure"));
        }
        Ok(())
    }

    /// Opens an HTTP stream (a new context under the root); returns its context id.
    pub fn new_stream(&mut self) -> Result<u32, HarnessError> {
        let s = self.store.data_mut();
        s.next_context += 1;
        let id = s.next_context;
        s.streams.insert(id, Stream::default());
        let root = s.root_id as i32;
        self.with_context(id, |h| h.call("proxy_on_context_create", &[id as i32, root]))?;
        Ok(id)
    }

    /// Sets a property of a stream (`source.address`, `request.path`, …).
    pub fn set_property(&mut self, stream: u32, path: &str, value: impl Into<Vec<u8>>) {
        if let Some(s) = self.store.data_mut().streams.get_mut(&stream) {
            s.properties.insert(path.to_owned(), value.into());
        }
    }

    /// Sets a property of the root context (seen by every stream that lacks its own).
    pub fn set_root_property(&mut self, path: &str, value: impl Into<Vec<u8>>) {
        self.store
            .data_mut()
            .root_properties
            .insert(path.to_owned(), value.into());
    }

    fn eos(&self, end_of_stream: bool) -> i32 {
        // ngx_wasm_module always passes false in header callbacks.
        i32::from(end_of_stream && self.store.data().options.flavor == Flavor::Envoy)
    }

    fn step(&mut self, stream: u32, hook: &'static str, args: &[i32], pausable: bool) -> Result<Outcome, HarnessError> {
        let before = self.stream(stream).and_then(|s| s.local_response.clone());
        self.store.data_mut().hook = Some(hook);
        let called = self.with_context(stream, |h| h.call(hook, args));
        self.store.data_mut().hook = None;
        let action = called?.map_or(Action::Continue, Action::from_raw);
        let after = self.stream(stream).and_then(|s| s.local_response.clone());
        if let Some(resp) = after.filter(|a| Some(a) != before.as_ref()) {
            return Ok(Outcome::LocalResponse(resp));
        }
        Ok(match action {
            Action::Pause if pausable || self.store.data().options.flavor == Flavor::Envoy => Outcome::Pause,
            Action::Pause => {
                tracing::warn!(hook, "ngx_wasm_module cannot pause here: continuing");
                Outcome::Continue
            }
            Action::Continue => Outcome::Continue,
        })
    }

    fn stream_mut(&mut self, id: u32) -> Result<&mut Stream, HarnessError> {
        self.store
            .data_mut()
            .streams
            .get_mut(&id)
            .ok_or(HarnessError::NoSuchStream(id))
    }

    /// Delivers request headers (pseudo-headers `:method`, `:path`, `:authority` included).
    /// Values are text or bytes (`&str`, `&[u8]`): a proxy passes any byte but NUL, CR, LF.
    pub fn request_headers<V: AsRef<[u8]>>(
        &mut self,
        stream: u32,
        headers: &[(&str, V)],
        end_of_stream: bool,
    ) -> Result<Outcome, HarnessError> {
        let owned = owned_map(headers);
        {
            let s = self.stream_mut(stream)?;
            for (k, prop) in [
                (":path", "request.path"),
                (":method", "request.method"),
                (":authority", "request.host"),
            ] {
                if let Some((_, v)) = owned.iter().find(|(n, _)| n == k) {
                    s.properties.entry(prop.to_owned()).or_insert_with(|| v.clone());
                }
            }
            s.request_headers = owned;
        }
        let eos = self.eos(end_of_stream);
        self.step(
            stream,
            "proxy_on_request_headers",
            &[stream as i32, headers.len() as i32, eos],
            true,
        )
    }

    /// Delivers a request body chunk.
    pub fn request_body(&mut self, stream: u32, body: &[u8], end_of_stream: bool) -> Result<Outcome, HarnessError> {
        self.stream_mut(stream)?.request_body.extend_from_slice(body);
        let size = self.stream_mut(stream)?.request_body.len() as i32;
        self.step(
            stream,
            "proxy_on_request_body",
            &[stream as i32, size, i32::from(end_of_stream)],
            true,
        )
    }

    /// Delivers request trailers.
    pub fn request_trailers<V: AsRef<[u8]>>(
        &mut self,
        stream: u32,
        trailers: &[(&str, V)],
    ) -> Result<Outcome, HarnessError> {
        self.stream_mut(stream)?.request_trailers = owned_map(trailers);
        self.step(
            stream,
            "proxy_on_request_trailers",
            &[stream as i32, trailers.len() as i32],
            false,
        )
    }

    /// Delivers response headers (`:status` included); values as text or bytes.
    pub fn response_headers<V: AsRef<[u8]>>(
        &mut self,
        stream: u32,
        headers: &[(&str, V)],
        end_of_stream: bool,
    ) -> Result<Outcome, HarnessError> {
        self.stream_mut(stream)?.response_headers = owned_map(headers);
        let eos = self.eos(end_of_stream);
        self.step(
            stream,
            "proxy_on_response_headers",
            &[stream as i32, headers.len() as i32, eos],
            false,
        )
    }

    /// Delivers a response body chunk.
    pub fn response_body(&mut self, stream: u32, body: &[u8], end_of_stream: bool) -> Result<Outcome, HarnessError> {
        self.stream_mut(stream)?.response_body.extend_from_slice(body);
        let size = self.stream_mut(stream)?.response_body.len() as i32;
        self.step(
            stream,
            "proxy_on_response_body",
            &[stream as i32, size, i32::from(end_of_stream)],
            true,
        )
    }

    /// Delivers response trailers.
    pub fn response_trailers<V: AsRef<[u8]>>(
        &mut self,
        stream: u32,
        trailers: &[(&str, V)],
    ) -> Result<Outcome, HarnessError> {
        self.stream_mut(stream)?.response_trailers = owned_map(trailers);
        self.step(
            stream,
            "proxy_on_response_trailers",
            &[stream as i32, trailers.len() as i32],
            false,
        )
    }

    /// Ends a stream: `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`; its calls are cancelled.
    pub fn finish_stream(&mut self, stream: u32) -> Result<(), HarnessError> {
        if !self.store.data().streams.contains_key(&stream) {
            return Err(HarnessError::NoSuchStream(stream));
        }
        self.with_context(stream, |h| h.call("proxy_on_log", &[stream as i32]))?;
        self.with_context(stream, |h| h.call("proxy_on_done", &[stream as i32]))?;
        self.with_context(stream, |h| h.call("proxy_on_delete", &[stream as i32]))?;
        let s = self.store.data_mut();
        s.streams.remove(&stream);
        s.calls.retain(|_, c| c.context_id != stream);
        Ok(())
    }

    /// A stream's current data: headers as the module left them, resumes, local response.
    pub fn stream(&self, id: u32) -> Option<&Stream> {
        self.store.data().streams.get(&id)
    }

    /// HTTP calls dispatched and not yet answered, oldest first.
    pub fn pending_calls(&self) -> Vec<PendingCall> {
        self.store.data().calls.values().cloned().collect()
    }

    /// The calls dispatched after the one with token `token` (tokens only grow), not yet
    /// answered, oldest first: what a host that has started every call up to `token` has
    /// left to start.
    pub fn calls_after(&self, token: u32) -> Vec<PendingCall> {
        let calls = &self.store.data().calls;
        calls.range(token.saturating_add(1)..).map(|(_, c)| c.clone()).collect()
    }

    /// Answers call `token` (Envoy: `proxy_on_http_call_response` on the dispatching context).
    pub fn respond_call(&mut self, token: u32, response: CallResponse) -> Result<(), HarnessError> {
        self.deliver(
            token,
            CallReply {
                headers: owned_map(&response.headers),
                body: response.body,
                trailers: Vec::new(),
            },
        )
    }

    /// Fails call `token` as a timeout or reset: a response with no headers and no body, as Envoy does.
    pub fn fail_call(&mut self, token: u32) -> Result<(), HarnessError> {
        self.deliver(token, CallReply::default())
    }

    fn deliver(&mut self, token: u32, reply: CallReply) -> Result<(), HarnessError> {
        let call = self
            .store
            .data_mut()
            .calls
            .remove(&token)
            .ok_or(HarnessError::NoSuchCall(token))?;
        let (nh, nb, nt) = (
            reply.headers.len() as i32,
            reply.body.len() as i32,
            reply.trailers.len() as i32,
        );
        self.store.data_mut().call_reply = Some(reply);
        let ctx = call.context_id;
        let result = self.with_context(ctx, |h| {
            h.call("proxy_on_http_call_response", &[ctx as i32, token as i32, nh, nb, nt])
        });
        self.store.data_mut().call_reply = None;
        result.map(drop)
    }

    /// Calls export `name` as context `context` with raw arguments, checking nothing: what a
    /// host that races or misbehaves does (a context never created or already deleted, a
    /// token never issued or answered twice, a size beyond the buffer). Meanwhile a call
    /// response's maps and body are `reply`'s, when given. `Ok(None)`: no such export. The
    /// host's own state (its streams, its pending calls) is left as it was.
    pub fn call_export(
        &mut self,
        context: u32,
        name: &'static str,
        args: &[i32],
        reply: Option<CallResponse>,
    ) -> Result<Option<i32>, HarnessError> {
        self.store.data_mut().call_reply = reply.map(|r| CallReply {
            headers: owned_map(&r.headers),
            body: r.body,
            trailers: Vec::new(),
        });
        let result = self.with_context(context, |h| h.call(name, args));
        self.store.data_mut().call_reply = None;
        result
    }

    /// The host this one plays.
    pub fn flavor(&self) -> Flavor {
        self.store.data().options.flavor
    }

    /// The host clock, ns since the unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.store.data().clock_ns
    }

    /// Moves the clock to `now_ns` (proxy mode: the real clock) without running ticks.
    pub fn set_clock(&mut self, now_ns: u64) {
        let s = self.store.data_mut();
        s.clock_ns = s.clock_ns.max(now_ns);
    }

    /// When the next tick is due (ns), if ticks are on.
    pub fn next_tick_ns(&self) -> Option<u64> {
        let s = self.store.data();
        (s.tick_period_ms > 0).then_some(s.next_tick_ns)
    }

    /// Runs the ticks due at or before the current clock.
    pub fn run_due_ticks(&mut self) -> Result<u32, HarnessError> {
        let mut fired = 0;
        while let Some(due) = self.next_tick_ns().filter(|&d| d <= self.now_ns()) {
            let root = self.store.data().root_id;
            let period = u64::from(self.store.data().tick_period_ms) * 1_000_000;
            self.store.data_mut().next_tick_ns = due + period.max(1);
            self.with_context(root, |h| h.call("proxy_on_tick", &[root as i32]))?;
            fired += 1;
        }
        Ok(fired)
    }

    /// Advances the virtual clock by `by`, firing each tick at its time and timing out the
    /// calls whose deadline passes, in time order.
    pub fn advance(&mut self, by: Duration) -> Result<(), HarnessError> {
        let target = self.now_ns() + by.as_nanos() as u64;
        loop {
            let tick = self.next_tick_ns().filter(|&t| t <= target);
            let deadline = self
                .store
                .data()
                .calls
                .values()
                .map(|c| (c.dispatched_at_ns + u64::from(c.timeout_ms) * 1_000_000, c.token))
                .filter(|&(d, _)| d <= target)
                .min();
            match (tick, deadline) {
                (Some(t), Some((d, token))) if d <= t => {
                    self.store.data_mut().clock_ns = d;
                    self.fail_call(token)?;
                }
                (Some(t), _) => {
                    self.store.data_mut().clock_ns = t;
                    self.run_due_ticks()?;
                }
                (None, Some((d, token))) => {
                    self.store.data_mut().clock_ns = d;
                    self.fail_call(token)?;
                }
                (None, None) => break,
            }
        }
        self.store.data_mut().clock_ns = target;
        Ok(())
    }

    /// A counter's or gauge's value by name.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.store
            .data()
            .metrics
            .iter()
            .find(|m| m.name == name && m.kind != MetricType::Histogram)
            .map(|m| m.value)
    }

    /// The values recorded in a histogram, by name.
    pub fn histogram(&self, name: &str) -> Option<&[u64]> {
        self.store
            .data()
            .metrics
            .iter()
            .find(|m| m.name == name && m.kind == MetricType::Histogram)
            .map(|m| &m.records[..])
    }

    /// Names of every metric the module defined.
    pub fn metric_names(&self) -> Vec<String> {
        self.store.data().metrics.iter().map(|m| m.name.clone()).collect()
    }

    /// Shared data by key: value and CAS.
    pub fn shared_data(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.store.data().options.shared_data.get(key)
    }

    /// The process's shared data this host reads and writes (a handle: clones share it).
    pub fn shared_data_handle(&self) -> crate::SharedData {
        self.store.data().options.shared_data.clone()
    }

    /// Calls the module has made into the host so far, every import's (to count a path's).
    pub fn host_calls(&self) -> u64 {
        self.store.data().host_calls
    }

    /// Wasm instructions the module has run so far (wasmtime's fuel spent), on a host of a
    /// [`Plugin::compile_metered`] plugin; `None` on another.
    pub fn instructions(&self) -> Option<u64> {
        self.store.get_fuel().ok().map(|left| u64::MAX - left)
    }

    /// Everything the module logged.
    pub fn logs(&self) -> &[LogRecord] {
        &self.store.data().logs
    }

    /// What the host logged as an error about the module's calls, not the module's own
    /// logs (the Nginx flavor: ngx_wasm_module's `[error] [wasm] …` lines).
    pub fn host_errors(&self) -> &[String] {
        &self.store.data().host_errors
    }

    /// Names of imported host functions the harness answered with `Unimplemented`.
    pub fn unimplemented_calls(&self) -> &[String] {
        &self.store.data().unimplemented
    }

    /// From now on, report every buffer handed to the module `by` bytes longer than it is
    /// ([`HostOptions::overstated_sizes`]; 0: honest again).
    pub fn overstate_sizes(&mut self, by: u32) {
        self.store.data_mut().options.overstated_sizes = by;
    }

    /// Size of the module's linear memory in bytes.
    pub fn memory_bytes(&mut self) -> usize {
        self.instance
            .get_memory(&mut self.store, "memory")
            .map_or(0, |m| m.data_size(&self.store))
    }
}

/// A header map with lower-case names, values copied as bytes.
fn owned_map<K: AsRef<str>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| (k.as_ref().to_ascii_lowercase(), v.as_ref().to_vec()))
        .collect()
}
