//! Stage 4's companion: what GitLab's MR widgets show of each clean plan (its counts, its lint,
//! preflight and policy findings at the line of their resource), recorded with its fingerprint
//! for the MR pipeline's job to download (`flows::review::widgets`).

use super::note::Posted;
use super::prepare::Prepared;
use super::roots::{Outcome, RootResult};
use crate::capabilities::workspace::RootFiles;
use crate::core::events::PlanJob;
use crate::core::summary::Summary;
use crate::core::widgets::{root_widgets, ConfigFile, RootWidgets};
use crate::flows::context::app_state::App;
use anyhow::Result;

/// Each clean plan's widgets, by root, with the verdicts on its `note`: texts scrubbed with the
/// note's scrubber and defused.
/// The lines come from the root's own `.tf`/`.tofu` files in the checkout (regular files only,
/// no link followed, each at most 4 MiB: `RootFiles`); a root whose files cannot be read gets
/// its issues at line 1 of its directory, and the log says why.
pub(super) async fn compute(
    prepared: &Prepared,
    results: &[RootResult],
    note: &Posted,
) -> Vec<(String, RootWidgets)> {
    let clean = |t: &str| crate::core::defuse::defuse(&note.scrubber.scrub(t)).into_owned();
    let mut out = Vec::new();
    for r in results {
        let Outcome::Planned {
            planned, findings, ..
        } = &r.outcome
        else {
            continue;
        };
        if planned.plan().errored {
            continue;
        }
        let dir = prepared
            .config
            .roots
            .iter()
            .find(|c| c.name == r.name)
            .map(|c| c.dir.clone())
            .unwrap_or_else(|| ".".into());
        let files = match config_files(prepared.checkout.path(), &dir).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(root = %r.name, error = %format!("{e:#}"), "the widgets' lines: the root's files could not be read");
                Vec::new()
            }
        };
        let verdict = note.verdict_of(&r.name);
        let summary = Summary::of(planned.plan());
        out.push((
            r.name.clone(),
            root_widgets(&r.name, &summary, findings, &verdict, &files, &dir, &clean),
        ));
    }
    out
}

/// The root's `.tf` and `.tofu` files (not the JSON ones: no line to point at), their paths
/// from the repository top; read off the async workers.
async fn config_files(checkout: &std::path::Path, dir: &str) -> Result<Vec<ConfigFile>> {
    let (checkout, dir) = (checkout.to_path_buf(), dir.to_string());
    tokio::task::spawn_blocking(move || {
        let files = RootFiles::open(&checkout, &dir)?.config_files()?;
        Ok(files
            .into_iter()
            .filter(|(name, _)| name.ends_with(".tf") || name.ends_with(".tofu"))
            .map(|(name, text)| ConfigFile {
                path: if dir == "." {
                    name
                } else {
                    format!("{}/{name}", dir.trim_end_matches('/'))
                },
                text,
            })
            .collect())
    })
    .await?
}

/// Store what [`compute`] found, once the runs and fingerprints are recorded.
pub(super) async fn record(
    app: &App,
    job: &PlanJob,
    widgets: Vec<(String, RootWidgets)>,
) -> Result<()> {
    for (root, w) in widgets {
        app.store
            .record_widgets(job.project, job.mr, &root, &job.head, &w)
            .await?;
    }
    Ok(())
}
