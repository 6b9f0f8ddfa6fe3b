//! `sluice-client` with its default features reaches `https://` URLs: a local TLS server
//! with a certificate generated for the test, trusted through the client's `reqwest` builder.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sluice_client::Client;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Serves HTTPS on a free loopback port with a certificate for `localhost`; every answer
/// carries a quota. Returns the port and the certificate to trust.
async fn tls_server() -> (u16, CertificateDer<'static>) {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
    let cert = CertificateDer::from(generated.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(generated.key_pair.serialize_der()));
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(|_req| async {
                    let response = hyper::Response::builder()
                        .header("ratelimit-policy", "\"tls\";q=10;w=60")
                        .header("ratelimit", "\"tls\";r=9;t=60")
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .expect("response");
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, cert)
}

#[tokio::test]
async fn default_features_reach_https_urls() {
    let (port, cert) = tls_server().await;
    let trusted = reqwest::Certificate::from_der(&cert).expect("certificate");
    let http = reqwest::Client::builder()
        .add_root_certificate(trusted)
        .build()
        .expect("reqwest client");
    let client = Client::builder().http_client(http).build().expect("client");
    let response = client
        .send(client.get(format!("https://localhost:{port}/")))
        .await
        .expect("an HTTPS answer");
    assert_eq!(response.status(), 200);
    assert_eq!(response.quota().limit, Some(10));
    assert_eq!(response.quota().remaining, Some(9));

    // Its own reqwest client speaks TLS too: it reaches the server and refuses the
    // certificate it does not trust (without a TLS backend the request could not be made).
    let default = Client::builder()
        .retry_connection_errors(false)
        .build()
        .expect("default client");
    let err = default
        .send(default.get(format!("https://localhost:{port}/")))
        .await
        .expect_err("an untrusted certificate");
    let chain = format!("{err:?}");
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");
}
