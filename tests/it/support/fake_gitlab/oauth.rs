//! Sign-in with GitLab: OAuth 2 authorization code flow with PKCE, as GitLab's docs describe it
//! (https://docs.gitlab.com/api/oauth2/#authorization-code-with-proof-key-for-code-exchange-pkce):
//! `GET /oauth/authorize` (the browser, signed in to GitLab, is sent back to the registered
//! redirect URI with `code` and the unchanged `state`), `POST /oauth/token`
//! (`grant_type=authorization_code`, `code`, `redirect_uri`, `code_verifier`, client credentials in
//! the body or as Basic auth; answers `access_token`, `token_type: "Bearer"`, `expires_in: 7200`,
//! `refresh_token`, `scope`, `created_at`), and `GET /api/v4/user` with
//! `Authorization: Bearer <access_token>` (https://docs.gitlab.com/api/oauth2/#access-gitlab-api-with-access-token).
//! An OAuth token here is good for `GET /user` only (scope `read_user`); every other route
//! answers 401 to it, so a test fails if planbot ever acts as the signed-in user.

use super::*;

/// An application registered in the fake (Admin → Applications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeOAuthApp {
    pub client_id: String,
    pub secret: String,
    pub redirect_uri: String,
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct OAuthGrant {
    client_id: String,
    user: u64,
    redirect_uri: String,
    challenge: String,
    scope: String,
}

#[derive(Debug, Default)]
pub(super) struct OAuthState {
    apps: Vec<FakeOAuthApp>,
    /// `_gitlab_session` cookie value → user id (a browser signed in to GitLab).
    browser_sessions: HashMap<String, u64>,
    codes: HashMap<String, OAuthGrant>,
    /// access token → (user id, scope).
    tokens: HashMap<String, (u64, String)>,
    /// What `POST /oauth/token` refused, for tests to assert on.
    token_errors: Vec<String>,
}

