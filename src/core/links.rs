//! Every address planbot writes for people or GitLab to follow (a note's run page link, a commit
//! status's `target_url`, the drift and failure issues, the apply log, the run pages' own links,
//! the OAuth `redirect_uri`, the webhook URL `doctor` looks for): built here from `public_url`,
//! with its scheme, host, port and path prefix kept, never from the bind address.

use serde::Serialize;

/// The path GitLab sends a signed-in user back to (below [`PublicUrl`]).
pub const CALLBACK_PATH: &str = "/auth/callback";

/// planbot's own address as users and GitLab reach it (`public_url`), e.g.
/// `https://planbot.example.com:8443/planbot`: kept without a trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PublicUrl(String);

impl PublicUrl {
    /// Check and keep a `public_url`: an absolute `http`/`https` URL with a host and no query,
    /// fragment or credentials (its path, if any, is the prefix a proxy serves planbot under).
    pub fn parse(text: &str) -> Result<PublicUrl, String> {
        let trimmed = text.trim().trim_end_matches('/');
        let u = url::Url::parse(trimmed).map_err(|e| format!("`{trimmed}`: {e}"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(format!(
                "`{trimmed}`: expected an http:// or https:// address, e.g. \"https://planbot.example.com\""
            ));
        }
        if u.host_str().is_none_or(str::is_empty) {
            return Err(format!("`{trimmed}`: no host"));
        }
        if u.query().is_some() || u.fragment().is_some() {
            return Err(format!(
                "`{trimmed}`: no query or fragment: a path prefix at most, e.g. \"https://example.com/planbot\""
            ));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(format!("`{trimmed}`: no user or password in the address"));
        }
        let prefix = base_path_of(trimmed);
        let plain =
            |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/');
        if !prefix.bytes().all(plain) || prefix.contains("//") {
            return Err(format!(
                "`{trimmed}`: a path prefix of letters, digits, `-`, `_`, `.` and `/` only, e.g. \"https://example.com/planbot\""
            ));
        }
        Ok(PublicUrl(trimmed.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path prefix planbot is served under behind a proxy: `""` or e.g. `/planbot`.
    pub fn base_path(&self) -> &str {
        base_path_of(&self.0)
    }

    /// `path` (starting with `/`) at this address.
    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }

    /// A run's page: `<public_url>/runs/<id>`.
    pub fn run(&self, id: u64) -> String {
        self.at(&format!("/runs/{id}"))
    }

    /// The OAuth application's redirect URI: `<public_url>/auth/callback`.
    pub fn callback(&self) -> String {
        self.at(CALLBACK_PATH)
    }

    /// The webhook GitLab calls: `<public_url>/webhooks/gitlab`.
    pub fn webhook(&self) -> String {
        self.at("/webhooks/gitlab")
    }

    /// Whether the address names the planbot host itself (`localhost`, `127.0.0.0/8`, `::1`):
    /// nobody else can follow its links.
    pub fn is_loopback(&self) -> bool {
        let Ok(u) = url::Url::parse(&self.0) else {
            return false;
        };
        match u.host() {
            Some(url::Host::Domain(d)) => {
                d.eq_ignore_ascii_case("localhost")
                    || d.to_ascii_lowercase().ends_with(".localhost")
            }
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        }
    }
}

impl std::fmt::Display for PublicUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The path of an absolute URL without a trailing `/` (`""` for none).
fn base_path_of(url: &str) -> &str {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    match after_scheme.find('/') {
        Some(i) => after_scheme[i..].trim_end_matches('/'),
        None => "",
    }
}

/// Where a run's page can be read on the planbot host itself, when its pages are for that host
/// only (`pages.auth = "loopback"`): `http://localhost:<port>/runs/<id>`.
pub fn on_the_host(port: u16, id: u64) -> String {
    format!("http://localhost:{port}/runs/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_and_a_port_are_kept_in_every_link() {
        let u = PublicUrl::parse("https://planbot.example.com:8443/planbot/").unwrap();
        assert_eq!(u.as_str(), "https://planbot.example.com:8443/planbot");
        assert_eq!(u.base_path(), "/planbot");
        assert_eq!(u.run(3), "https://planbot.example.com:8443/planbot/runs/3");
        assert_eq!(
            u.callback(),
            "https://planbot.example.com:8443/planbot/auth/callback"
        );
        assert_eq!(
            u.webhook(),
            "https://planbot.example.com:8443/planbot/webhooks/gitlab"
        );
        assert!(!u.is_loopback());
        let plain = PublicUrl::parse("https://planbot.example.com").unwrap();
        assert_eq!(plain.base_path(), "");
        assert_eq!(plain.run(12), "https://planbot.example.com/runs/12");
    }

    #[test]
    fn a_public_url_that_is_no_address_is_refused() {
        for bad in [
            "planbot.example.com",
            "ftp://planbot.example.com",
            "https://planbot.example.com/?x=1",
            "https://planbot.example.com/#top",
            "https://user:pw@planbot.example.com",
            "https://planbot.example.com/{id}",
            "https://planbot.example.com/a//b",
        ] {
            assert!(PublicUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_addresses_are_known() {
        for local in [
            "http://localhost:8080",
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
        ] {
            assert!(PublicUrl::parse(local).unwrap().is_loopback(), "{local}");
        }
        assert!(!PublicUrl::parse("http://10.0.0.5:8080")
            .unwrap()
            .is_loopback());
    }
}
