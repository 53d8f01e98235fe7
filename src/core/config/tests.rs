//! The config loader's unit tests: every source, every problem, and what `--check` shows.

use super::*;
use crate::core::store_tls::SslMode;

const MINIMAL: &str = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-secret-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab", 42]
"#;

fn no_files(_: &str) -> Result<String, String> {
    Err("no such file".into())
}

/// Each problem (or warning) as `--check` describes it, for a file named `planbot.toml`.
fn described(problems: &[Problem]) -> Vec<String> {
    problems
        .iter()
        .map(|p| p.describe("planbot.toml"))
        .collect()
}

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::load(MINIMAL, &[], &no_files).unwrap();
    assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.gitlab.url, "https://gitlab.example.com");
    assert_eq!(c.engine.binary, None);
    assert_eq!(c.engine.timeout, Duration::from_secs(1800));
    assert_eq!(c.apply.job_name, "planbot-apply");
    assert!(!c.apply.open_issue_on_failure);
    assert!(c.gitlab.projects.allows(Some(42), None));
    assert!(c.gitlab.projects.allows(Some(7), Some("Infra/Homelab")));
    assert!(!c.gitlab.projects.allows(Some(7), Some("infra/other")));
}

#[test]
fn the_store_is_sqlite_in_data_dir_unless_a_url_says_otherwise() {
    let c = Config::load(
        &format!("data_dir = \"/srv/pb\"\n{MINIMAL}"),
        &[],
        &no_files,
    )
    .unwrap();
    assert_eq!(c.store.url, StoreUrl::Sqlite("/srv/pb/planbot.db".into()));
    assert_eq!(c.store.password, None);

    let read = |p: &str| match p {
        "/run/secrets/db" => Ok("db-pass-from-file\n".to_string()),
        _ => Err("no such file".to_string()),
    };
    let text = format!(
        "{MINIMAL}[store]\nurl = \"postgres://planbot:inline-pass@db.internal:5432/planbot\"\npassword_file = \"/run/secrets/db\"\n"
    );
    let c = Config::load(&text, &[], &read).unwrap();
    assert!(matches!(&c.store.url, StoreUrl::Postgres(u) if u.contains("db.internal")));
    let secrets = c.secrets();
    assert!(
        secrets.iter().any(|s| s == "db-pass-from-file"),
        "{secrets:?}"
    );
    assert!(secrets.iter().any(|s| s == "inline-pass"), "{secrets:?}");
    let shown = c.describe();
    assert!(
        shown.contains("store.url = postgres://planbot:***@db.internal:5432/planbot"),
        "{shown}"
    );
    assert!(shown.contains("store.password = (set)"), "{shown}");
    assert!(!shown.contains("inline-pass") && !shown.contains("db-pass-from-file"));
    assert!(!format!("{c:?}").contains("inline-pass"));

    let env = [(
        "PLANBOT_STORE_URL".to_string(),
        "sqlite:///var/lib/x.db".to_string(),
    )];
    let c = Config::load(MINIMAL, &env, &no_files).unwrap();
    assert_eq!(c.store.url, StoreUrl::Sqlite("/var/lib/x.db".into()));

    for bad in ["mysql://x/y", "sqlite://relative.db", "postgres:///nohost"] {
        let e = Config::load(
            &format!("{MINIMAL}[store]\nurl = \"{bad}\"\n"),
            &[],
            &no_files,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("store.url"), "{bad}: {e}");
    }
}

