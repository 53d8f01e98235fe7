//! Who may read the run pages: sign-in with GitLab (OAuth 2 authorization code + PKCE), an
//! encrypted session cookie, the loopback-only default, and "can this user see that project".
//!
//! GitLab's OAuth provider: <https://docs.gitlab.com/api/oauth2/> (authorization code flow with
//! PKCE). planbot asks for the `read_user` scope only: the user's token is used once, for
//! `GET /api/v4/user` (who signed in), then dropped. Whether that user may see a project is asked
//! with the bot's own token (`GET /projects/:id/members/all/:user_id`, inherited roles included,
//! Reporter or more), cached for [`ACCESS_TTL`]: planbot never acts as the user.

use crate::capabilities::gitlab::{AccessLevel, User};
use crate::core::config::{Config, PagesAuth};
use crate::core::ids::{ProjectId, UserId};
use crate::flows::app::App;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use cookie::{Cookie, CookieJar, Key, SameSite};
use hmac::{Hmac, Mac};
use oauth2::basic::BasicClient;
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointNotSet,
    EndpointSet, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope, TokenResponse, TokenUrl,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use subtle::ConstantTimeEq;

/// The session cookie (encrypted and authenticated: AES-256-GCM, see [`cookie::PrivateJar`]).
pub const SESSION_COOKIE: &str = "planbot_session";
/// The sign-in in progress: `state`, the PKCE verifier and where to go back (10 minutes).
pub const LOGIN_COOKIE: &str = "planbot_login";
/// How long a sign-in may take between planbot and GitLab's consent screen.
const LOGIN_TTL: Duration = Duration::from_secs(600);
/// How long a membership answer is trusted.
pub const ACCESS_TTL: Duration = Duration::from_secs(60);
/// The GitLab scope planbot asks for.
pub const SCOPE: &str = "read_user";
/// Where GitLab sends the user back to (append to `public_url`).
pub const CALLBACK_PATH: &str = "/auth/callback";

type OAuthClient =
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
struct Login {
    state: String,
    verifier: String,
    next: String,
    expires: u64,
}

/// Sign-in state kept by the service (one per process).
pub struct SignIn {
    client: Option<OAuthClient>,
    http: reqwest::Client,
    user_url: String,
    key: Key,
    secure: bool,
    lifetime: Duration,
    access: Mutex<HashMap<(u64, u64), (Instant, bool)>>,
}

fn now_secs() -> u64 {
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
                        .set_redirect_uri(RedirectUrl::new(format!("{public}{CALLBACK_PATH}"))?)
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
                .as_deref()
                .is_some_and(|u| u.starts_with("https://")),
            lifetime: config.pages.session_lifetime,
            access: Mutex::new(HashMap::new()),
        })
    }

    fn jar(headers: &HeaderMap) -> CookieJar {
        let mut jar = CookieJar::new();
        for v in headers.get_all(header::COOKIE) {
            let Ok(v) = v.to_str() else { continue };
            for c in Cookie::split_parse(v.to_string()).flatten() {
                jar.add_original(c);
            }
        }
        jar
    }

    fn cookie(
        &self,
        name: &'static str,
        value: String,
        path: &'static str,
        max_age: Duration,
    ) -> Cookie<'static> {
        Cookie::build((name, value))
            .path(path)
            .http_only(true)
            .secure(self.secure)
            .same_site(SameSite::Lax)
            .max_age(cookie::time::Duration::seconds(max_age.as_secs() as i64))
            .build()
    }

    fn removal(&self, name: &'static str, path: &'static str) -> HeaderValue {
        let c = self.cookie(name, String::new(), path, Duration::ZERO);
        HeaderValue::from_str(&c.to_string()).expect("a cookie is a header value")
    }

    /// Encrypt `value` into a `Set-Cookie` header value.
    fn set_cookie(
        &self,
        name: &'static str,
        value: &impl Serialize,
        path: &'static str,
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
    fn read_cookie<T: for<'de> Deserialize<'de>>(
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
    pub async fn can_see(&self, app: &App, project: ProjectId, user: u64) -> bool {
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
        match app.gitlab.member_access(project, UserId(user)).await {
            Ok(level) => {
                let ok = level.is_some_and(|l| l >= AccessLevel::REPORTER);
                self.access
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, (Instant::now(), ok));
                ok
            }
            Err(e) => {
                app.metrics.gitlab_error("member_access");
                tracing::warn!(project = project.0, user, error = %e, "cannot check a run page reader's access; denied");
                false
            }
        }
    }
}

/// Where a sign-in may return to: a run page path, nothing else (no open redirect).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if (n == "/runs" || n.starts_with("/runs/") || n.starts_with("/runs?"))
                && !n.contains(['\\', '\r', '\n'])
                && !n.starts_with("//") =>
        {
            n.to_string()
        }
        _ => "/runs".into(),
    }
}

/// Whether the client is the planbot host itself and no proxy relayed the request (a proxy on
/// the same host would make every client look local).
fn is_local(peer: Option<SocketAddr>, headers: &HeaderMap) -> bool {
    let relayed = [
        "forwarded",
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-host",
    ]
    .iter()
    .any(|h| headers.contains_key(*h));
    !relayed && peer.is_some_and(|p| p.ip().is_loopback() || p.ip().to_canonical().is_loopback())
}

