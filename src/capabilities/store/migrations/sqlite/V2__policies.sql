-- Migration 2: policy checks. The verdict recorded for each root's plan shown on an MR (with
-- that plan's fingerprint), and the owners' approvals of a failing set for one plan.
CREATE TABLE policy_verdicts (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    verdict     TEXT NOT NULL,          -- core::policy::review::RecordedVerdict as JSON, scrubbed
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE policy_approvals (
    id          INTEGER PRIMARY KEY,
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    policy_set  TEXT NOT NULL,
    approver_id INTEGER NOT NULL,
    approver    TEXT NOT NULL,
    approved_at INTEGER NOT NULL,
    UNIQUE (project_id, mr_iid, root, sha, fingerprint, policy_set, approver_id)
);
CREATE INDEX policy_approvals_by_mr ON policy_approvals(project_id, mr_iid);