#[test]
fn a_postgres_store_is_verified_over_tls_unless_local_and_never_falls_back_to_plaintext() {
    let load = |store: &str| Config::load(&format!("{MINIMAL}[store]\n{store}"), &[], &no_files);
    let c = load("url = \"postgres://planbot@db.internal/planbot\"\n").unwrap();
    let tls = c.store.tls().unwrap().unwrap();
    assert_eq!(tls.mode, SslMode::VerifyFull);
    assert!(
        c.describe().contains(
            "store TLS = verify-full (the default for a network host), CA the public web roots"
        ),
        "{}",
        c.describe()
    );
    for local in [
        "postgres://planbot@127.0.0.1:5432/planbot",
        "postgres://planbot@%2Frun%2Fpostgresql/planbot",
    ] {
        let c = load(&format!("url = \"{local}\"\n")).unwrap();
        assert_eq!(c.store.tls().unwrap().unwrap().mode, SslMode::Disable);
    }
    let c = load(
        "url = \"postgres://planbot@db.internal/planbot?sslmode=verify-ca\"\nca_file = \"/etc/planbot/db-ca.pem\"\n",
    )
    .unwrap();
    assert_eq!(
        c.store.ca_file,
        Some(PathBuf::from("/etc/planbot/db-ca.pem"))
    );
    let shown = c.describe();
    assert!(
        shown.contains("store.ca_file = /etc/planbot/db-ca.pem"),
        "{shown}"
    );
    assert!(
        shown.contains("store TLS = verify-ca, CA store.ca_file /etc/planbot/db-ca.pem"),
        "{shown}"
    );
    assert!(Config::load(MINIMAL, &[], &no_files)
        .unwrap()
        .describe()
        .contains("store TLS = (SQLite: no network)"));

    for mode in ["prefer", "allow"] {
        let e = load(&format!(
            "url = \"postgres://planbot@db.internal/planbot?sslmode={mode}\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("store.url")
                && e.contains("plaintext")
                && e.contains("sslmode=disable")
                && e.contains("sslmode=verify-full"),
            "{mode}: {e}"
        );
    }
    let e = load(
        "url = \"postgres://planbot@db.internal/planbot?sslrootcert=/a.pem\"\nca_file = \"/b.pem\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("store.ca_file") && e.contains("differ"), "{e}");
}

#[test]
fn a_misspelled_key_or_section_is_named_with_its_line_and_the_nearest_known_one() {
    let shown = |text: &str| described(&Config::load_all(text, &[], &no_files).problems);
    // MINIMAL is 7 lines; the typos follow it.
    let text = format!(
        "{MINIMAL}[engine]\nbinray = \"tofu\"\n[gitlb]\nurl = \"x\"\n[proxmox.aply]\nendpoint = \"https://pve:8006\"\n[engine.plan]\nmax_concurrent_plans = 3\n"
    );
    assert_eq!(
        shown(&text),
        [
            "unknown config key `engine.binray` (did you mean `engine.binary`?)\n    from planbot.toml, line 9",
            "unknown config key `engine.plan.max_concurrent_plans` (did you mean `plan.max_concurrent_plans`?)\n    from planbot.toml, line 15",
            "unknown config section `[gitlb]` (did you mean `[gitlab]`?)\n    from planbot.toml, line 10",
            "unknown config section `[proxmox.aply]` (did you mean `[proxmox.apply]`?)\n    from planbot.toml, line 12",
        ]
    );
    // Nothing near: the known keys (or sections) of that level.
    assert_eq!(
        shown(&format!("colour = 1\n{MINIMAL}[metrics]\nbearer = \"x\"\n[zzz]\n")),
        [
            "unknown config key `colour` (known keys here: listen, data_dir, public_url, log_format, log_level, fingerprint_key)\n    from planbot.toml, line 1",
            "unknown config key `metrics.bearer` (known keys here: metrics.token)\n    from planbot.toml, line 10",
            "unknown config section `[zzz]` (known sections: [server], [gitlab], [engine], [sandbox], [apply], [drift], [plan], [proxmox], [pages], [metrics], [store], [state], [modules])\n    from planbot.toml, line 11",
        ]
    );
    // A secret's `_file` form is a key; a `_file` of a plain key is not.
    assert_eq!(
        shown(&format!("{MINIMAL}[metrics]\ntoken_fiel = \"m\"\n")),
        ["unknown config key `metrics.token_fiel` (did you mean `metrics.token_file`?)\n    from planbot.toml, line 9"]
    );
}

#[test]
fn a_misspelled_planbot_variable_is_a_warning_naming_the_nearest_one() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let loaded = Config::load_all(
        MINIMAL,
        &env(&[
            ("PLANBOT_GITLAB_TOKNE", "glpat-typo"),
            ("PLANBOT_STORE_PASWORD_FILE", "db"),
            ("PLANBOT_NOTHING_LIKE_IT", "x"),
            // The apply job's variables and a table entry are no typos.
            ("PLANBOT_URL", "https://planbot.example.com"),
            ("PLANBOT_ENGINE_ENV_TF_VAR_x", "1"),
        ]),
        &no_files,
    );
    let warnings = described(&loaded.warnings);
    assert_eq!(
        warnings,
        [
            "environment variable `PLANBOT_GITLAB_TOKNE` sets nothing: no config key reads it (did you mean `PLANBOT_GITLAB_TOKEN`?)\n    from environment variable PLANBOT_GITLAB_TOKNE",
            "environment variable `PLANBOT_STORE_PASWORD_FILE` sets nothing: no config key reads it (did you mean `PLANBOT_STORE_PASSWORD_FILE`?)\n    from environment variable PLANBOT_STORE_PASWORD_FILE",
            "environment variable `PLANBOT_NOTHING_LIKE_IT` sets nothing: no config key reads it\n    from environment variable PLANBOT_NOTHING_LIKE_IT",
        ]
    );
    // A warning, not a problem: the config loads, with the file's token.
    let c = loaded.into_result().expect("loads");
    assert_eq!(c.gitlab.token.expose(), "glpat-secret-token");
}

#[test]
fn env_overrides_win_and_lists_parse() {
    let env = vec![
        ("PLANBOT_GITLAB_TOKEN".to_string(), "from-env".to_string()),
        (
            "PLANBOT_PLAN_MAX_CONCURRENT_PLANS".to_string(),
            "4".to_string(),
        ),
        ("PLANBOT_GITLAB_PROJECTS".to_string(), "a/b, 9".to_string()),
        (
            "PLANBOT_ENGINE_ENV_TF_VAR_pve_token".to_string(),
            "pve-secret".to_string(),
        ),
        ("PLANBOT_UNRELATED".to_string(), "x".to_string()),
    ];
    let c = Config::load(MINIMAL, &env, &no_files).unwrap();
    assert_eq!(c.gitlab.token.expose(), "from-env");
    assert_eq!(c.plan.max_concurrent_plans, 4);
    assert!(c.gitlab.projects.allows(Some(9), None));
    assert!(c.gitlab.projects.allows(None, Some("a/b")));
    assert!(!c.gitlab.projects.allows(Some(42), None));
    assert_eq!(c.engine.env["TF_VAR_pve_token"].expose(), "pve-secret");
}

#[test]
fn secret_files_are_read_and_trimmed() {
    let text = MINIMAL.replace(
        "token = \"glpat-secret-token\"",
        "token_file = \"/run/secrets/gl\"",
    );
    let read = |p: &str| {
        if p == "/run/secrets/gl" {
            Ok("glpat-from-file\n".to_string())
        } else {
            Err("nope".to_string())
        }
    };
    let c = Config::load(&text, &[], &read).unwrap();
    assert_eq!(c.gitlab.token.expose(), "glpat-from-file");
    let both = text.replace("[gitlab]", "[gitlab]\ntoken = \"x\"");
    assert!(matches!(
        Config::load(&both, &[], &read),
        Err(ConfigError::Both { .. })
    ));
    let missing = MINIMAL.replace("token = \"glpat-secret-token\"", "token_file = \"/nope\"");
    let e = Config::load(&missing, &[], &read).unwrap_err();
    assert!(e.to_string().contains("gitlab.token_file"), "{e}");
    // `_file` only exists for secrets.
    let e = Config::load(&format!("listen_file = \"/x\"\n{MINIMAL}"), &[], &read).unwrap_err();
    assert!(e.to_string().contains("`listen_file`"), "{e}");
}

#[test]
fn a_relative_secret_file_is_a_name_in_the_credentials_directory() {
    let text = MINIMAL.replace(
        "token = \"glpat-secret-token\"",
        "token_file = \"gitlab-token\"",
    );
    let read = |p: &str| {
        if p == "/run/credentials/planbot.service/gitlab-token" {
            Ok("glpat-from-credential\n".to_string())
        } else {
            Err(format!("no file {p}"))
        }
    };
    let env = vec![(
        "CREDENTIALS_DIRECTORY".to_string(),
        "/run/credentials/planbot.service/".to_string(),
    )];
    let c = Config::load(&text, &env, &read).unwrap();
    assert_eq!(c.gitlab.token.expose(), "glpat-from-credential");
    // The same name from the environment variable form.
    let env2 = [
        env.clone(),
        vec![(
            "PLANBOT_GITLAB_TOKEN_FILE".to_string(),
            "gitlab-token".to_string(),
        )],
    ]
    .concat();
    let c = Config::load(MINIMAL, &env2, &read).unwrap();
    assert_eq!(c.gitlab.token.expose(), "glpat-from-credential");
    // Without the directory, a relative path is an error that says what it means.
    let e = Config::load(&text, &[], &read).unwrap_err().to_string();
    assert!(e.contains("gitlab.token_file"), "{e}");
    assert!(e.contains("CREDENTIALS_DIRECTORY"), "{e}");
    assert!(e.contains("absolute path"), "{e}");
}

#[test]
fn every_problem_is_reported_at_once_with_where_it_came_from() {
    let text = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token_file = "/run/secrets/gl"
webhook_secret = "change-me"
projects = ["infra/homelab"]
[engine]
timeout = "soon"
[proxmox]
endpoint = "https://pve:8006"
api_token = "PVEAPIToken=a@pve!t=uuid-secret"
"#;
    let read = |p: &str| match p {
        "/run/secrets/gl" => Ok("\n".to_string()),
        _ => Err("no such file".to_string()),
    };
    let env = vec![
        (
            "PLANBOT_PLAN_MAX_CONCURRENT_PLANS".to_string(),
            "many".to_string(),
        ),
        ("PLANBOT_ENGINE_ENV_TF_VAR_x".to_string(), "".to_string()),
    ];
    let loaded = Config::load_all(text, &env, &read);
    let shown = described(&loaded.problems);
    let expect = [
        "config key `plan.max_concurrent_plans`: expected a whole number\n    from environment variable PLANBOT_PLAN_MAX_CONCURRENT_PLANS",
        "config key `engine.env.TF_VAR_x`: is empty\n    from environment variable PLANBOT_ENGINE_ENV_TF_VAR_x",
        "config key `gitlab.token`: is empty\n    from secret file /run/secrets/gl (named in planbot.toml, line 5)",
        "config key `gitlab.webhook_secret`: is still the example's placeholder `change-me`: put the real value here\n    from planbot.toml, line 6",
        "config key `proxmox.api_token`: starts with `PVEAPIToken=`, which is the HTTP header's prefix, not part of the token: write it as user@realm!tokenid=secret, e.g. planbot@pve!plan=<the UUID pveum printed>\n    from planbot.toml, line 12",
        "config key `engine.timeout`: expected number at 0 (write e.g. \"30m\", \"90s\")\n    from planbot.toml, line 9",
    ];
    for e in &expect {
        let head = e.lines().next().unwrap();
        let got = shown
            .iter()
            .find(|s| s.starts_with(&head[..30.min(head.len())]));
        assert_eq!(
            got.map(String::as_str),
            Some(*e),
            "all:\n{}",
            shown.join("\n")
        );
    }
    assert_eq!(shown.len(), expect.len(), "all:\n{}", shown.join("\n"));
    for s in &shown {
        assert!(!s.contains("uuid-secret"), "a secret in {s}");
    }
    assert!(loaded.into_result().is_err());
}

#[test]
fn proxmox_tokens_must_be_user_at_realm_bang_id_equals_secret() {
    assert_eq!(
        pve_token_problem("planbot@pve!plan=a1b2c3d4-0000-1111-2222-333344445555"),
        None
    );
    assert_eq!(pve_token_problem("root@pam!tofu_01=x"), None);
    for bad in [
        "PVEAPIToken=planbot@pve!plan=uuid",
        "planbot@pve!plan",
        "planbot@pve=uuid",
        "planbot!plan=uuid",
        "planbot@pve!=uuid",
        "planbot@pve!plan=",
        "planbot@pve!1plan=uuid",
        "a1b2c3d4-0000-1111-2222-333344445555",
    ] {
        let problem = pve_token_problem(bad);
        assert!(problem.is_some(), "{bad} accepted");
        assert!(
            !problem.unwrap().contains("uuid"),
            "the secret is quoted for {bad}"
        );
    }
    // Also the provider's own variable in engine.env.
    let text = format!("{MINIMAL}\n[engine]\nenv = {{ PROXMOX_VE_API_TOKEN = \"uuid-only\" }}\n");
    let e = Config::load(&text, &[], &no_files).unwrap_err().to_string();
    assert!(
        e.contains("engine.env.PROXMOX_VE_API_TOKEN") && e.contains("no `=secret`"),
        "{e}"
    );
}

#[test]
fn log_format_and_level_are_checked() {
    let c = Config::load(
        &format!("log_format = \"json\"\nlog_level = \"warn,planbot=debug\"\n{MINIMAL}"),
        &[],
        &no_files,
    )
    .unwrap();
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.log.level.as_deref(), Some("warn,planbot=debug"));
    let env = vec![("PLANBOT_LOG_FORMAT".to_string(), "json".to_string())];
    assert_eq!(
        Config::load(MINIMAL, &env, &no_files).unwrap().log.format,
        LogFormat::Json
    );
    assert_eq!(
        Config::load(MINIMAL, &[], &no_files).unwrap().log.format,
        LogFormat::Text
    );
    let problems = Config::load_all(
        &format!("log_format = \"xml\"\nlog_level = \"planbot=loud\"\n{MINIMAL}"),
        &[],
        &no_files,
    )
    .problems;
    let keys: Vec<_> = problems.iter().filter_map(|p| p.error.key()).collect();
    assert_eq!(keys, ["log_format", "log_level"], "{problems:?}");
}

