//! The kinds of host call the module prices, and its configuration `KIND K`.

/// One kind of host call, as Sluice's filter makes it on a request's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `proxy_get_current_time_nanoseconds`.
    Clock,
    /// `proxy_get_header_map_value` of a request header that is there (`:path`).
    Header,
    /// `proxy_get_header_map_value` of a request header that is not (`x-api-key`).
    HeaderMiss,
    /// `proxy_get_header_map_pairs` of the request's headers, all of them at once.
    HeaderMap,
    /// `proxy_get_property` of `source.address`, the client's address.
    Property,
    /// `proxy_get_property` of a JWT claim under `metadata.filter_metadata` that is not there.
    PropertyMiss,
    /// `proxy_increment_metric` of a counter defined at configuration.
    Metric,
    /// `proxy_get_shared_data` of one key.
    SharedGet,
    /// `proxy_get_shared_data` then `proxy_set_shared_data` with its CAS: a slot's update.
    SharedCas,
    /// `proxy_add_header_map_value` to the response's headers, in `on_response_headers`.
    AddHeader,
    /// `proxy_log` at debug, below Envoy's default level (what a disabled log line costs).
    Log,
    /// `proxy_send_local_response` (a 429): once a request at most, as the filter refuses.
    LocalReply,
    /// `proxy_http_call` to the example's check cluster (`GET /healthz` of the node: the
    /// cheapest answer it gives), the request paused until the answer, whose status and
    /// body are read, and resumed (`proxy_continue_stream`): what the filter's check path
    /// pays Envoy for its call, with no JSON either way. Once a request at most.
    Call,
    /// `call`, shaped as the filter's check: `POST /v1/check` with a check's JSON body, its
    /// content type and the node's data token (`call-check 1 TOKEN`), the node's answer read
    /// as `call` reads `/healthz`'s (not parsed): what the call costs beside the filter's work
    /// around it. Once a request at most.
    CallCheck,
    /// Every host call Sluice's filter makes on a request it checks (the example's: `share:
    /// process`, a client the prefilter has no tokens for, `headers: all`; `check-path 1
    /// TOKEN`), in its order, with nothing of the filter's own work between them: the
    /// request's calls around `call-check`'s call, its answer's, and the response's five
    /// headers. What the calls cost together, beside the filter's check path. Once a
    /// request at most.
    CheckPath,
    /// No host call: a 64-byte FNV-1a hash inside the module, to set the runtime's speed at
    /// the module's own work beside another runtime's (wasmtime in the harness).
    Compute,
    /// No host call: a 24-byte `memory.copy` (how LLVM moves bytes with bulk memory on), to
    /// price what a runtime pays for one beside a plain instruction.
    Copy,
    /// `proxy_get_current_time_nanoseconds` in each callback of a request (its headers, the
    /// response's, the log): what making any call at all in a callback costs.
    ClockEach,
    /// Every host call Sluice's filter makes on a request decided by a lease (`share:
    /// process`, the local prefilter's token in hand, `headers: all`: the example's), in its
    /// order, with nothing of the filter's own work between them: what the calls cost
    /// together, beside the filter.
    LeasedPath,
    /// The same for the leanest leased request (bench-envoy's `leased-lean`: the client's
    /// address alone, no prefilter, no quota headers): what any filter deciding by a lease
    /// the process shares must call.
    LeanPath,
}

/// Where a kind's calls are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `proxy_on_request_headers`.
    Request,
    /// `proxy_on_response_headers`.
    Response,
}

const NAMES: [(&str, Kind); 20] = [
    ("clock", Kind::Clock),
    ("header", Kind::Header),
    ("header-miss", Kind::HeaderMiss),
    ("header-map", Kind::HeaderMap),
    ("property", Kind::Property),
    ("property-miss", Kind::PropertyMiss),
    ("metric", Kind::Metric),
    ("shared-get", Kind::SharedGet),
    ("shared-cas", Kind::SharedCas),
    ("add-header", Kind::AddHeader),
    ("log", Kind::Log),
    ("local-reply", Kind::LocalReply),
    ("compute", Kind::Compute),
    ("copy", Kind::Copy),
    ("clock-each", Kind::ClockEach),
    ("leased-path", Kind::LeasedPath),
    ("lean-path", Kind::LeanPath),
    ("call", Kind::Call),
    ("call-check", Kind::CallCheck),
    ("check-path", Kind::CheckPath),
];

