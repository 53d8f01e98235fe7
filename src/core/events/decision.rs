//! The pure events → jobs decision (docs/workflow.md, "What planbot does with each event"):
//! what one authentic delivery means, as the jobs to enqueue and the outcome recorded with it.

use super::commands::parse_command;
use super::job::{Job, PlanJob, PlanReason};
use super::payloads::{gitlab_time_ms, is_sha, Commit, MergeRequestHook, MrAttributes, NoteHook};
use crate::core::config::Allowlist;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, UserId};

/// The kind of a delivery, from its `X-Gitlab-Event` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    MergeRequest,
    Note,
    Push,
    Job,
    Pipeline,
    System,
    /// No `X-Gitlab-Event` header.
    Missing,
    /// Any other event.
    Other,
}

impl EventKind {
    pub fn from_header(event: Option<&str>) -> EventKind {
        match event.map(str::trim) {
            Some("Merge Request Hook") => EventKind::MergeRequest,
            Some("Note Hook") => EventKind::Note,
            Some("Push Hook") => EventKind::Push,
            Some("Job Hook") => EventKind::Job,
            Some("Pipeline Hook") => EventKind::Pipeline,
            Some("System Hook") => EventKind::System,
            None => EventKind::Missing,
            Some(_) => EventKind::Other,
        }
    }

    /// The short metrics label (`Merge Request Hook` → `merge_request`).
    pub fn label(self) -> &'static str {
        match self {
            EventKind::MergeRequest => "merge_request",
            EventKind::Note => "note",
            EventKind::Push => "push",
            EventKind::Job => "job",
            EventKind::Pipeline => "pipeline",
            EventKind::System => "system",
            EventKind::Missing => "none",
            EventKind::Other => "other",
        }
    }
}

/// The short metrics label of `X-Gitlab-Event` (`Merge Request Hook` → `merge_request`).
pub fn event_label(event: Option<&str>) -> &'static str {
    EventKind::from_header(event).label()
}

/// What became of a delivery, in one word (its [`Decision::outcome`] says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// Jobs were made.
    Enqueued,
    /// Understood, and nothing to do.
    Ignored,
    /// The body could not be understood.
    Unparseable,
}

impl OutcomeKind {
    /// The metrics label of a recorded delivery with this outcome.
    pub fn label(self) -> &'static str {
        match self {
            OutcomeKind::Enqueued => "accepted",
            OutcomeKind::Ignored => "ignored",
            OutcomeKind::Unparseable => "unparseable",
        }
    }
}

/// The outcome of one delivery, recorded with it and counted in metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub jobs: Vec<Job>,
    /// What became of the delivery, for callers that branch on it.
    pub kind: OutcomeKind,
    /// `enqueued`, or why nothing was done (`ignored: <reason>`), or `unparseable: <error>`.
    pub outcome: String,
    /// The project and MR, when the payload named them (stored with the delivery).
    pub project: Option<ProjectId>,
    pub mr: Option<MrIid>,
}

impl Decision {
    fn ignored(why: impl Into<String>) -> Decision {
        Decision {
            jobs: Vec::new(),
            kind: OutcomeKind::Ignored,
            outcome: format!("ignored: {}", why.into()),
            project: None,
            mr: None,
        }
    }

    fn unparseable(e: serde_json::Error) -> Decision {
        Decision {
            jobs: Vec::new(),
            kind: OutcomeKind::Unparseable,
            outcome: format!("unparseable: {e}"),
            project: None,
            mr: None,
        }
    }

    fn enqueued(jobs: Vec<Job>) -> Decision {
        Decision {
            jobs,
            kind: OutcomeKind::Enqueued,
            outcome: "enqueued".into(),
            project: None,
            mr: None,
        }
    }

    /// The same decision, about this MR.
    fn about(mut self, project: ProjectId, mr: MrIid) -> Decision {
        self.project = Some(project);
        self.mr = Some(mr);
        self
    }

    /// Whether the body could not be understood (logged at warn).
    pub fn is_unparseable(&self) -> bool {
        self.kind == OutcomeKind::Unparseable
    }
}