#[test]
fn describe_never_prints_secrets() {
    let text = format!(
        "{MINIMAL}\n[engine]\nenv = {{ TF_VAR_x = \"engine-secret-value\", TF_HTTP_PASSWORD = \"state-password-value\", TF_HTTP_USERNAME = \"planbot\" }}\nsecret_env = [\"TF_VAR_x\"]\n[proxmox]\nendpoint = \"https://pve:8006\"\napi_token = \"a@pve!t=uuid-secret\"\n"
    );
    let c = Config::load(&text, &[], &no_files).unwrap();
    let d = c.describe();
    for s in [
        "glpat-secret-token",
        "hook-secret",
        "engine-secret-value",
        "state-password-value",
        "uuid-secret",
        "0123456789abcdef0123",
    ] {
        assert!(!d.contains(s), "{s} leaked in:\n{d}");
    }
    // A user name is no secret: shown, and never scrubbed as one.
    assert!(
        d.contains(r#"engine.env = { TF_HTTP_PASSWORD = (set), TF_HTTP_USERNAME = "planbot", TF_VAR_x = (set) }"#),
        "{d}"
    );
    assert!(!c.secrets().contains(&"planbot".to_string()));
    assert!(c.secrets().contains(&"state-password-value".to_string()));
    assert!(c.secrets().contains(&"engine-secret-value".to_string()));
    assert!(d.contains("gitlab.token = (set)"));
    assert!(d.contains("proxmox.plan.endpoint = https://pve:8006"));
    assert!(!format!("{c:?}").contains("glpat-secret-token"));
    assert!(c.secrets().contains(&"uuid-secret".to_string()));
}

#[test]
fn missing_credentials_are_explained() {
    let text = MINIMAL.replace("webhook_secret = \"hook-secret\"\n", "");
    let e = Config::load(&text, &[], &no_files).unwrap_err();
    assert!(e.to_string().contains("gitlab.webhook_secret"), "{e}");
    let e = Config::load(&MINIMAL.replace("fingerprint_key", "#"), &[], &no_files).unwrap_err();
    assert!(e.to_string().contains("fingerprint_key"), "{e}");
    let e = Config::load(
        &format!("{MINIMAL}\n[engine]\ntimeout = \"soon\"\n"),
        &[],
        &no_files,
    )
    .unwrap_err();
    assert!(e.to_string().contains("engine.timeout"), "{e}");
}

#[test]
fn run_pages_fail_closed_and_sign_in_needs_oauth_and_public_url() {
    let c = Config::load(MINIMAL, &[], &no_files).unwrap();
    assert_eq!(
        c.pages.auth,
        PagesAuth::Loopback,
        "no [gitlab.oauth]: loopback only"
    );
    let oauth = format!(
        "public_url = \"https://planbot.example.com\"\n{MINIMAL}\n[gitlab.oauth]\nclient_id = \"app-id\"\nclient_secret = \"oauth-secret-value\"\n"
    );
    let c = Config::load(&oauth, &[], &no_files).unwrap();
    assert_eq!(
        c.pages.auth,
        PagesAuth::Gitlab,
        "sign-in is the default with oauth"
    );
    assert!(c.secrets().contains(&"oauth-secret-value".to_string()));
    assert!(!c.describe().contains("oauth-secret-value"));
    assert!(c.describe().contains("gitlab.oauth.client_secret = (set)"));
    let e = Config::load(
        &format!("{MINIMAL}\n[pages]\nauth = \"gitlab\"\n"),
        &[],
        &no_files,
    )
    .unwrap_err();
    assert!(e.to_string().contains("gitlab.oauth.client_id"), "{e}");
    let e = Config::load(
        &oauth.replace("public_url = \"https://planbot.example.com\"\n", ""),
        &[],
        &no_files,
    )
    .unwrap_err();
    assert!(e.to_string().contains("`public_url`"), "{e}");
    let e = Config::load(
        &format!("{MINIMAL}\n[pages]\nauth = \"open\"\n"),
        &[],
        &no_files,
    )
    .unwrap_err();
    assert!(e.to_string().contains("pages.auth"), "{e}");
    let c = Config::load(
        &format!("{MINIMAL}\n[pages]\nauth = \"none\"\n"),
        &[],
        &no_files,
    )
    .unwrap();
    assert_eq!(c.pages.auth, PagesAuth::None);
}

#[test]
fn the_example_config_documents_every_key_and_loads() {
    let example = include_str!("../../../deploy/planbot.example.toml");
    for k in KEYS {
        let (path, kind, secret) = (k.path, k.kind, k.secret);
        let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
        if !section.is_empty() {
            assert!(
                example.contains(&format!("[{section}]")),
                "section [{section}] missing"
            );
        }
        let documented = example.lines().any(|l| {
            let l = l.trim_start_matches('#').trim();
            l.starts_with(&format!("{key} ="))
                || (secret && kind != Kind::Table && l.starts_with(&format!("{key}_file =")))
        });
        assert!(
            documented,
            "{path} is not documented in deploy/planbot.example.toml"
        );
    }
    let read = |p: &str| {
        Ok(if p.contains("pve-token") {
            "planbot@pve!plan=0123-4567\n".to_string()
        } else {
            format!("secret from {p} 0123456789\n")
        })
    };
    // As shipped (its secrets named in $CREDENTIALS_DIRECTORY), its placeholder stops it,
    // named with its line.
    let env = [(
        CREDENTIALS_DIRECTORY.to_string(),
        "/run/credentials/planbot.service".to_string(),
    )];
    let problems = Config::load_all(example, &env, &read).problems;
    assert_eq!(problems.len(), 1, "{problems:?}");
    let line = example
        .lines()
        .position(|l| l.starts_with("env = { TF_VAR_encryption_passphrase = \"change-me\""))
        .unwrap();
    assert_eq!(
        problems[0].describe("planbot.toml"),
        format!("config key `engine.env.TF_VAR_encryption_passphrase`: is still the example's placeholder `change-me`: put the real value here\n    from planbot.toml, line {}", line + 1)
    );
    let example = example.replace("\"change-me\"", "\"a-real-passphrase\"");
    let c = Config::load(&example, &env, &read).expect("the example loads");
    assert_eq!(
        c.gitlab.token.expose(),
        "secret from /run/credentials/planbot.service/gitlab-token 0123456789"
    );
    assert_eq!(
        c.proxmox.for_plan().endpoint.as_deref(),
        Some("https://pve.example.com:8006")
    );
}

#[test]
fn operator_policy_sets_are_read_and_checked_with_their_line() {
    let text = format!(
        "{MINIMAL}\n[[policy_sets]]\nname = \"guardrails\"\npath = \"/etc/planbot/policies\"\nowners = [\"alice\", \"group:infra/admins\"]\n"
    );
    let c = Config::load(&text, &[], &no_files).unwrap();
    assert_eq!(
        c.policy_sets,
        [PolicySetSpec {
            name: "guardrails".into(),
            path: "/etc/planbot/policies".into(),
            owners: vec![
                policy::Owner::User("alice".into()),
                policy::Owner::Group("infra/admins".into())
            ],
            roots: vec![],
            namespace: "main".into(),
        }]
    );
    assert!(c.describe().contains(
        "policy_sets.guardrails = { path = \"/etc/planbot/policies\", namespace = \"main\", owners = [\"alice\", \"group:infra/admins\"], roots = [] }"
    ));

    let text = format!(
        "{MINIMAL}\n[[policy_sets]]\nname = \"a\"\npath = \"/p\"\n\n[[policy_sets]]\nname = \"a\"\npath = \"policies\"\nnamespace = \"x-y\"\nowner = [\"bob\"]\n"
    );
    let shown = described(&Config::load_all(&text, &[], &no_files).problems);
    assert_eq!(
        shown,
        [
            "config key `policy_sets[1].owner`: unknown key (did you mean `owners`?)\n    from planbot.toml, line 17",
            "config key `policy_sets[1].name`: `a` is used twice; names must be unique\n    from planbot.toml, line 14",
            "config key `policy_sets[1].path`: `policies` is not an absolute path (a directory on planbot's host)\n    from planbot.toml, line 15",
            "config key `policy_sets[1].namespace`: `x-y` is not a Rego package (identifiers joined by dots, like `main` or `terraform.proxmox`)\n    from planbot.toml, line 16",
        ]
    );
}

#[test]
fn a_duration_given_as_a_bare_number_gets_an_example_of_one() {
    let text = format!("{MINIMAL}[engine]\ntimeout = 30\n");
    let shown = described(&Config::load_all(&text, &[], &no_files).problems);
    assert_eq!(
        shown,
        ["config key `engine.timeout`: expected a string, found integer (write e.g. \"30m\", \"90s\": a number and its unit, in quotes)\n    from planbot.toml, line 9"]
    );
}

#[test]
fn a_size_is_read_with_its_unit_and_a_bad_one_falls_back_to_the_declared_default() {
    let defaults = Config::load(MINIMAL, &[], &no_files).unwrap();
    assert_eq!(defaults.sandbox.memory_max, 4 << 30);
    assert_eq!(defaults.sandbox.disk_max, 4 << 30);
    assert_eq!(defaults.sandbox.job_memory_max, 4 << 30);
    assert_eq!(defaults.sandbox.connect_ports, [443]);

    let text = format!(
        "{MINIMAL}[sandbox]\nmemory_max = \"lots\"\ndisk_max = \"1 MiB\"\njob_memory_max = \"2GiB\"\n"
    );
    let env = [(
        "PLANBOT_SANDBOX_CONNECT_PORTS".to_string(),
        "443, 8443".to_string(),
    )];
    let loaded = Config::load_all(&text, &env, &no_files);
    let shown = described(&loaded.problems);
    assert_eq!(
        shown,
        [
            "config key `sandbox.memory_max`: `lots`: expected a size of at least 64 MiB, such as \"512 MiB\" or \"4 GiB\"\n    from planbot.toml, line 9",
            "config key `sandbox.disk_max`: `1 MiB`: expected a size of at least 64 MiB, such as \"512 MiB\" or \"4 GiB\"\n    from planbot.toml, line 10",
        ]
    );
    let c = loaded
        .config
        .expect("built, the defaults standing in for the bad values");
    assert_eq!(c.sandbox.memory_max, 4 << 30);
    assert_eq!(c.sandbox.disk_max, 4 << 30);
    assert_eq!(c.sandbox.job_memory_max, 2 << 30);
    assert_eq!(c.sandbox.connect_ports, [443, 8443]);
}

#[test]
fn trusted_proxies_are_addresses_or_ranges_and_a_wrong_one_is_a_problem() {
    let c = Config::load(
        &format!("{MINIMAL}[server]\ntrusted_proxies = [\"10.0.0.5\", \"fd00::/8\"]\n"),
        &[],
        &no_files,
    )
    .unwrap();
    assert_eq!(
        format!("{:?}", c.server.trusted_proxies),
        "[10.0.0.5, fd00::/8]"
    );
    assert!(c.server.trusted_proxies[1].contains("fd00::1".parse().unwrap()));
    let bad = Config::load(
        &format!("{MINIMAL}[server]\ntrusted_proxies = [\"proxy.internal\"]\n"),
        &[],
        &no_files,
    )
    .unwrap_err();
    let text = format!("{bad:?}");
    assert!(text.contains("proxy.internal"), "{text}");
}
