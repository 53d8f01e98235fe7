//! Who may read the run pages: the gate in front of them (the loopback-only default, or a
//! signed-in GitLab user) and the sign-in handlers (`/auth/login`, the OAuth callback, logout).
//! The state they work on (cookies, sessions, membership cache) is [`crate::flows::context::session::SignIn`].

use crate::capabilities::gitlab::User;
use crate::core::config::PagesAuth;
use crate::flows::context::app_state::App;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use oauth2::{
    AuthorizationCode, CsrfToken, PkceCodeChallenge, PkceCodeVerifier, Scope, TokenResponse,
};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

use crate::flows::context::session::*;

/// Where a sign-in may return to: the landing page or a run page path, nothing else (no open
/// redirect).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if (n == "/" || n == "/runs" || n.starts_with("/runs/") || n.starts_with("/runs?"))
                && !n.contains(['\\', '\r', '\n'])
                && !n.starts_with("//") =>
        {
            n.to_string()
        }
        _ => "/runs".into(),
    }
}

/// Whether a proxy says it relayed the request.
fn relayed(headers: &HeaderMap) -> bool {
    [
        "forwarded",
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-host",
    ]
    .iter()
    .any(|h| headers.contains_key(*h))
}

/// Whether the client is the planbot host itself and no proxy relayed the request (a proxy on
/// the same host would make every client look local).
fn is_local(peer: Option<SocketAddr>, headers: &HeaderMap) -> bool {
    !relayed(headers)
        && peer.is_some_and(|p| p.ip().is_loopback() || p.ip().to_canonical().is_loopback())
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
                return crate::flows::service::pages::loopback_only(&app, relayed(req.headers()));
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
                let target = format!("{}/auth/login?{query}", app.signin.base);
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
        return crate::flows::service::pages::message(
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
        return crate::flows::service::pages::message(
            &app,
            StatusCode::NOT_FOUND,
            "signin_off",
            minijinja::context! {},
        );
    };
    let refused = |why: &str| {
        let mut r = crate::flows::service::pages::message(
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
    let mut r = Redirect::to(&format!("{}{}", signin.base, login.next)).into_response();
    let h = r.headers_mut();
    h.append(header::SET_COOKIE, signin.session_cookie(&session));
    h.append(header::SET_COOKIE, signin.removal(LOGIN_COOKIE, "/auth"));
    r
}

/// `POST /auth/logout`: forget the session.
pub async fn logout(State(app): State<Arc<App>>) -> Response {
    let mut r = crate::flows::service::pages::message(
        &app,
        StatusCode::OK,
        "signed_out",
        minijinja::context! {},
    );
    r.headers_mut()
        .append(header::SET_COOKIE, app.signin.removal(SESSION_COOKIE, "/"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn next_stays_on_the_run_pages() {
        assert_eq!(safe_next(Some("/runs/12")), "/runs/12");
        assert_eq!(safe_next(Some("/runs?state=failed")), "/runs?state=failed");
        assert_eq!(safe_next(Some("/")), "/");
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
