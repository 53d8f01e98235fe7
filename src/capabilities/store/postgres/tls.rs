//! TLS for the PostgreSQL store: the rustls connector a [`StoreTls`] asks for (the chain always
//! verified, the host name for `verify-full`), and what a failed handshake means, in words.

use crate::core::store_tls::{SslMode, StoreTls};
use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector for `tls`; `None` for `sslmode=disable` (plaintext).
pub(super) fn connector(tls: &StoreTls) -> Result<Option<MakeRustlsConnect>> {
    if tls.mode == SslMode::Disable {
        return Ok(None);
    }
    let roots = roots(tls)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("the TLS protocol versions")?;
    let config = if tls.mode.checks_host() {
        builder.with_root_certificates(roots)
    } else {
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .context("the TLS certificate verifier")?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
    }
    .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The trust anchors: the CA file's certificates, or the public web roots.
fn roots(tls: &StoreTls) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let Some(path) = &tls.ca_file else {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(roots);
    };
    let what = || format!("{} {}", tls.ca_from, path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", what()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading {} (a PEM bundle)", what()))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        bail!("{} holds no usable PEM certificate", what());
    }
    Ok(roots)
}

/// `verify-ca` (and planbot's `require`): rustls's verifier, except that a certificate for
/// another name is accepted. It checks the chain before the name, so a name mismatch means the
/// chain is good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Why connecting failed, when TLS is why: an untrusted certificate, one for another host, or
/// a server without TLS. `None` for every other failure.
pub(super) fn explain(err: &(dyn std::error::Error + 'static), tls: &StoreTls) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if let Some(r) = e.downcast_ref::<rustls::Error>().or(inner) {
            return Some(certificate_problem(r, tls));
        }
        if e.to_string().contains("server does not support TLS") {
            return Some(format!(
                "the PostgreSQL server does not offer TLS, and sslmode={} requires it: turn on \
                 `ssl` in the server, or (a trusted network only) write sslmode=disable in store.url",
                tls.mode.as_str()
            ));
        }
        cur = e.source();
    }
    None
}

fn certificate_problem(e: &rustls::Error, tls: &StoreTls) -> String {
    let trust = match &tls.ca_file {
        Some(p) => format!("{} {}", tls.ca_from, p.display()),
        None => "the public web roots (set store.ca_file to the CA that signed it)".into(),
    };
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the PostgreSQL server's certificate is not valid for the host store.url names \
             (sslmode=verify-full checks the name; connect by a name the certificate holds): {e}"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer
            | CertificateError::BadSignature
            | CertificateError::UnsupportedSignatureAlgorithmContext { .. }
            | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. }
            | CertificateError::InvalidPurpose
            | CertificateError::InvalidPurposeContext { .. },
        ) => format!("the PostgreSQL server's certificate is not trusted by {trust}: {e}"),
        rustls::Error::InvalidCertificate(_) => {
            format!("the PostgreSQL server's certificate is refused (checked against {trust}): {e}")
        }
        other => format!("the TLS handshake with the PostgreSQL server failed: {other}"),
    }
}
