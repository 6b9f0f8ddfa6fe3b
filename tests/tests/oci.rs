//! The filter's OCI artifact as the gateways pull it. `scripts/wasm-oci` writes an OCI image
//! layout; these tests read it with the rules of the two fetchers that take it, written here
//! from their source:
//!
//! - Istio 1.30, `pkg/wasm/imagefetcher.go` (`PrepareFetch`'s `binaryFetcher`),
//! - Envoy Gateway 1.9, `internal/wasm/imagefetcher.go` (the same rules, and a 256 MiB bound
//!   on the unpacked tar).
//!
//! Both take a Docker schema 2 manifest whose last layer is a Docker tar.gzip, or the *compat*
//! variant (the last layer `application/vnd.oci.image.layer.v1.tar+gzip`, a tar holding a
//! `plugin.wasm`), or the *oci* variant (exactly two layers, one of them the module as
//! `application/vnd.module.wasm.content.layer.v1+wasm`); nothing else. The layout is then
//! pushed with skopeo to a registry on loopback (Debian's `docker-registry`) and read back by
//! its digest, as a gateway's fetcher reads it.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_testkit::{free_port, wait_for_port, Child};
use sluice_tests::chain::filter_wasm;

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// Envoy Gateway's `maxWasmSize`: the most of an unpacked layer it reads.
const ENVOY_GATEWAY_MAX_WASM: u64 = 256 << 20;

/// An image as a fetcher sees it: its manifest, and its blobs by digest.
#[derive(Clone)]
struct Image {
    manifest: Value,
    blobs: HashMap<String, Vec<u8>>,
}

impl Image {
    fn layers(&self) -> Vec<&Value> {
        self.manifest["layers"]
            .as_array()
            .map(|l| l.iter().collect())
            .unwrap_or_default()
    }

    fn blob(&self, descriptor: &Value) -> Result<&[u8], String> {
        let digest = descriptor["digest"].as_str().ok_or("a layer without a digest")?;
        self.blobs
            .get(digest)
            .map(Vec::as_slice)
            .ok_or_else(|| format!("could not get layer content: no blob {digest}"))
    }
}

/// The two fetchers, by the release whose source the rules are written from.
#[derive(Clone, Copy, Debug)]
enum Fetcher {
    Istio1_30,
    EnvoyGateway1_9,
}

const FETCHERS: [Fetcher; 2] = [Fetcher::Istio1_30, Fetcher::EnvoyGateway1_9];

impl Fetcher {
    /// The module the fetcher takes from `image`, or its error, in its own words.
    fn extract(self, image: &Image) -> Result<Vec<u8>, String> {
        if image.manifest["mediaType"] == DOCKER_MANIFEST {
            return self
                .last_tar_gzip_layer(image, DOCKER_LAYER)
                .map_err(|e| format!("could not extract Wasm file from the image as Docker container {e}"));
        }
        let compat = match self.last_tar_gzip_layer(image, OCI_LAYER) {
            Ok(module) => return Ok(module),
            Err(e) => e,
        };
        let oci = match oci_variant(image) {
            Ok(module) => return Ok(module),
            Err(e) => e,
        };
        Err(format!(
            "the given image is in invalid format as an OCI image: could not parse as compat variant: {compat}; \
             could not parse as oci variant: {oci}"
        ))
    }

    /// The compat variant: the last layer of `media_type`, a tar.gz with a `plugin.wasm`.
    fn last_tar_gzip_layer(self, image: &Image, media_type: &str) -> Result<Vec<u8>, String> {
        let layers = image.layers();
        let layer = layers.last().ok_or("number of layers must be greater than zero")?;
        let found = layer["mediaType"].as_str().unwrap_or_default();
        if found != media_type {
            return Err(format!("invalid media type {found} (expect {media_type})"));
        }
        let limit = match self {
            Fetcher::Istio1_30 => u64::MAX,
            Fetcher::EnvoyGateway1_9 => ENVOY_GATEWAY_MAX_WASM,
        };
        plugin_wasm(image.blob(layer)?, limit).map_err(|e| format!("could not extract wasm binary: {e}"))
    }
}

