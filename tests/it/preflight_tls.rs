//! The Proxmox client over real TLS: certificates are verified by default, a custom CA file is
//! trusted, and `insecure = true` is the explicit opt-out. (A minimal TLS server on
//! 127.0.0.1:0 answering `/version`; certificates made with the real `openssl` CLI.)

use planbot::capabilities::proxmox::{Proxmox, ProxmoxEndpoint, ProxmoxError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for `localhost` / 127.0.0.1 signed by it.
fn make_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Test PVE Root CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// Serve `{"data":{"version":"8.4.1"}}` over TLS to every request; returns the port.
async fn tls_server(cert: &Path, key: &Path) -> u16 {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let body = r#"{"data":{"version":"8.4.1","release":"8.4","repoid":"2a5fa54a"}}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

fn endpoint(port: u16) -> ProxmoxEndpoint {
    let mut ep = ProxmoxEndpoint::new(
        format!("https://localhost:{port}/"),
        "tofu@pve!plan=11111111-2222-3333-4444-555555555555",
    );
    ep.timeout = Duration::from_secs(5);
    ep
}

#[tokio::test]
async fn tls_is_verified_by_default_and_a_ca_file_or_insecure_opt_in_is_needed() {
    assert!(
        Command::new("openssl").arg("version").output().is_ok(),
        "this test needs the openssl CLI to make its certificates (apt-get install openssl)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = make_certs(dir.path());
    let port = tls_server(&cert, &key).await;

    // Default: the cluster's own CA is not trusted.
    let err = Proxmox::new(endpoint(port))
        .unwrap()
        .version()
        .await
        .unwrap_err();
    assert!(matches!(err, ProxmoxError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // The CA file makes it trusted.
    let mut ep = endpoint(port);
    ep.ca_file = Some(ca.clone());
    let v = Proxmox::new(ep).unwrap().version().await.unwrap();
    assert_eq!(v.version, "8.4.1");

    // insecure = true skips verification, explicitly.
    let mut ep = endpoint(port);
    ep.insecure = true;
    assert_eq!(
        Proxmox::new(ep).unwrap().version().await.unwrap().version,
        "8.4.1"
    );

    // A CA file that is not PEM is a clear configuration error.
    let bogus = dir.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let mut ep = endpoint(port);
    ep.ca_file = Some(bogus);
    let err = Proxmox::new(ep).unwrap_err();
    assert!(matches!(err, ProxmoxError::Config(_)), "{err}");
}
