//! `planbot apply-job`: the client side of the manual apply job, a curl replacement for CI.
//!
//! It sends the job's `CI_JOB_TOKEN` to `POST $PLANBOT_URL/api/v1/apply`, prints the streamed
//! log as it arrives, and succeeds only when planbot's last word is `planbot: apply succeeded`.
//! It takes exactly the inputs of the component's curl script (`templates/planbot-apply.yml`):
//! `PLANBOT_URL`, `PLANBOT_CONFIRM` (hexadecimal) and `PLANBOT_ROOTS` (names separated by spaces
//! or commas), checked the same way, with the same messages.

use anyhow::{Context, Result};
use futures::StreamExt;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

/// The line planbot ends a successful apply with.
pub const SUCCESS_LINE: &str = "planbot: apply succeeded";
/// Keep-alive lines planbot sends while the engine is quiet; never the verdict.
pub const KEEPALIVE_PREFIX: &str = "planbot: still working";

/// What the job passes to planbot.
pub struct ApplyJobRequest {
    pub url: String,
    pub job_token: String,
    pub confirm: Option<String>,
    pub roots: Vec<String>,
}

/// Run the request, copying the log to `out`; returns whether planbot said the apply succeeded.
pub async fn run(req: &ApplyJobRequest, out: &mut impl Write) -> Result<bool> {
    let mut body = serde_json::Map::new();
    if let Some(c) = req.confirm.as_deref().filter(|c| !c.trim().is_empty()) {
        body.insert("confirm".into(), c.trim().into());
    }
    if !req.roots.is_empty() {
        body.insert("roots".into(), req.roots.clone().into());
    }
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        // No total timeout: a long apply streams keep-alive lines instead.
        .read_timeout(Duration::from_secs(15 * 60))
        .build()
        .context("building the HTTP client")?;
    let url = format!("{}/api/v1/apply", req.url.trim_end_matches('/'));
    let response = client
        .post(&url)
        .header("JOB-TOKEN", &req.job_token)
        .json(&body)
        .send()
        .await
        .with_context(|| format!("could not reach planbot at {url}"))?;
    let mut stream = response.bytes_stream();
    let mut last_line = String::new();
    let mut pending = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("the log stream from planbot broke off")?;
        out.write_all(&chunk)?;
        out.flush()?;
        pending.extend_from_slice(&chunk);
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if !line.is_empty() && !line.starts_with(KEEPALIVE_PREFIX) {
                last_line = line;
            }
        }
    }
    let tail = String::from_utf8_lossy(&pending).trim_end().to_string();
    if !tail.is_empty() && !tail.starts_with(KEEPALIVE_PREFIX) {
        last_line = tail;
    }
    Ok(last_line == SUCCESS_LINE)
}

/// `PLANBOT_CONFIRM` as the curl script reads it: whitespace dropped, then hexadecimal or refused.
pub fn parse_confirm(value: &str) -> Result<Option<String>, &'static str> {
    let confirm: String = value.chars().filter(|c| !c.is_whitespace()).collect();
    if confirm.is_empty() {
        return Ok(None);
    }
    if confirm.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(Some(confirm))
    } else {
        Err("planbot: PLANBOT_CONFIRM must be hexadecimal (a fingerprint prefix)")
    }
}

/// `PLANBOT_ROOTS` as the curl script reads it: names separated by spaces or commas.
pub fn parse_roots(value: &str) -> Result<Vec<String>, &'static str> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|r| !r.is_empty())
        .map(|r| {
            if r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
            {
                Ok(r.to_string())
            } else {
                Err("planbot: PLANBOT_ROOTS must be root names (letters, digits, '.', '-', '_') separated by spaces or commas")
            }
        })
        .collect()
}

/// The command: reads `PLANBOT_URL`, `CI_JOB_TOKEN`, `PLANBOT_CONFIRM`, `PLANBOT_ROOTS` (flags
/// override).
pub fn main(url: Option<String>, confirm: Option<String>, roots: Vec<String>) -> Result<ExitCode> {
    let url = url
        .or_else(|| std::env::var("PLANBOT_URL").ok())
        .filter(|u| !u.trim().is_empty())
        .context("set PLANBOT_URL (or --url) to planbot's public URL")?;
    let job_token = std::env::var("CI_JOB_TOKEN")
        .context("CI_JOB_TOKEN is not set: run this inside the planbot-apply CI job")?;
    let confirm = confirm.or_else(|| std::env::var("PLANBOT_CONFIRM").ok());
    let roots = if roots.is_empty() {
        std::env::var("PLANBOT_ROOTS").unwrap_or_default()
    } else {
        roots.join(" ")
    };
    // Refused before anything leaves the job, with the curl script's words (on stdout, as there).
    let (confirm, roots) = match (
        parse_confirm(confirm.as_deref().unwrap_or_default()),
        parse_roots(&roots),
    ) {
        (Ok(c), Ok(r)) => (c, r),
        (Err(e), _) | (_, Err(e)) => {
            println!("{e}");
            return Ok(ExitCode::from(1));
        }
    };
    let req = ApplyJobRequest {
        url,
        job_token,
        confirm,
        roots,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ok = runtime.block_on(run(&req, &mut std::io::stdout()))?;
    if ok {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("planbot-apply: planbot did not report success (see the last line above)");
        Ok(ExitCode::from(1))
    }
}