/// The oci variant: exactly two layers, the module one of them, as it is.
fn oci_variant(image: &Image) -> Result<Vec<u8>, String> {
    let layers = image.layers();
    if layers.len() != 2 {
        return Err(format!("number of layers must be 2 but got {}", layers.len()));
    }
    let layer = layers
        .iter()
        .find(|l| l["mediaType"] == WASM_LAYER)
        .ok_or_else(|| format!("could not find the layer of type {WASM_LAYER}"))?;
    image.blob(layer).map(<[u8]>::to_vec)
}

/// The first entry of a tar.gz whose base name is `plugin.wasm`, reading at most `limit`
/// unpacked bytes.
fn plugin_wasm(tar_gz: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let unpacked = flate2::read::GzDecoder::new(tar_gz).take(limit);
    let mut archive = tar::Archive::new(unpacked);
    let entries = archive
        .entries()
        .map_err(|e| format!("failed to parse layer as tar.gz: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        if path.file_name().is_some_and(|n| n == "plugin.wasm") {
            let mut module = Vec::new();
            entry
                .read_to_end(&mut module)
                .map_err(|e| format!("failed to read plugin.wasm: {e}"))?;
            return Ok(module);
        }
    }
    Err("plugin.wasm not found in the archive".into())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-oci-{what}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn sha256_hex(bytes: &[u8]) -> String {
    let sum = ring::digest::digest(&ring::digest::SHA256, bytes);
    sum.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Both fetchers' check of a pinned artifact (`sha256` in a WasmPlugin or an
/// EnvoyExtensionPolicy): the manifest's digest, as the registry serves it, must be the pin.
/// (Istio 1.30, `pkg/wasm/cache.go`; Envoy Gateway 1.9 the same.)
fn check_pin(served_digest: &str, pinned: &str) -> Result<(), String> {
    let served = served_digest.strip_prefix("sha256:").unwrap_or(served_digest);
    if served == pinned {
        Ok(())
    } else {
        Err(format!(
            "module downloaded has checksum {served}, which does not match: {pinned}"
        ))
    }
}

/// `scripts/wasm-oci --variant VARIANT` on the filter as built: the layout's directory and the
/// digest the script printed.
fn write_layout(dir: &Path, variant: &str) -> (PathBuf, String) {
    let out = dir.join(variant);
    let run = Command::new("python3")
        .arg(repo().join("scripts/wasm-oci"))
        .arg("--wasm")
        .arg(filter_wasm())
        .arg("--out")
        .arg(&out)
        .args(["--tag", "test", "--variant", variant])
        .output()
        .expect("python3 scripts/wasm-oci");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    (out, String::from_utf8_lossy(&run.stdout).trim().to_owned())
}

/// An OCI image layout's one image, every blob checked against its digest and size: the
/// manifest's digest, and the image.
fn read_layout(layout: &Path) -> (String, Image) {
    let json = |path: PathBuf| -> Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    assert_eq!(json(layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(layout.join("index.json"));
    let manifests = index["manifests"].as_array().expect("index.json: manifests");
    assert_eq!(manifests.len(), 1, "one image in {}", layout.display());
    let mut blobs = HashMap::new();
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).expect("blobs") {
        let entry = entry.expect("blob");
        let bytes = std::fs::read(entry.path()).expect("blob");
        let name = entry.file_name().to_string_lossy().into_owned();
        assert_eq!(sha256_hex(&bytes), name, "blob {name} does not hash to its name");
        blobs.insert(format!("sha256:{name}"), bytes);
    }
    let digest = manifests[0]["digest"].as_str().expect("digest").to_owned();
    let manifest: Value = serde_json::from_slice(&blobs[&digest]).expect("the manifest, JSON");
    for descriptor in std::iter::once(&manifest["config"]).chain(manifest["layers"].as_array().expect("layers")) {
        let bytes = &blobs[descriptor["digest"].as_str().expect("digest")];
        assert_eq!(descriptor["size"], bytes.len(), "{descriptor}: size");
    }
    (digest, Image { manifest, blobs })
}

/// `fetcher` takes from `image` the module as built, byte for byte.
fn assert_takes_the_module(fetcher: Fetcher, image: &Image, what: &str) {
    let built = std::fs::read(filter_wasm()).expect("the module");
    let taken = fetcher
        .extract(image)
        .unwrap_or_else(|e| panic!("{what}: {fetcher:?} refuses it: {e}"));
    assert!(
        taken == built,
        "{what}: {fetcher:?} takes {} bytes, not the {} bytes built",
        taken.len(),
        built.len()
    );
}

/// The compat variant, `scripts/wasm-oci`'s default: one tar+gzip layer holding
/// `plugin.wasm`, the manifest annotated as the spec asks. Both fetchers take the module as
/// built out of it; the script prints the manifest's digest, the same for the same module.
#[test]
fn the_compat_variant_is_taken_by_both_gateways_fetchers() {
    let dir = scratch("compat");
    let (layout, printed) = write_layout(&dir, "compat");
    let (digest, image) = read_layout(&layout);
    assert_eq!(printed, digest, "the script prints the manifest's digest");
    assert_eq!(image.manifest["annotations"]["module.wasm.image/variant"], "compat");
    assert_eq!(image.layers().len(), 1);
    assert_eq!(
        image.manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    for fetcher in FETCHERS {
        assert_takes_the_module(fetcher, &image, "compat");
    }
    let (_, again) = write_layout(&dir.join("again"), "compat");
    assert_eq!(again, digest, "the same module, the same digest");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The oci variant (`--variant oci`): exactly two layers, the runtime config and the module,
/// which both fetchers take.
#[test]
fn the_two_layer_oci_variant_is_taken_by_both_gateways_fetchers() {
    let dir = scratch("oci");
    let (layout, printed) = write_layout(&dir, "oci");
    let (digest, image) = read_layout(&layout);
    assert_eq!(printed, digest);
    let types: Vec<&Value> = image.layers().iter().map(|l| &l["mediaType"]).collect();
    assert_eq!(
        types,
        [&json!("application/vnd.module.wasm.config.v1+json"), &json!(WASM_LAYER)]
    );
    let config: Value = serde_json::from_slice(image.blob(&image.manifest["config"]).expect("config")).expect("JSON");
    assert_eq!(config["config"]["rootIds"][0], "sluice");
    for fetcher in FETCHERS {
        assert_takes_the_module(fetcher, &image, "oci");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the fetchers refuse, so that the rules above are not a rubber stamp: the one-layer
/// form the artifact once had, a compat layer of another media type, and a tar without
/// `plugin.wasm`.
#[test]
fn a_one_layer_or_mistyped_artifact_is_refused_by_both() {
    let dir = scratch("refused");
    let (layout, _) = write_layout(&dir, "oci");
    let (_, two_layers) = read_layout(&layout);
    let mut one_layer = two_layers.clone();
    let wasm_layer = one_layer.layers()[1].clone();
    one_layer.manifest["layers"] = json!([wasm_layer]);

    let (layout, _) = write_layout(&dir, "compat");
    let (_, compat) = read_layout(&layout);
    let mut untyped = compat.clone();
    untyped.manifest["layers"][0]["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar");
    let mut no_plugin = compat.clone();
    let layer = compat.blob(compat.layers()[0]).expect("layer").to_vec();
    let renamed = rename_plugin(&layer);
    let digest = format!("sha256:{}", sha256_hex(&renamed));
    no_plugin.manifest["layers"][0]["digest"] = json!(digest);
    no_plugin.blobs.insert(digest, renamed);

    for fetcher in FETCHERS {
        let said = fetcher.extract(&one_layer).expect_err("one layer");
        assert!(
            said.contains("number of layers must be 2 but got 1"),
            "{fetcher:?}: {said}"
        );
        let said = fetcher.extract(&untyped).expect_err("a plain tar layer");
        assert!(
            said.contains("invalid media type application/vnd.oci.image.layer.v1.tar (expect"),
            "{fetcher:?}: {said}"
        );
        let said = fetcher.extract(&no_plugin).expect_err("no plugin.wasm");
        assert!(
            said.contains("plugin.wasm not found in the archive"),
            "{fetcher:?}: {said}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `layer` (a tar.gz holding `plugin.wasm`) with the entry renamed `filter.wasm`.
fn rename_plugin(layer: &[u8]) -> Vec<u8> {
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(layer)
        .read_to_end(&mut tar)
        .expect("gunzip");
    let at = tar
        .windows(11)
        .position(|w| w == b"plugin.wasm")
        .expect("the entry's name");
    tar[at..at + 11].copy_from_slice(b"filter.wasm");
    // The header's checksum: the sum of its bytes with the checksum field as spaces.
    let header = &mut tar[..512];
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).expect("gzip");
    gz.finish().expect("gzip")
}

/// A registry on 127.0.0.1 (Debian's `docker-registry`, the CNCF distribution registry),
/// storing under `dir`.
fn registry(dir: &Path) -> (u16, Child) {
    let port = free_port();
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {}}}}}\n\
             http: {{addr: '127.0.0.1:{port}'}}\n",
            dir.join("storage").display()
        ),
    )
    .expect("registry.yml");
    let child = Child::spawn(
        "docker-registry",
        Command::new("docker-registry").arg("serve").arg(&config),
    );
    wait_for_port(port, Duration::from_secs(30));
    (port, child)
}

fn skopeo(args: &[&str]) -> Vec<u8> {
    let out = Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .output()
        .expect("skopeo (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Each variant pushed as docs/deploy.md says (`skopeo copy oci:… docker://…`) to a registry
/// on loopback, then read back by its digest, as a gateway pinned to it pulls it: the registry
/// serves the very manifest (its bytes hash to the digest), and both fetchers take the module
/// from what came back.
#[test]
fn a_registry_on_loopback_serves_each_variant_back_by_digest() {
    let dir = scratch("registry");
    let (port, _registry) = registry(&dir);
    for variant in ["compat", "oci"] {
        let (layout, digest) = write_layout(&dir, variant);
        let repository = format!("127.0.0.1:{port}/sluice/sluice-filter-{variant}");
        skopeo(&[
            "copy",
            "--dest-tls-verify=false",
            &format!("oci:{}:test", layout.display()),
            &format!("docker://{repository}:0.1.0"),
        ]);
        let by_digest = format!("docker://{repository}@{digest}");
        let raw = skopeo(&["inspect", "--raw", "--tls-verify=false", &by_digest]);
        assert_eq!(
            format!("sha256:{}", sha256_hex(&raw)),
            digest,
            "{variant}: the manifest as served"
        );
        let back = dir.join(format!("{variant}-back"));
        skopeo(&[
            "copy",
            "--src-tls-verify=false",
            &by_digest,
            &format!("oci:{}:back", back.display()),
        ]);
        let (read_digest, image) = read_layout(&back);
        assert_eq!(read_digest, digest, "{variant}: read back by digest, unchanged");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        assert_eq!(check_pin(&read_digest, hex), Ok(()));
        assert!(
            check_pin(&read_digest, &"0".repeat(64)).is_err(),
            "a wrong pin is refused"
        );
        for fetcher in FETCHERS {
            assert_takes_the_module(fetcher, &image, variant);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The gateway examples pin the artifact this checkout builds: their `sha256` is the digest
/// `scripts/wasm-oci` prints for the filter as it builds it (the `wasm` profile), so that
/// the examples, the docs and the script agree. After a change to the filter:
/// `python3 scripts/wasm-oci --pin`.
#[test]
fn the_gateway_examples_pin_the_artifact_this_checkout_builds() {
    let dir = scratch("pin");
    let run = Command::new("python3")
        .arg(repo().join("scripts/wasm-oci"))
        .arg("--out")
        .arg(dir.join("layout"))
        .env_clear()
        .envs(sluice_testkit::cargo_env())
        .output()
        .expect("python3 scripts/wasm-oci");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let printed = String::from_utf8_lossy(&run.stdout).trim().to_owned();
    let digest = printed.strip_prefix("sha256:").expect("a sha256 digest");
    for (file, pointer) in [
        ("istio/wasmplugin.yaml", "/spec/sha256"),
        (
            "envoy-gateway/envoyextensionpolicy.yaml",
            "/spec/wasm/0/code/image/sha256",
        ),
    ] {
        let path = repo().join("deploy/gateways").join(file);
        let text = std::fs::read_to_string(&path).expect("the example");
        let example: Value = serde_norway::from_str(&text).expect("YAML");
        assert_eq!(
            example.pointer(pointer).and_then(Value::as_str),
            Some(digest),
            "deploy/gateways/{file} pins another artifact than this checkout builds: \
             run `python3 scripts/wasm-oci --pin`"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
