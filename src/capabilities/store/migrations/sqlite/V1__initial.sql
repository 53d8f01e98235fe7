-- Migration 1: the schema planbot had before versioned migrations, verbatim (IF NOT EXISTS
-- included), so a database made by that code (user_version 0) passes through it unchanged.
CREATE TABLE IF NOT EXISTS deliveries (
    id          INTEGER PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    event       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    project_id  INTEGER,
    mr_iid      INTEGER,
    received_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id          INTEGER PRIMARY KEY,
    kind        TEXT NOT NULL,
    project_id  INTEGER,
    mr_iid      INTEGER,
    sha         TEXT,
    payload     TEXT NOT NULL,
    state       TEXT NOT NULL,          -- queued | running | done | failed | canceled
    attempts    INTEGER NOT NULL DEFAULT 0,
    detail      TEXT,                   -- why it failed or was canceled
    delivery_id INTEGER,
    created_at  INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, id);
CREATE INDEX IF NOT EXISTS jobs_by_mr ON jobs(project_id, mr_iid, state);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER,
    kind          TEXT NOT NULL,        -- plan | apply
    project_id    INTEGER NOT NULL,
    project_path  TEXT,
    mr_iid        INTEGER,
    root          TEXT NOT NULL,
    sha           TEXT NOT NULL,
    state         TEXT NOT NULL,        -- running | succeeded | failed | canceled | refused | interrupted
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    summary       TEXT,
    log           TEXT NOT NULL DEFAULT '',
    note_markdown TEXT,
    fingerprint   TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_mr ON runs(project_id, mr_iid, sha);
CREATE TABLE IF NOT EXISTS fingerprints (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id      INTEGER,
    shown_at    INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE IF NOT EXISTS plan_digests (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    digest      TEXT NOT NULL,          -- core::plan_digest::PlanDigest as JSON: secret-free
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE IF NOT EXISTS mr_notes (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    note_id     INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid)
);
CREATE TABLE IF NOT EXISTS applies (
    id          INTEGER PRIMARY KEY,
    ci_job_id   INTEGER NOT NULL UNIQUE, -- one CI job applies once
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER,
    sha         TEXT NOT NULL,
    roots       TEXT NOT NULL,           -- JSON list
    state       TEXT NOT NULL,           -- running | succeeded | failed | refused | interrupted
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    detail      TEXT
);
