//! TLS to a PostgreSQL store, decided from `store.url` (libpq's `sslmode`, `sslrootcert`) and
//! `store.ca_file`: fail-closed (no plaintext fallback, never an unverified certificate).
//!
//! - `disable`: plaintext. The default for a Unix socket directory or a loopback host
//!   (127.0.0.0/8, ::1, `localhost`): nothing crosses a network.
//! - `require` and `verify-ca`: TLS, the certificate chain verified against the CA (libpq's
//!   `require` accepts any certificate; planbot's never does).
//! - `verify-full`: also the host name. The default for every other host.
//! - `prefer` and `allow` (plaintext when the server offers no TLS) are refused.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The URL parameters planbot reads itself; the driver never sees them.
const OWN_PARAMS: &[&str] = &["sslmode", "sslrootcert"];

/// libpq's `sslmode`, as far as planbot accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext.
    Disable,
    /// TLS; the chain is verified (as `VerifyCa`: planbot accepts no unverified certificate).
    Require,
    /// TLS; the chain is verified, the host name is not.
    VerifyCa,
    /// TLS; the chain and the host name are verified.
    VerifyFull,
}

impl SslMode {
    /// libpq's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the certificate must name the host.
    pub fn checks_host(self) -> bool {
        self == SslMode::VerifyFull
    }
}

/// How planbot talks to the PostgreSQL server `store.url` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreTls {
    pub mode: SslMode,
    /// `sslmode` was in the URL (else the default for its host).
    pub explicit: bool,
    /// The CA bundle (PEM) the server's chain must lead to; `None`: the public web roots.
    pub ca_file: Option<PathBuf>,
    /// Where the CA came from: `store.ca_file` or the URL's `sslrootcert`.
    pub ca_from: &'static str,
}

impl StoreTls {
    /// The TLS settings of the PostgreSQL URL `url`, with `store.ca_file` = `ca_file`.
    /// The error says what to write instead.
    pub fn from_url(url: &str, ca_file: Option<&Path>) -> Result<StoreTls, String> {
        let params = query_params(url);
        let mode = match params.iter().rev().find(|(k, _)| k == "sslmode") {
            None => None,
            Some((_, v)) => Some(match v.as_str() {
                "disable" => SslMode::Disable,
                "require" => SslMode::Require,
                "verify-ca" => SslMode::VerifyCa,
                "verify-full" => SslMode::VerifyFull,
                "prefer" | "allow" => {
                    return Err(format!(
                        "sslmode={v} would fall back to plaintext, which planbot never does: \
                         choose sslmode=disable (a trusted network) or sslmode=verify-full"
                    ))
                }
                other => {
                    return Err(format!(
                        "sslmode={other} is not one of disable, require, verify-ca, verify-full"
                    ))
                }
            }),
        };
        let root_cert = params
            .iter()
            .rev()
            .find(|(k, _)| k == "sslrootcert")
            .map(|(_, v)| PathBuf::from(v));
        let (ca_file, ca_from) = match (ca_file, root_cert) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "store.ca_file {} and the URL's sslrootcert={} differ: set one of them",
                    a.display(),
                    b.display()
                ))
            }
            (Some(a), _) => (Some(a.to_path_buf()), "store.ca_file"),
            (None, Some(b)) => (Some(b), "sslrootcert"),
            (None, None) => (None, "store.ca_file"),
        };
        let (mode, explicit) = match mode {
            Some(m) => (m, true),
            None if hosts(url, &params).iter().all(|h| is_local(h)) => (SslMode::Disable, false),
            None => (SslMode::VerifyFull, false),
        };
        Ok(StoreTls {
            mode,
            explicit,
            ca_file,
            ca_from,
        })
    }
}

/// `verify-full (the default for a network host), CA store.ca_file /etc/planbot/db-ca.pem`.
impl fmt::Display for StoreTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mode.as_str())?;
        if !self.explicit {
            f.write_str(match self.mode {
                SslMode::Disable => " (the default for a local host)",
                _ => " (the default for a network host)",
            })?;
        }
        if self.mode == SslMode::Disable {
            return Ok(());
        }
        match &self.ca_file {
            Some(p) => write!(f, ", CA {} {}", self.ca_from, p.display()),
            None => f.write_str(", CA the public web roots (no store.ca_file)"),
        }
    }
}

/// `url` without the parameters planbot handles itself (`sslmode`, `sslrootcert`), for the
/// driver, which knows neither `verify-*` nor `sslrootcert`.
pub fn driver_url(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
            !pair.is_empty() && !OWN_PARAMS.contains(&decode(key).as_str())
        })
        .collect();
    if kept.is_empty() {
        head.to_string()
    } else {
        format!("{head}?{}", kept.join("&"))
    }
}

