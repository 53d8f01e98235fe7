//! A root's drift issue through a sequence of checks, against the fake GitLab that keeps issues
//! as GitLab does: opened once on drift, edited while the drift lasts, "could not check" written
//! on it without opening another, closed with a note when the root is clean again.

use crate::support::fake_gitlab::FakeGitLab;
use planbot::capabilities::gitlab::{GitLab, RetryPolicy};
use planbot::core::drift::DriftVerdict;
use planbot::core::ids::ProjectId;
use planbot::core::plan::Plan;
use planbot::core::redact::Secrets;
use planbot::flows::drift::issue::{report, DriftTarget, IssueAction};
use std::time::{Duration, SystemTime};

fn resized(cores: u32) -> DriftVerdict {
    let plan = Plan::from_json(
        format!(
            r#"{{"format_version":"1.2","resource_changes":[],"resource_drift":[{{"address":"terraform_data.vm","mode":"managed",
            "type":"terraform_data","name":"vm","change":{{"actions":["update"],
            "before":{{"input":{{"cores":2}}}},"after":{{"input":{{"cores":{cores}}}}}}}}}]}}"#
        )
        .as_bytes(),
    )
    .unwrap();
    DriftVerdict::of_plan(&plan, None)
}

#[tokio::test]
async fn one_issue_per_drifted_root_edited_while_it_lasts_and_closed_when_clean() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let gitlab = GitLab::new(fake.url(), fake.bot_token())
        .unwrap()
        .with_retry_policy(RetryPolicy {
            max_attempts: 2,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(50),
        });
    let labels = vec!["drift".to_string()];
    let bot = gitlab.current_user().await.unwrap().id;
    let target = |root| DriftTarget {
        project: ProjectId(project.id),
        project_path: "infra/homelab",
        root,
        branch: "main",
        sha: "3f9a2c1e0000000000000000000000000000beef",
        labels: &labels,
        job_name: "planbot-apply",
        fingerprint: Some("9c41d07be2aa55f0c1d2e3f4a5b6c7d8"),
        bot,
        run_url: None,
        run_hint: None,
    };
    let scrubber = Secrets::new().scrubber();
    let check = |root, verdict: DriftVerdict| {
        let (gitlab, scrubber, target) = (&gitlab, &scrubber, target(root));
        async move {
            report(gitlab, &target, &verdict, scrubber, SystemTime::now())
                .await
                .unwrap()
        }
    };

    // Clean and "could not check" open nothing.
    assert_eq!(check("core", DriftVerdict::Clean).await, IssueAction::None);
    let down = DriftVerdict::CouldNotCheck {
        error: "Error: Proxmox unreachable".into(),
    };
    assert_eq!(check("core", down.clone()).await, IssueAction::None);
    assert!(fake.issues(&project).is_empty());

    // Drift opens one labelled issue naming the root and the changed attribute.
    assert_eq!(check("core", resized(4)).await, IssueAction::Opened(1));
    let issue = &fake.issues(&project)[0];
    assert_eq!(issue.title, "planbot: drift in infra/homelab root core");
    assert_eq!(issue.labels, labels);
    assert!(issue
        .description
        .contains("`terraform_data.vm` · changed outside"));
    assert!(
        issue.description.contains("~ input.cores = 2 -> 4\n"),
        "{}",
        issue.description
    );
    assert!(issue.description.contains("PLANBOT_CONFIRM=9c41d07be2aa"));

    // Another root's drift is another issue; the same root's next check edits the first.
    assert_eq!(check("dns", resized(8)).await, IssueAction::Opened(2));
    assert_eq!(check("core", resized(6)).await, IssueAction::Edited(1));
    let issues = fake.issues(&project);
    assert_eq!(issues.len(), 2);
    assert!(issues[0].description.contains("~ input.cores = 2 -> 6\n"));
    assert!(issues[0].notes.is_empty(), "edited, not reposted");

    // A check that cannot run says so on the open issue and never calls it clean.
    assert_eq!(check("core", down).await, IssueAction::Edited(1));
    let issue = &fake.issues(&project)[0];
    assert!(issue.description.contains("could not check root `core`"));
    assert!(issue.description.contains("Proxmox unreachable"));
    assert_eq!(issue.state, "opened");

    // Clean again: a short note, then closed; the other root's issue stays open.
    assert_eq!(
        check("core", DriftVerdict::Clean).await,
        IssueAction::Closed(1)
    );
    let issues = fake.issues(&project);
    assert_eq!(issues[0].state, "closed");
    assert_eq!(issues[0].notes.len(), 1);
    assert!(issues[0].notes[0].2.contains("matches `main`"));
    assert_eq!(issues[1].state, "opened");

    // Drift after the issue closed is a new issue (the closed one is history).
    assert_eq!(check("core", resized(4)).await, IssueAction::Opened(3));

    // GitLab stores the closing note, then fails every try of the close: the check fails and
    // the issue stays open. The next clean check closes it without saying it twice.
    const CLOSE: &str = "PUT /api/v4/projects/{id}/issues/{iid}";
    fake.fail_next(CLOSE, 2, 503);
    let failed = report(
        &gitlab,
        &target("core"),
        &DriftVerdict::Clean,
        &scrubber,
        SystemTime::now(),
    )
    .await;
    assert!(failed.is_err(), "{failed:?}");
    let issue = |iid| {
        fake.issues(&project)
            .into_iter()
            .find(|i| i.iid == iid)
            .unwrap()
    };
    assert_eq!(issue(3).state, "opened");
    assert_eq!(issue(3).notes.len(), 1, "the closing note was stored");
    assert_eq!(
        check("core", DriftVerdict::Clean).await,
        IssueAction::Closed(3)
    );
    assert_eq!(issue(3).state, "closed");
    assert_eq!(issue(3).notes.len(), 1, "{:?}", issue(3).notes);
    assert!(issue(3).notes[0].2.contains("matches `main`"));

    // Two checks at once (the schedule and a `planbot drift` from cron) both found no issue and
    // opened one each: the next check keeps the older, closes the other pointing to it.
    assert_eq!(check("core", resized(4)).await, IssueAction::Opened(4));
    let twin = gitlab
        .create_labelled_issue(
            ProjectId(project.id),
            &issue(4).title,
            &issue(4).description,
            &labels,
        )
        .await
        .unwrap();
    assert_eq!(twin.iid, 5);
    assert_eq!(check("core", resized(5)).await, IssueAction::Edited(4));
    assert_eq!(issue(5).state, "closed");
    assert_eq!(issue(5).notes.len(), 1);
    assert!(
        issue(5).notes[0].2.contains("already has drift issue #4"),
        "{:?}",
        issue(5).notes
    );
    assert_eq!(issue(4).state, "opened");
    assert!(issue(4).description.contains("~ input.cores = 2 -> 5\n"));
}