impl Kind {
    /// The kind and its count from a configuration `KIND K` (`K` ≥ 0; `local-reply`, `call`
    /// and `call-check` at most 1; `call-check K TOKEN` with the node's data token), or what
    /// is wrong with it.
    pub fn parse(config: &str) -> Result<(Kind, u32, Option<String>), String> {
        let mut words = config.split_whitespace();
        let (Some(name), Some(count), token, None) = (words.next(), words.next(), words.next(), words.next()) else {
            return Err(format!("the configuration is `KIND K`, not {config:?}"));
        };
        let kind = NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| format!("no kind {name:?}: one of {:?}", NAMES.map(|(n, _)| n)))?;
        let count: u32 = count.parse().map_err(|_| format!("K is a count, not {count:?}"))?;
        if matches!(kind, Kind::LocalReply | Kind::Call | Kind::CallCheck | Kind::CheckPath) && count > 1 {
            return Err(format!("{name} is once a request: K is 0 or 1"));
        }
        if token.is_some() != kind.checks() {
            return Err(format!(
                "`call-check K TOKEN` and `check-path K TOKEN` take a token, no other kind does: {config:?}"
            ));
        }
        Ok((kind, count, token.map(str::to_owned)))
    }

    /// Whether it makes calls in `phase`.
    pub fn calls_in(self, phase: Phase) -> bool {
        match self {
            Kind::AddHeader => phase == Phase::Response,
            Kind::LeasedPath | Kind::LeanPath | Kind::ClockEach | Kind::CheckPath => true,
            _ => phase == Phase::Request,
        }
    }

    /// Whether it calls the check service as the filter does (with the node's data token).
    pub fn checks(self) -> bool {
        matches!(self, Kind::CallCheck | Kind::CheckPath)
    }

    /// Whether it makes an HTTP call out (the request paused until its answer).
    pub fn calls_out(self) -> bool {
        matches!(self, Kind::Call | Kind::CallCheck | Kind::CheckPath)
    }

    /// Its number, to keep in an atomic.
    pub(crate) fn index(self) -> u32 {
        NAMES.iter().position(|(_, k)| *k == self).unwrap_or(0) as u32
    }

    /// The kind of number `index`.
    pub(crate) fn from_index(index: u32) -> Kind {
        NAMES.get(index as usize).map_or(Kind::Clock, |(_, k)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_parse_and_bad_ones_are_named() {
        assert_eq!(Kind::parse("header-map 8"), Ok((Kind::HeaderMap, 8, None)));
        assert_eq!(Kind::parse(" shared-cas  0 "), Ok((Kind::SharedCas, 0, None)));
        assert_eq!(
            Kind::parse("call-check 1 t0k"),
            Ok((Kind::CallCheck, 1, Some("t0k".into())))
        );
        assert!(Kind::parse("call-check 1").unwrap_err().contains("TOKEN"));
        assert!(Kind::parse("clock 1 t0k").unwrap_err().contains("TOKEN"));
        assert!(Kind::parse("headers 8").unwrap_err().contains("no kind \"headers\""));
        assert!(Kind::parse("clock").unwrap_err().contains("KIND K"));
        assert!(Kind::parse("clock -1").unwrap_err().contains("K is a count"));
        assert!(Kind::parse("local-reply 2").unwrap_err().contains("0 or 1"));
        assert!(Kind::parse("call 2").unwrap_err().contains("0 or 1"));
        for (name, kind) in NAMES {
            assert_eq!(Kind::from_index(kind.index()), kind, "{name}");
        }
    }
}
