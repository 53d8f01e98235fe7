//! The run pages' sign-in state, one per process: the OAuth client, the encrypted session and
//! login cookies, and the cache of "can this GitLab user see that project".
//!
//! GitLab's OAuth provider: <https://docs.gitlab.com/api/oauth2/> (authorization code flow with
//! PKCE). planbot asks for the `read_user` scope only: the user's token is used once, for
//! `GET /api/v4/user` (who signed in), then dropped. Whether that user may see a project is asked
//! with the bot's own token (`GET /projects/:id/members/all/:user_id`, inherited roles included,
//! Reporter or more), cached for [`ACCESS_TTL`]: planbot never acts as the user.

use crate::capabilities::gitlab::AccessLevel;
use crate::capabilities::gitlab::GitLab;
use crate::core::config::{Config, PagesAuth};
use crate::core::ids::{ProjectId, UserId};
use crate::flows::context::metrics::Metrics;
use axum::http::{header, HeaderMap, HeaderValue};
use cookie::{Cookie, CookieJar, Key, SameSite};
use hmac::{Hmac, Mac};
use oauth2::basic::BasicClient;
use oauth2::{
    AuthType, AuthUrl, ClientId, ClientSecret, EndpointNotSet, EndpointSet, RedirectUrl, TokenUrl,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The session cookie (encrypted and authenticated: AES-256-GCM, see [`cookie::PrivateJar`]).
pub const SESSION_COOKIE: &str = "planbot_session";
/// The sign-in in progress: `state`, the PKCE verifier and where to go back (10 minutes).
pub const LOGIN_COOKIE: &str = "planbot_login";
/// How long a sign-in may take between planbot and GitLab's consent screen.
pub(crate) const LOGIN_TTL: Duration = Duration::from_secs(600);
/// How long a membership answer is trusted.
pub const ACCESS_TTL: Duration = Duration::from_secs(60);
/// The GitLab scope planbot asks for.
pub const SCOPE: &str = "read_user";
/// Where GitLab sends the user back to (below `public_url`).
pub use crate::core::links::CALLBACK_PATH;

pub(crate) type OAuthClient =
    BasicClient<EndpointSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointSet>;

/// A signed-in GitLab user, as the session cookie carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub user_id: u64,
    pub username: String,
    /// Unix seconds after which the session is no longer accepted.
    pub expires: u64,
}

