//! TLS material for test servers: a CA, a server and a client certificate it signed, and an
//! unrelated second CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::ScratchDir;

/// PEM files in a fresh directory: `ca.pem`; `server.pem` and `server-key.pem`, signed by
/// that CA and valid for `127.0.0.1` (an IP SAN) and `localhost`; `client.pem` and
/// `client-key.pem`, signed by the same CA; and `other-ca.pem`, a CA that signed nothing here
/// (for "wrong CA" tests).
///
/// The server certificate may also serve as a client certificate (Redis presents it when it
/// connects to a master, another cluster node or a sentinel). Clones share the directory,
/// which is removed when the last of them drops: a server started with a clone keeps its
/// files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    other_ca: PathBuf,
    dir: Arc<ScratchDir>,
}

/// A CA with common name `name`: its certificate and key.
fn new_ca(name: &str) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("cannot generate a key: {e}"));
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("CA params: {e}"));
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params
        .self_signed(&key)
        .unwrap_or_else(|e| panic!("cannot sign the CA {name}: {e}"));
    (cert, key)
}

/// A leaf certificate for `names` (IP addresses become IP SANs) with common name `cn` and
/// extended key usages `usages`, signed by `ca`: its certificate and key.
fn leaf(
    cn: &str,
    names: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    ca: &(Certificate, KeyPair),
) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("cannot generate a key: {e}"));
    let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
    let mut params = CertificateParams::new(names).unwrap_or_else(|e| panic!("params for {cn}: {e}"));
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = usages;
    let cert = params
        .signed_by(&key, &ca.0, &ca.1)
        .unwrap_or_else(|e| panic!("cannot sign the certificate for {cn}: {e}"));
    (cert, key)
}

impl TlsFiles {
    /// Generates the files in a fresh directory `sluice-<tag>-…` under the system's
    /// temporary directory; panics (a test fixture) if it cannot.
    pub fn generate(tag: &str) -> TlsFiles {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = ScratchDir::new(tag);
        let ca = new_ca("Sluice test CA");
        let server = leaf(
            "localhost",
            &["127.0.0.1", "localhost"],
            vec![ServerAuth, ClientAuth],
            &ca,
        );
        let client = leaf("sluice-test-client", &[], vec![ClientAuth], &ca);
        let other = new_ca("Sluice other test CA");
        let files = [
            ("ca.pem", ca.0.pem()),
            ("server.pem", server.0.pem()),
            ("server-key.pem", server.1.serialize_pem()),
            ("client.pem", client.0.pem()),
            ("client-key.pem", client.1.serialize_pem()),
            ("other-ca.pem", other.0.pem()),
        ];
        for (name, pem) in files {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        }
        TlsFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
            other_ca: dir.join("other-ca.pem"),
            dir: Arc::new(dir),
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate that signed the server and client certificates (`ca.pem`).
    pub fn ca(&self) -> &Path {
        &self.ca
    }

    /// The server certificate, for `127.0.0.1` and `localhost` (`server.pem`).
    pub fn server_cert(&self) -> &Path {
        &self.server_cert
    }

    /// The server certificate's private key (`server-key.pem`).
    pub fn server_key(&self) -> &Path {
        &self.server_key
    }

    /// The client certificate (`client.pem`).
    pub fn client_cert(&self) -> &Path {
        &self.client_cert
    }

    /// The client certificate's private key (`client-key.pem`).
    pub fn client_key(&self) -> &Path {
        &self.client_key
    }

    /// A CA certificate unrelated to every other file here (`other-ca.pem`).
    pub fn other_ca(&self) -> &Path {
        &self.other_ca
    }
}
