-- Migration 1 (PostgreSQL): the SQLite schema's tables and columns, plus what N replicas need:
-- job leases (owner, lease_expires_at), the owner of each run and apply, the live replicas,
-- and per-project apply locks.
CREATE TABLE deliveries (
    id          BIGSERIAL PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    event       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    project_id  BIGINT,
    mr_iid      BIGINT,
    received_at BIGINT NOT NULL
);
CREATE TABLE jobs (
    id               BIGSERIAL PRIMARY KEY,
    kind             TEXT NOT NULL,
    project_id       BIGINT,
    mr_iid           BIGINT,
    sha              TEXT,
    payload          TEXT NOT NULL,
    state            TEXT NOT NULL,     -- queued | running | done | failed | canceled
    attempts         BIGINT NOT NULL DEFAULT 0,
    detail           TEXT,
    delivery_id      BIGINT,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    owner            TEXT,              -- the replica running it
    lease_expires_at BIGINT             -- after this, another replica may take it
);
CREATE INDEX jobs_by_state ON jobs(state, id);
CREATE INDEX jobs_by_mr ON jobs(project_id, mr_iid, state);
CREATE TABLE runs (
    id            BIGSERIAL PRIMARY KEY,
    job_id        BIGINT,
    kind          TEXT NOT NULL,
    project_id    BIGINT NOT NULL,
    project_path  TEXT,
    mr_iid        BIGINT,
    root          TEXT NOT NULL,
    sha           TEXT NOT NULL,
    state         TEXT NOT NULL,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT,
    summary       TEXT,
    log           TEXT NOT NULL DEFAULT '',
    note_markdown TEXT,
    fingerprint   TEXT,
    owner         TEXT
);
CREATE INDEX runs_by_mr ON runs(project_id, mr_iid, sha);
CREATE INDEX runs_by_state ON runs(state);
CREATE TABLE fingerprints (
    seq         BIGSERIAL,              -- insertion order, what SQLite's rowid gave
    project_id  BIGINT NOT NULL,
    mr_iid      BIGINT NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id      BIGINT,
    shown_at    BIGINT NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE plan_digests (
    project_id  BIGINT NOT NULL,
    mr_iid      BIGINT NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    digest      TEXT NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE mr_notes (
    project_id  BIGINT NOT NULL,
    mr_iid      BIGINT NOT NULL,
    note_id     BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (project_id, mr_iid)
);
CREATE TABLE applies (
    id          BIGSERIAL PRIMARY KEY,
    ci_job_id   BIGINT NOT NULL UNIQUE, -- one CI job applies once, across every replica
    project_id  BIGINT NOT NULL,
    mr_iid      BIGINT,
    sha         TEXT NOT NULL,
    roots       TEXT NOT NULL,
    state       TEXT NOT NULL,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    detail      TEXT,
    owner       TEXT
);
CREATE TABLE replicas (
    owner       TEXT PRIMARY KEY,
    started_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL         -- refreshed while the replica lives
);
CREATE TABLE project_locks (
    project_id  BIGINT PRIMARY KEY,     -- one apply per project at a time
    owner       TEXT NOT NULL,          -- the replica holding it: free once that one is gone
    token       TEXT NOT NULL,          -- which acquisition
    acquired_at BIGINT NOT NULL
);