/// Who is looking at a run page.
#[derive(Debug, Clone)]
pub enum Viewer {
    /// No sign-in needed (`pages.auth = "none"`, or a loopback client in the default mode).
    Anyone,
    /// A GitLab user: sees the runs of projects they can see.
    User(Session),
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Login {
    pub state: String,
    pub verifier: String,
    pub next: String,
    pub expires: u64,
}

/// Sign-in state kept by the service (one per process).
pub struct SignIn {
    pub(crate) client: Option<OAuthClient>,
    pub(crate) http: reqwest::Client,
    pub(crate) user_url: String,
    key: Key,
    secure: bool,
    /// The path prefix planbot is served under (`public_url`'s path, `""` for none): the
    /// sign-in's redirects and cookies live below it.
    pub(crate) base: String,
    pub(crate) lifetime: Duration,
    access: Mutex<HashMap<(u64, u64), (Instant, bool)>>,
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The cookie key: derived from `fingerprint_key` (so sessions survive a restart and need no
/// new secret), under its own label so it is never the fingerprint key itself.
fn cookie_key(config: &Config) -> Key {
    let mut mac =
        <Hmac<sha2::Sha256> as Mac>::new_from_slice(config.fingerprint_key.expose().as_bytes())
            .expect("HMAC takes any key length");
    mac.update(b"planbot run pages session cookie v1");
    Key::derive_from(&mac.finalize().into_bytes())
}

impl SignIn {
    pub fn new(config: &Config) -> anyhow::Result<SignIn> {
        let client = match (&config.pages.oauth, &config.public_url) {
            (Some(o), Some(public)) if config.pages.auth == PagesAuth::Gitlab => {
                let gitlab = config.gitlab.url.trim_end_matches('/');
                Some(
                    BasicClient::new(ClientId::new(o.client_id.clone()))
                        .set_client_secret(ClientSecret::new(o.client_secret.expose().to_string()))
                        .set_auth_uri(AuthUrl::new(format!("{gitlab}/oauth/authorize"))?)
                        .set_token_uri(TokenUrl::new(format!("{gitlab}/oauth/token"))?)
                        .set_redirect_uri(RedirectUrl::new(public.callback())?)
                        // GitLab's docs send client_id and client_secret in the form body.
                        .set_auth_type(AuthType::RequestBody),
                )
            }
            _ => None,
        };
        let http = reqwest::Client::builder()
            // The token endpoint must not redirect us anywhere (OAuth 2.0 security BCP).
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("planbot/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(SignIn {
            client,
            http,
            user_url: format!("{}/api/v4/user", config.gitlab.url.trim_end_matches('/')),
            key: cookie_key(config),
            secure: config
                .public_url
                .as_ref()
                .is_some_and(|u| u.as_str().starts_with("https://")),
            base: config
                .public_url
                .as_ref()
                .map(|u| u.base_path().to_string())
                .unwrap_or_default(),
            lifetime: config.pages.session_lifetime,
            access: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn jar(headers: &HeaderMap) -> CookieJar {
        let mut jar = CookieJar::new();
        for v in headers.get_all(header::COOKIE) {
            let Ok(v) = v.to_str() else { continue };
            for c in Cookie::split_parse(v.to_string()).flatten() {
                jar.add_original(c);
            }
        }
        jar
    }

    /// `path` below [`SignIn::base`] (`/auth`, or `/` for the session).
    pub(crate) fn cookie(
        &self,
        name: &'static str,
        value: String,
        path: &str,
        max_age: Duration,
    ) -> Cookie<'static> {
        let path = match (self.base.as_str(), path) {
            ("", p) => p.to_string(),
            (base, "/") => base.to_string(),
            (base, p) => format!("{base}{p}"),
        };
        Cookie::build((name, value))
            .path(path)
            .http_only(true)
            .secure(self.secure)
            .same_site(SameSite::Lax)
            .max_age(cookie::time::Duration::seconds(max_age.as_secs() as i64))
            .build()
    }

    pub(crate) fn removal(&self, name: &'static str, path: &str) -> HeaderValue {
        let c = self.cookie(name, String::new(), path, Duration::ZERO);
        HeaderValue::from_str(&c.to_string()).expect("a cookie is a header value")
    }

    /// Encrypt `value` into a `Set-Cookie` header value.
    pub(crate) fn set_cookie(
        &self,
        name: &'static str,
        value: &impl Serialize,
        path: &str,
        max_age: Duration,
    ) -> HeaderValue {
        let mut jar = CookieJar::new();
        let json = serde_json::to_string(value).expect("serialisable");
        jar.private_mut(&self.key)
            .add(self.cookie(name, json, path, max_age));
        let c = jar.get(name).expect("just added");
        HeaderValue::from_str(&c.to_string()).expect("a cookie is a header value")
    }

    /// Decrypt and parse a cookie; `None` when absent, forged, or not ours.
    pub(crate) fn read_cookie<T: for<'de> Deserialize<'de>>(
        &self,
        headers: &HeaderMap,
        name: &str,
    ) -> Option<T> {
        let jar = Self::jar(headers);
        let c = jar.private(&self.key).get(name)?;
        serde_json::from_str(c.value()).ok()
    }

    /// The session in the request, when valid and not expired.
    pub fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let s: Session = self.read_cookie(headers, SESSION_COOKIE)?;
        (s.expires > now_secs()).then_some(s)
    }

    /// A `Set-Cookie` value carrying `session` (tests forge expired ones with it).
    pub fn session_cookie(&self, session: &Session) -> HeaderValue {
        self.set_cookie(SESSION_COOKIE, session, "/", self.lifetime)
    }

    /// Whether `user` can see `project` in GitLab (Reporter or more, inherited roles included),
    /// asked with the bot's token and cached for [`ACCESS_TTL`]. GitLab errors deny (not cached).
    pub async fn can_see(
        &self,
        gitlab: &GitLab,
        metrics: &Metrics,
        project: ProjectId,
        user: u64,
    ) -> bool {
        let key = (project.0, user);
        if let Some((at, ok)) = self
            .access
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            if at.elapsed() < ACCESS_TTL {
                return *ok;
            }
        }
        match gitlab.member_access(project, UserId(user)).await {
            Ok(level) => {
                let ok = level.is_some_and(|l| l >= AccessLevel::REPORTER);
                self.access
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (Instant::now(), ok));
                ok
            }
            Err(e) => {
                metrics.gitlab_error("member_access");
                tracing::warn!(project = project.0, user, error = %e, "cannot check a run page reader's access; denied");
                false
            }
        }
    }
}