/// Middleware in front of `/runs` and `/runs/{id}`: puts the [`Viewer`] in the request's
/// extensions, or answers itself (sign-in redirect, loopback-only refusal).
pub async fn gate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let viewer = match app.config.pages.auth {
        PagesAuth::None => Viewer::Anyone,
        PagesAuth::Loopback => {
            if !is_local(peer, req.headers()) {
                return crate::flows::pages::loopback_only(&app);
            }
            Viewer::Anyone
        }
        PagesAuth::Gitlab => match app.signin.session(req.headers()) {
            Some(s) => Viewer::User(s),
            None => {
                let next = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/runs".into());
                let query = url::form_urlencoded::Serializer::new(String::new())
                    .append_pair("next", &safe_next(Some(&next)))
                    .finish();
                let target = format!("/auth/login?{query}");
                let mut r = Redirect::to(&target).into_response();
                if req.headers().contains_key(header::COOKIE) {
                    // A forged or expired session: drop it.
                    r.headers_mut()
                        .append(header::SET_COOKIE, app.signin.removal(SESSION_COOKIE, "/"));
                }
                return r;
            }
        },
    };
    req.extensions_mut().insert(viewer);
    next.run(req).await
}

#[derive(Deserialize)]
pub struct LoginQuery {
    next: Option<String>,
}

/// `GET /auth/login`: start the authorization code flow with PKCE and a random `state`.
pub async fn login(State(app): State<Arc<App>>, Query(q): Query<LoginQuery>) -> Response {
    let Some(client) = &app.signin.client else {
        return crate::flows::pages::message(
            &app,
            StatusCode::NOT_FOUND,
            "signin_off",
            minijinja::context! {},
        );
    };
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let (url, state) = client
        .authorize_url(CsrfToken::new_random)
        .add_scope(Scope::new(SCOPE.into()))
        .set_pkce_challenge(challenge)
        .url();
    let login = Login {
        state: state.secret().clone(),
        verifier: verifier.secret().clone(),
        next: safe_next(q.next.as_deref()),
        expires: now_secs() + LOGIN_TTL.as_secs(),
    };
    let mut r = Redirect::to(url.as_str()).into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        app.signin
            .set_cookie(LOGIN_COOKIE, &login, "/auth", LOGIN_TTL),
    );
    r
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// `GET /auth/callback`: check `state` against the login cookie, exchange the code (with the
/// PKCE verifier), learn who signed in, and set the session cookie.
pub async fn callback(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let signin = &app.signin;
    let Some(client) = &signin.client else {
        return crate::flows::pages::message(
            &app,
            StatusCode::NOT_FOUND,
            "signin_off",
            minijinja::context! {},
        );
    };
    let refused = |why: &str| {
        let mut r = crate::flows::pages::message(
            &app,
            StatusCode::BAD_REQUEST,
            "signin_refused",
            minijinja::context! { why => why },
        );
        r.headers_mut()
            .append(header::SET_COOKIE, signin.removal(LOGIN_COOKIE, "/auth"));
        r
    };
    let Some(login) = signin
        .read_cookie::<Login>(&headers, LOGIN_COOKIE)
        .filter(|l| l.expires > now_secs())
    else {
        return refused("expired");
    };
    let state_ok = q
        .state
        .as_deref()
        .is_some_and(|s| bool::from(s.as_bytes().ct_eq(login.state.as_bytes())));
    if !state_ok {
        tracing::warn!("run pages sign-in refused: the state does not match the one planbot sent");
        return refused("state");
    }
    if q.error.is_some() {
        return refused("denied");
    }
    let Some(code) = q.code else {
        return refused("denied");
    };
    let token = match client
        .exchange_code(AuthorizationCode::new(code))
        .set_pkce_verifier(PkceCodeVerifier::new(login.verifier))
        .request_async(&signin.http)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %app.scrubber.scrub(&e.to_string()), "run pages sign-in: the token exchange failed");
            return refused("exchange");
        }
    };
    let user = match signin
        .http
        .get(&signin.user_url)
        .bearer_auth(token.access_token().secret())
        .send()
        .await
        .and_then(|r| r.error_for_status())
    {
        Ok(r) => match r.json::<User>().await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "run pages sign-in: GET /user answered something else");
                return refused("exchange");
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "run pages sign-in: GET /user failed");
            return refused("exchange");
        }
    };
    let session = Session {
        user_id: user.id.0,
        username: user.username,
        expires: now_secs() + signin.lifetime.as_secs(),
    };
    tracing::info!(user = %session.username, "signed in to the run pages");
    let mut r = Redirect::to(&login.next).into_response();
    let h = r.headers_mut();
    h.append(header::SET_COOKIE, signin.session_cookie(&session));
    h.append(header::SET_COOKIE, signin.removal(LOGIN_COOKIE, "/auth"));
    r
}

/// `POST /auth/logout`: forget the session.
pub async fn logout(State(app): State<Arc<App>>) -> Response {
    let mut r =
        crate::flows::pages::message(&app, StatusCode::OK, "signed_out", minijinja::context! {});
    r.headers_mut()
        .append(header::SET_COOKIE, app.signin.removal(SESSION_COOKIE, "/"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_the_run_pages() {
        assert_eq!(safe_next(Some("/runs/12")), "/runs/12");
        assert_eq!(safe_next(Some("/runs?state=failed")), "/runs?state=failed");
        for evil in [
            "https://evil.example/",
            "//evil.example/runs",
            "/auth/logout",
            "/runs\\@evil",
        ] {
            assert_eq!(safe_next(Some(evil)), "/runs", "{evil}");
        }
    }

    #[test]
    fn a_proxy_on_the_same_host_is_not_local() {
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert!(is_local(Some(peer), &HeaderMap::new()));
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        assert!(!is_local(Some(peer), &h));
        assert!(!is_local(
            Some("192.0.2.1:5000".parse().unwrap()),
            &HeaderMap::new()
        ));
        assert!(!is_local(None, &HeaderMap::new()));
    }
}