/// Decide what to do about one authentic delivery: `event` is `X-Gitlab-Event`, `body` the raw JSON.
pub fn decide(event: Option<&str>, body: &[u8], allow: &Allowlist) -> Decision {
    match EventKind::from_header(event) {
        EventKind::MergeRequest => match serde_json::from_slice::<MergeRequestHook>(body) {
            Ok(hook) => decide_mr(&hook, allow),
            Err(e) => Decision::unparseable(e),
        },
        EventKind::Note => match serde_json::from_slice::<NoteHook>(body) {
            Ok(hook) => decide_note(&hook, allow),
            Err(e) => Decision::unparseable(e),
        },
        EventKind::Missing => Decision::ignored("no X-Gitlab-Event header"),
        _ => {
            // Still must be JSON to count as a well-formed delivery.
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => Decision::ignored(format!(
                    "event `{}` is not used",
                    event.unwrap_or_default().trim()
                )),
                Err(e) => Decision::unparseable(e),
            }
        }
    }
}

/// The `action` of a merge request event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MrAction<'a> {
    Open,
    Reopen,
    Update,
    Merge,
    Close,
    Missing,
    Other(&'a str),
}

impl<'a> MrAction<'a> {
    fn of(attrs: &'a MrAttributes) -> MrAction<'a> {
        match attrs.action.as_deref().unwrap_or("") {
            "open" => MrAction::Open,
            "reopen" => MrAction::Reopen,
            "update" => MrAction::Update,
            "merge" => MrAction::Merge,
            "close" => MrAction::Close,
            "" => MrAction::Missing,
            other => MrAction::Other(other),
        }
    }
}

fn decide_mr(hook: &MergeRequestHook, allow: &Allowlist) -> Decision {
    let Some(attrs) = &hook.object_attributes else {
        return Decision::ignored("merge request event without object_attributes");
    };
    let project = hook.project.as_ref();
    let project_id = project.and_then(|p| p.id).or(attrs.target_project_id);
    let project_path = project.and_then(|p| p.path_with_namespace.clone());
    let Some(project_id) = project_id else {
        return Decision::ignored("merge request event without a project");
    };
    if !allow.allows(Some(project_id), project_path.as_deref()) {
        return Decision::ignored(format!(
            "project {} is not in gitlab.projects",
            project_path
                .clone()
                .unwrap_or_else(|| project_id.to_string())
        ));
    }
    let Some(iid) = attrs.iid else {
        return Decision::ignored("merge request event without an iid");
    };
    let (project, mr) = (ProjectId(project_id), MrIid(iid));
    classify_mr(hook, attrs, project, project_path, mr).about(project, mr)
}

fn classify_mr(
    hook: &MergeRequestHook,
    attrs: &MrAttributes,
    project: ProjectId,
    project_path: Option<String>,
    mr: MrIid,
) -> Decision {
    let reason = match MrAction::of(attrs) {
        MrAction::Open => PlanReason::Opened,
        MrAction::Reopen => PlanReason::Reopened,
        MrAction::Update => match update_reason(hook, attrs) {
            Some(reason) => reason,
            None => {
                return Decision::ignored(
                    "update without new commits, target branch or ready change",
                )
            }
        },
        MrAction::Merge => {
            return Decision::enqueued(vec![Job::MarkMerged {
                project,
                mr,
                merge_commit: attrs
                    .merge_commit_sha
                    .as_deref()
                    .filter(|s| is_sha(s))
                    .map(|s| CommitSha(s.to_ascii_lowercase())),
                target_branch: attrs.target_branch.clone(),
            }])
        }
        MrAction::Close => return Decision::enqueued(vec![Job::Closed { project, mr }]),
        MrAction::Missing => return Decision::ignored("merge request event without an action"),
        MrAction::Other(other) => {
            return Decision::ignored(format!("action `{other}` needs no plan"))
        }
    };
    let Some(head) = attrs.last_commit.as_ref().and_then(Commit::sha) else {
        return Decision::ignored("merge request event without last_commit.id");
    };
    if is_fork(attrs) {
        return Decision::enqueued(vec![Job::ForkNotice {
            project,
            mr,
            head: Some(head),
        }]);
    }
    Decision::enqueued(vec![Job::Plan(PlanJob {
        project,
        project_path,
        mr,
        head,
        target_branch: attrs.target_branch.clone(),
        source_project: attrs.source_project_id.map(ProjectId),
        fork: false,
        draft: attrs.draft.or(attrs.work_in_progress).unwrap_or(false),
        reason,
        // Whose work this is, for the queue's fair share: the MR's author, else who acted.
        requested_by: attrs
            .author_id
            .or(hook.user.as_ref().and_then(|u| u.id))
            .map(UserId),
    })])
}

/// Why an `update` needs a plan: new commits, a new target branch, or draft → ready.
fn update_reason(hook: &MergeRequestHook, attrs: &MrAttributes) -> Option<PlanReason> {
    let changes = hook.changes.clone().unwrap_or_default();
    let marked_ready = changes.draft.as_ref().is_some_and(|c| {
        c.current == serde_json::Value::Bool(false) && c.previous == serde_json::Value::Bool(true)
    });
    if attrs.oldrev.as_deref().is_some_and(|s| !s.is_empty()) {
        Some(PlanReason::NewCommits)
    } else if changes.target_branch.is_some() {
        Some(PlanReason::TargetBranchChanged)
    } else if marked_ready {
        Some(PlanReason::MarkedReady)
    } else {
        None
    }
}

fn is_fork(attrs: &MrAttributes) -> bool {
    matches!((attrs.source_project_id, attrs.target_project_id), (Some(s), Some(t)) if s != t)
}

fn decide_note(hook: &NoteHook, allow: &Allowlist) -> Decision {
    let Some(note) = &hook.object_attributes else {
        return Decision::ignored("note event without object_attributes");
    };
    if note.noteable_type.as_deref() != Some("MergeRequest") {
        return Decision::ignored("note is not on a merge request");
    }
    if note.system == Some(true) {
        return Decision::ignored("system note");
    }
    let project_id = hook.project.as_ref().and_then(|p| p.id).or(hook.project_id);
    let project_path = hook
        .project
        .as_ref()
        .and_then(|p| p.path_with_namespace.clone());
    let Some(project_id) = project_id else {
        return Decision::ignored("note event without a project");
    };
    if !allow.allows(Some(project_id), project_path.as_deref()) {
        return Decision::ignored(format!(
            "project {} is not in gitlab.projects",
            project_path.unwrap_or_else(|| project_id.to_string())
        ));
    }
    let Some(command) = note.note.as_deref().and_then(parse_command) else {
        return Decision::ignored("note is not a planbot command");
    };
    let Some(mr_attrs) = &hook.merge_request else {
        return Decision::ignored("command note without merge_request");
    };
    let Some(iid) = mr_attrs.iid else {
        return Decision::ignored("command note without merge_request.iid");
    };
    let Some(author) = note.author_id.or(hook.user.as_ref().and_then(|u| u.id)) else {
        return Decision::ignored("command note without an author");
    };
    let (project, mr) = (ProjectId(project_id), MrIid(iid));
    Decision::enqueued(vec![Job::Command {
        project,
        project_path,
        mr,
        note: note.id.map(NoteId),
        author: UserId(author),
        command,
        head: mr_attrs.last_commit.as_ref().and_then(Commit::sha),
        written_at: note.created_at.as_deref().and_then(gitlab_time_ms),
        fork: is_fork(mr_attrs),
        plan_args: note.note.as_deref().and_then(super::commands::plan_args),
    }])
    .about(project, mr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::ProjectRef;
    use crate::core::events::{Command, Supersede};

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gitlab/webhooks")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
    }

    fn allow_all_fixture_projects() -> Allowlist {
        Allowlist(vec![
            ProjectRef::Path("flightjs/flight-management".into()),
            ProjectRef::Path("gitlabhq/gitlab-test".into()),
            ProjectRef::Id(5),
        ])
    }

    const MR: Option<&str> = Some("Merge Request Hook");

    fn plan_job(d: &Decision) -> &PlanJob {
        match d.jobs.as_slice() {
            [Job::Plan(p)] => p,
            other => panic!("expected one plan job, got {other:?} ({})", d.outcome),
        }
    }

    #[test]
    fn opened_mr_is_planned_at_its_last_commit() {
        let d = decide(
            MR,
            &fixture("merge_request_open.json"),
            &allow_all_fixture_projects(),
        );
        let p = plan_job(&d);
        assert_eq!(p.project, ProjectId(2));
        assert_eq!(p.mr, MrIid(16));
        assert_eq!(p.head.as_str(), "e59094b8de0f2f91abbe4760a52d9137260252d8");
        assert_eq!(p.reason, PlanReason::Opened);
        assert_eq!(
            p.project_path.as_deref(),
            Some("flightjs/flight-management")
        );
        assert!(!p.fork && !p.draft);
        assert_eq!(d.outcome, "enqueued");
    }

    #[test]
    fn v18_open_with_a_draft_change_is_planned() {
        let d = decide(
            MR,
            &fixture("merge_request_open_v18.json"),
            &allow_all_fixture_projects(),
        );
        let p = plan_job(&d);
        assert_eq!(p.mr, MrIid(1));
        assert_eq!(p.head.as_str(), "da1560886d4f094c3e6c9ef40349f7d38b5d27d7");
        assert_eq!(p.target_branch.as_deref(), Some("master"));
        // `action` is `open`, so the reason is the open (the draft flag went to false as well).
        assert_eq!(p.reason, PlanReason::Opened);
    }

    #[test]
    fn draft_to_ready_update_is_planned_but_a_label_change_is_not() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open_v18.json")).unwrap();
        v["object_attributes"]["action"] = "update".into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert_eq!(plan_job(&d).reason, PlanReason::MarkedReady);

        v["changes"].as_object_mut().unwrap().remove("draft");
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert!(d.jobs.is_empty(), "{d:?}");
        assert!(
            d.outcome.starts_with("ignored: update without"),
            "{}",
            d.outcome
        );

        v["changes"]["target_branch"] =
            serde_json::json!({"previous": "master", "current": "release"});
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert_eq!(plan_job(&d).reason, PlanReason::TargetBranchChanged);
    }

