-- Migration 6: the last plan of each root of an open MR, kept so that a later push reuses it
-- on any replica (issue 45): its `show -json` with every secret replaced (core::kept_plan), its
-- secrets as keyed digests (core::redact::SecretDigests), the inputs it was planned from and
-- what the note shows of it (JSON, every text scrubbed). Forgotten when the MR closes or merges,
-- and after 30 days.
CREATE TABLE kept_plans (
    project_id     INTEGER NOT NULL,
    mr_iid         INTEGER NOT NULL,
    root           TEXT NOT NULL,
    head           TEXT NOT NULL,
    planned_commit TEXT NOT NULL,
    inputs         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    document       TEXT NOT NULL,
    digests        TEXT NOT NULL,
    kept_at        INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root)
);
