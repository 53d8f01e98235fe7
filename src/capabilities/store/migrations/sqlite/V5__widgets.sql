-- Migration 5: what GitLab's MR widgets show of a reviewed plan (issue 37): per (root, head)
-- with a fingerprint shown, its counts and its findings as Code Quality issues (JSON of
-- core::widgets::RootWidgets, every text already scrubbed), served to the MR pipeline's job.
CREATE TABLE widget_reports (
    project_id INTEGER NOT NULL,
    mr_iid     INTEGER NOT NULL,
    root       TEXT NOT NULL,
    sha        TEXT NOT NULL,
    report     TEXT NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