    #[test]
    fn partial_update_with_oldrev_lacks_the_project_and_is_ignored_not_failed() {
        let d = decide(
            MR,
            &fixture("merge_request_update_oldrev.partial.json"),
            &allow_all_fixture_projects(),
        );
        assert!(d.jobs.is_empty());
        assert_eq!(d.outcome, "ignored: merge request event without a project");
        assert!(!d.is_unparseable());
    }

    #[test]
    fn update_with_oldrev_on_a_full_payload_plans_the_new_head() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open.json")).unwrap();
        let partial: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_update_oldrev.partial.json")).unwrap();
        v["object_attributes"]["action"] = partial["object_attributes"]["action"].clone();
        v["object_attributes"]["oldrev"] = partial["object_attributes"]["oldrev"].clone();
        v["object_attributes"]["last_commit"]["id"] =
            "1111111111111111111111111111111111111111".into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        let p = plan_job(&d);
        assert_eq!(p.reason, PlanReason::NewCommits);
        assert_eq!(p.head.as_str(), "1111111111111111111111111111111111111111");
    }

    #[test]
    fn partial_and_review_payloads_do_nothing() {
        for f in [
            "merge_request_unapproved_system.partial.json",
            "merge_request_reviewers_state.partial.json",
            "merge_request_review_rerequested.partial.json",
            "merge_request_review_submitted.partial.json",
        ] {
            let d = decide(MR, &fixture(f), &allow_all_fixture_projects());
            assert!(d.jobs.is_empty(), "{f}: {d:?}");
            assert!(d.outcome.starts_with("ignored"), "{f}: {}", d.outcome);
        }
    }

    #[test]
    fn approvals_and_other_actions_do_nothing_even_on_full_payloads() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open.json")).unwrap();
        for action in ["approved", "unapproved", "approval", "unapproval"] {
            v["object_attributes"]["action"] = action.into();
            let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
            assert!(d.jobs.is_empty(), "{action}");
            assert_eq!(
                d.outcome,
                format!("ignored: action `{action}` needs no plan")
            );
        }
    }

    #[test]
    fn merge_and_close_make_their_jobs() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open.json")).unwrap();
        v["object_attributes"]["action"] = "merge".into();
        v["object_attributes"]["merge_commit_sha"] =
            "2222222222222222222222222222222222222222".into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert!(
            matches!(
                &d.jobs[..],
                [Job::MarkMerged {
                    mr: MrIid(16),
                    merge_commit: Some(_),
                    ..
                }]
            ),
            "{d:?}"
        );
        v["object_attributes"]["action"] = "close".into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert_eq!(
            d.jobs,
            vec![Job::Closed {
                project: ProjectId(2),
                mr: MrIid(16)
            }]
        );
        assert_eq!(d.jobs[0].supersedes(), Supersede::All);
    }

    #[test]
    fn fork_mrs_get_a_notice_not_a_plan() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open.json")).unwrap();
        v["object_attributes"]["source_project_id"] = 99.into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert!(
            matches!(
                &d.jobs[..],
                [Job::ForkNotice {
                    mr: MrIid(16),
                    head: Some(_),
                    ..
                }]
            ),
            "{d:?}"
        );
    }

    #[test]
    fn drafts_are_planned_too() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("merge_request_open.json")).unwrap();
        v["object_attributes"]["draft"] = true.into();
        let d = decide(MR, v.to_string().as_bytes(), &allow_all_fixture_projects());
        assert!(plan_job(&d).draft);
    }

    #[test]
    fn projects_outside_the_allowlist_are_ignored() {
        let allow = Allowlist(vec![ProjectRef::Path("infra/homelab".into())]);
        let d = decide(MR, &fixture("merge_request_open.json"), &allow);
        assert!(d.jobs.is_empty());
        assert_eq!(
            d.outcome,
            "ignored: project flightjs/flight-management is not in gitlab.projects"
        );
        let by_id = Allowlist(vec![ProjectRef::Id(2)]);
        assert_eq!(
            decide(MR, &fixture("merge_request_open.json"), &by_id)
                .jobs
                .len(),
            1
        );
    }

    #[test]
    fn planbot_plan_note_makes_a_command_job() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fixture("note_merge_request.json")).unwrap();
        // As delivered, the note is an ordinary comment.
        let d = decide(
            Some("Note Hook"),
            v.to_string().as_bytes(),
            &allow_all_fixture_projects(),
        );
        assert_eq!(d.outcome, "ignored: note is not a planbot command");
        v["object_attributes"]["note"] = "planbot plan\n".into();
        let d = decide(
            Some("Note Hook"),
            v.to_string().as_bytes(),
            &allow_all_fixture_projects(),
        );
        match &d.jobs[..] {
            [Job::Command {
                project,
                mr,
                author,
                command,
                head,
                note,
                fork,
                written_at,
                ..
            }] => {
                // `2015-05-17 18:21:36 UTC`
                assert_eq!(*written_at, Some(1_431_886_896_000));
                assert_eq!(
                    (*project, *mr, *author),
                    (ProjectId(5), MrIid(1), UserId(1))
                );
                assert_eq!(*command, Command::Plan);
                assert_eq!(*note, Some(NoteId(1244)));
                // The doc's last_commit has a malformed timestamp; the SHA is still read.
                assert_eq!(
                    head.as_ref().unwrap().as_str(),
                    "562e173be03b8ff2efb05345d12df18815438a4b"
                );
                assert!(!fork);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_events_and_garbage() {
        let allow = allow_all_fixture_projects();
        let d = decide(Some("Push Hook"), &fixture("push.json"), &allow);
        assert_eq!(d.outcome, "ignored: event `Push Hook` is not used");
        for f in ["job.json", "pipeline.json"] {
            assert!(decide(Some("Job Hook"), &fixture(f), &allow)
                .jobs
                .is_empty());
        }
        let d = decide(MR, b"{not json", &allow);
        assert!(d.is_unparseable(), "{d:?}");
        let d = decide(MR, br#"{"object_attributes": "a string"}"#, &allow);
        assert!(d.is_unparseable(), "{d:?}");
        assert!(decide(Some("Push Hook"), b"\xff", &allow).is_unparseable());
    }

    #[test]
    fn jobs_round_trip_through_json() {
        let d = decide(
            MR,
            &fixture("merge_request_open.json"),
            &allow_all_fixture_projects(),
        );
        let s = serde_json::to_string(&d.jobs[0]).unwrap();
        assert!(s.contains(r#""kind":"plan""#), "{s}");
        assert_eq!(serde_json::from_str::<Job>(&s).unwrap(), d.jobs[0]);
    }
}