/// The query's `key=value` pairs, percent-decoded (as the driver reads them).
fn query_params(url: &str) -> Vec<(String, String)> {
    let Some((_, query)) = url.split_once('?') else {
        return Vec::new();
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// The hosts the driver would try: those of the authority (comma-separated, `[v6]` bracketed,
/// a percent-encoded `/dir` a socket directory) and of `host=` parameters.
fn hosts(url: &str, params: &[(String, String)]) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let mut out: Vec<String> = hostport
        .split(',')
        .filter(|c| !c.is_empty())
        .map(|chunk| {
            if let Some(v6) = chunk.strip_prefix('[') {
                v6.split(']').next().unwrap_or("").to_string()
            } else {
                decode(chunk.split(':').next().unwrap_or(""))
            }
        })
        .collect();
    out.extend(
        params
            .iter()
            .filter(|(k, _)| k == "host")
            .flat_map(|(_, v)| v.split(',').map(str::to_string)),
    );
    out
}

/// A Unix socket directory or a loopback host: nothing crosses a network.
fn is_local(host: &str) -> bool {
    host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").replace('+', "%2B").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(url: &str) -> Result<SslMode, String> {
        StoreTls::from_url(url, None).map(|t| t.mode)
    }

    #[test]
    fn without_sslmode_a_network_host_is_verified_and_a_local_one_is_plaintext() {
        for url in [
            "postgres://planbot@db.internal:5432/planbot",
            "postgres://planbot@10.0.0.5/planbot",
            "postgres://planbot@[2001:db8::1]:5432/planbot",
            "postgres://planbot@localhost,db.internal/planbot",
            "postgres://planbot@%2Frun%2Fpostgresql/planbot?host=db.internal",
        ] {
            assert_eq!(mode(url), Ok(SslMode::VerifyFull), "{url}");
            assert!(!StoreTls::from_url(url, None).unwrap().explicit);
        }
        for url in [
            "postgres://planbot@127.0.0.1:5432/planbot",
            "postgres://planbot@127.1.2.3/planbot",
            "postgres://planbot@[::1]:5432/planbot",
            "postgres://planbot@LOCALHOST/planbot",
            "postgresql://planbot:pw@localhost:5433/planbot?application_name=x",
            "postgres://planbot@%2Frun%2Fpostgresql/planbot",
            "postgres://planbot@localhost/planbot?host=/run/postgresql",
        ] {
            assert_eq!(mode(url), Ok(SslMode::Disable), "{url}");
        }
    }

    #[test]
    fn sslmode_takes_libpqs_names_and_refuses_a_plaintext_fallback() {
        for (m, want) in [
            ("disable", SslMode::Disable),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let t = StoreTls::from_url(&format!("postgres://u@db.internal/p?sslmode={m}"), None)
                .unwrap();
            assert_eq!((t.mode, t.explicit), (want, true));
            // Explicit wins over the local default.
            assert_eq!(
                mode(&format!("postgres://u@localhost/p?sslmode={m}")),
                Ok(want)
            );
        }
        assert!(SslMode::VerifyFull.checks_host() && !SslMode::VerifyCa.checks_host());
        for m in ["prefer", "allow"] {
            let e = mode(&format!("postgres://u@db.internal/p?sslmode={m}")).unwrap_err();
            assert!(e.contains("plaintext"), "{e}");
            assert!(
                e.contains("sslmode=disable") && e.contains("sslmode=verify-full"),
                "{e}"
            );
        }
        let e = mode("postgres://u@db.internal/p?sslmode=verify").unwrap_err();
        assert!(e.contains("sslmode=verify is not one of"), "{e}");
    }

    #[test]
    fn the_ca_comes_from_store_ca_file_or_sslrootcert_never_two_different_ones() {
        let url = "postgres://u@db.internal/p?sslrootcert=/etc/ssl/db-ca.pem&sslmode=verify-ca";
        let t = StoreTls::from_url(url, None).unwrap();
        assert_eq!(t.ca_file, Some(PathBuf::from("/etc/ssl/db-ca.pem")));
        assert_eq!(t.ca_from, "sslrootcert");
        assert_eq!(
            t.to_string(),
            "verify-ca, CA sslrootcert /etc/ssl/db-ca.pem"
        );
        let same = StoreTls::from_url(url, Some(Path::new("/etc/ssl/db-ca.pem"))).unwrap();
        assert_eq!(same.ca_file, t.ca_file);
        let e = StoreTls::from_url(url, Some(Path::new("/other.pem"))).unwrap_err();
        assert!(e.contains("differ"), "{e}");

        let t =
            StoreTls::from_url("postgres://u@db.internal/p", Some(Path::new("/ca.pem"))).unwrap();
        assert_eq!(
            t.to_string(),
            "verify-full (the default for a network host), CA store.ca_file /ca.pem"
        );
        let t = StoreTls::from_url("postgres://u@db.internal/p", None).unwrap();
        assert!(t.to_string().contains("public web roots"), "{t}");
        let t = StoreTls::from_url("postgres://u@127.0.0.1/p", None).unwrap();
        assert_eq!(t.to_string(), "disable (the default for a local host)");
    }

    #[test]
    fn the_driver_gets_the_url_without_planbots_own_parameters() {
        assert_eq!(
            driver_url(
                "postgres://u:p@h:5/d?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem"
            ),
            "postgres://u:p@h:5/d?application_name=x"
        );
        assert_eq!(
            driver_url("postgres://u@h/d?sslmode=verify-ca"),
            "postgres://u@h/d"
        );
        assert_eq!(driver_url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(
            driver_url("postgres://u@h/d?connect_timeout=3"),
            "postgres://u@h/d?connect_timeout=3"
        );
    }
}
