-- Migration 7: what a root unit of an MR's plan job (issue 45: one MR's roots planned over every
-- replica) hands back to the job that assembles the note: sealed (AES-256-GCM under a key
-- derived from `fingerprint_key`, which is never stored), its plan redacted with the secrets
-- the unit knew. Deleted once the job read it, when the job ends, and after a day.
CREATE TABLE unit_results (
    job_id     BIGINT PRIMARY KEY,
    parent_id  BIGINT NOT NULL,
    sealed     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX unit_results_parent ON unit_results (parent_id);