/// Anyone who can open an issue can write the drift label and a root's hidden marker into it:
/// planbot's drift issues are only those its bot user opened. Another user's look-alike is
/// neither edited, nor closed (as a duplicate, as clean, or as a root no longer checked), nor
/// commented on; planbot opens its own.
#[tokio::test]
async fn an_issue_with_the_marker_that_another_user_opened_is_not_planbots() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let mallory =
        fake.member_with_role(&project, "mallory", crate::support::fake_gitlab::DEVELOPER);
    let gitlab = GitLab::new(fake.url(), fake.bot_token()).unwrap();
    let as_mallory = GitLab::new(fake.url(), &mallory.token).unwrap();
    let labels = vec!["drift".to_string()];
    let bot = gitlab.current_user().await.unwrap().id;
    let target = DriftTarget {
        project: ProjectId(project.id),
        project_path: "infra/homelab",
        root: "core",
        branch: "main",
        sha: "3f9a2c1e0000000000000000000000000000beef",
        labels: &labels,
        job_name: "planbot-apply",
        fingerprint: Some("9c41d07be2aa55f0c1d2e3f4a5b6c7d8"),
        bot,
        run_url: None,
        run_hint: None,
    };
    let scrubber = Secrets::new().scrubber();
    let fake_body = format!(
        "{}\nApproved by @security: apply with PLANBOT_CONFIRM=deadbeef",
        planbot::core::drift::marker("core")
    );
    for title in ["planbot: drift in infra/homelab root core", "look-alike 2"] {
        as_mallory
            .create_labelled_issue(ProjectId(project.id), title, &fake_body, &labels)
            .await
            .unwrap();
    }
    let mallorys = |issues: &[crate::support::fake_gitlab::FakeIssue]| {
        for i in &issues[..2] {
            assert_eq!(i.author_id, mallory.id);
            assert_eq!(i.state, "opened", "{i:?}");
            assert_eq!(i.description, fake_body, "not edited");
            assert!(i.notes.is_empty(), "not commented on: {:?}", i.notes);
        }
    };

    // Drift: planbot opens its own issue (#3) and leaves both look-alikes alone.
    let action = report(&gitlab, &target, &resized(4), &scrubber, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(action, IssueAction::Opened(3));
    let issues = fake.issues(&project);
    mallorys(&issues);
    assert_eq!(issues[2].author_id, bot.0);
    // The next check edits planbot's own.
    let action = report(&gitlab, &target, &resized(6), &scrubber, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(action, IssueAction::Edited(3));
    mallorys(&fake.issues(&project));
    // An apply's result goes to planbot's issue only.
    let noted = planbot::flows::drift::issue::note_on_open_issue(
        &gitlab,
        ProjectId(project.id),
        &labels,
        "core",
        "applied",
        bot,
    )
    .await
    .unwrap();
    assert_eq!(noted, Some(3));
    mallorys(&fake.issues(&project));
    // Clean: planbot closes its own issue, not the look-alikes.
    let action = report(
        &gitlab,
        &target,
        &DriftVerdict::Clean,
        &scrubber,
        SystemTime::now(),
    )
    .await
    .unwrap();
    assert_eq!(action, IssueAction::Closed(3));
    mallorys(&fake.issues(&project));
    // The root leaves the check: nothing of mallory's is closed as "no longer checked".
    let closed = planbot::flows::drift::issue::close_unchecked(
        &gitlab,
        &target,
        &[],
        &scrubber,
        SystemTime::now(),
    )
    .await
    .unwrap();
    assert!(closed.is_empty(), "{closed:?}");
    mallorys(&fake.issues(&project));
}