impl FakeGitLab {
    /// Register an OAuth application with this redirect URI and scopes.
    pub fn register_oauth_app(&self, redirect_uri: &str, scopes: &[&str]) -> FakeOAuthApp {
        let mut s = self.lock();
        let id = s.id();
        let app = FakeOAuthApp {
            client_id: format!("fake-app-{id}-client-id"),
            secret: format!("gloas-fake-secret-{id}"),
            redirect_uri: redirect_uri.to_string(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        };
        s.oauth.apps.push(app.clone());
        app
    }

    /// The `_gitlab_session` cookie value of a browser where `user` is signed in to GitLab.
    pub fn browser_session(&self, user: &FakeUser) -> String {
        let mut s = self.lock();
        let id = s.id();
        let cookie = format!("fake-gitlab-session-{id}");
        s.oauth.browser_sessions.insert(cookie.clone(), user.id);
        cookie
    }

    /// A URL that signs a real browser in to the fake GitLab as `user` (sets `_gitlab_session`,
    /// the stand-in for typing a password on `/users/sign_in`) and then sends it to `return_to`.
    pub fn browser_sign_in_url(&self, user: &FakeUser, return_to: &str) -> String {
        let session = self.browser_session(user);
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("return_to", return_to)
            .finish();
        format!("{}/-/fake/sign_in_as/{session}?{q}", self.url)
    }

    /// How many OAuth access tokens were issued.
    pub fn oauth_tokens_issued(&self) -> usize {
        self.lock().oauth.tokens.len()
    }

    /// Why `POST /oauth/token` refused requests, oldest first.
    pub fn oauth_token_errors(&self) -> Vec<String> {
        self.lock().oauth.token_errors.clone()
    }
}

pub(super) fn oauth_error(code: StatusCode, error: &str, description: &str) -> Response {
    (
        code,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

/// The user behind an OAuth access token (`Authorization: Bearer`), for `GET /user` only.
pub(super) fn oauth_user(s: &StateInner, headers: &HeaderMap) -> Option<FakeUser> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    let (user, _scope) = s.oauth.tokens.get(token)?;
    s.users.get(user).cloned()
}

pub(super) fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

#[derive(serde::Deserialize)]
pub(super) struct AuthorizeQuery {
    client_id: Option<String>,
    redirect_uri: Option<String>,
    response_type: Option<String>,
    state: Option<String>,
    scope: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
}

pub(super) async fn oauth_authorize(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<AuthorizeQuery>,
) -> Response {
    let mut s = lock!(state);
    let Some(app) = s
        .oauth
        .apps
        .iter()
        .find(|a| Some(&a.client_id) == q.client_id.as_ref())
        .cloned()
    else {
        return err(
            StatusCode::UNAUTHORIZED,
            "Client authentication failed due to unknown client",
        );
    };
    // GitLab shows an error page (no redirect) for a redirect URI that is not registered.
    if q.redirect_uri.as_deref() != Some(app.redirect_uri.as_str()) {
        return err(
            StatusCode::BAD_REQUEST,
            "The redirect uri included is not valid.",
        );
    }
    let back = |params: &[(&str, &str)]| {
        let mut url = url::Url::parse(&app.redirect_uri).unwrap();
        url.query_pairs_mut().extend_pairs(params);
        if let Some(st) = &q.state {
            url.query_pairs_mut().append_pair("state", st);
        }
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", url.as_str())
            .body(Body::empty())
            .unwrap()
    };
    if q.response_type.as_deref() != Some("code") {
        return back(&[("error", "unsupported_response_type")]);
    }
    let scope = q.scope.clone().unwrap_or_default();
    if scope
        .split(' ')
        .any(|sc| !app.scopes.iter().any(|a| a == sc))
    {
        return back(&[("error", "invalid_scope")]);
    }
    let (Some(challenge), Some("S256")) =
        (q.code_challenge.clone(), q.code_challenge_method.as_deref())
    else {
        return back(&[("error", "invalid_request")]);
    };
    let Some(user) = cookie_value(&headers, "_gitlab_session")
        .and_then(|c| s.oauth.browser_sessions.get(&c).copied())
    else {
        // Not signed in to GitLab: its sign-in page (the tests' browsers are always signed in).
        return Response::builder()
            .status(StatusCode::FOUND)
            .header("location", format!("{}/users/sign_in", s.base_url))
            .body(Body::empty())
            .unwrap();
    };
    // The user already authorized this application: GitLab redirects at once.
    let id = s.id();
    let code = format!("fake-code-{id}");
    s.oauth.codes.insert(
        code.clone(),
        OAuthGrant {
            client_id: app.client_id.clone(),
            user,
            redirect_uri: app.redirect_uri.clone(),
            challenge,
            scope,
        },
    );
    drop(s);
    back(&[("code", &code)])
}

pub(super) async fn oauth_token(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    use sha2::Digest;
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let mut s = lock!(state);
    let refuse = |s: &mut StateInner, code: StatusCode, error: &str, why: &str| {
        s.oauth.token_errors.push(format!("{error}: {why}"));
        oauth_error(code, error, why)
    };
    // Client credentials: in the body (GitLab's docs) or as HTTP Basic.
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|b| {
            b.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
        });
    let (client_id, secret) = match basic {
        Some(c) => c,
        None => (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        ),
    };
    let Some(app) = s
        .oauth
        .apps
        .iter()
        .find(|a| a.client_id == client_id && a.secret == secret)
        .cloned()
    else {
        return refuse(
            &mut s,
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "unknown client or wrong secret",
        );
    };
    if form.get("grant_type").map(String::as_str) != Some("authorization_code") {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only authorization_code",
        );
    }
    // A code is good once.
    let Some(grant) = form.get("code").and_then(|c| s.oauth.codes.remove(c)) else {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "unknown or used code",
        );
    };
    if grant.client_id != app.client_id || form.get("redirect_uri") != Some(&grant.redirect_uri) {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "code issued to another client or redirect URI",
        );
    }
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    if computed != grant.challenge {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "PKCE verification failed",
        );
    }
    let id = s.id();
    let token = format!("fake-oauth-access-{id}");
    s.oauth
        .tokens
        .insert(token.clone(), (grant.user, grant.scope.clone()));
    Json(json!({
        "access_token": token,
        "token_type": "Bearer",
        "expires_in": 7200,
        "refresh_token": format!("fake-oauth-refresh-{id}"),
        "scope": grant.scope,
        "created_at": 1_764_680_000
    }))
    .into_response()
}

#[derive(serde::Deserialize)]
pub(super) struct SignInAsQuery {
    return_to: String,
}

/// Test-only: a browser "signs in" to the fake GitLab with a session made by
/// [`FakeGitLab::browser_sign_in_url`].
pub(super) async fn fake_sign_in_as(
    State(state): State<Shared>,
    Path(session): Path<String>,
    Query(q): Query<SignInAsQuery>,
) -> Response {
    if !lock!(state).oauth.browser_sessions.contains_key(&session) {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    }
    Response::builder()
        .status(StatusCode::FOUND)
        .header(
            "set-cookie",
            format!("_gitlab_session={session}; Path=/; HttpOnly"),
        )
        .header("location", q.return_to)
        .body(Body::empty())
        .unwrap()
}
