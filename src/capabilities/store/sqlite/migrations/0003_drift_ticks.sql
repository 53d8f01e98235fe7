-- Migration 3: the drift schedule. One row per occurrence of `[drift] schedule` that a replica
-- claimed (unix milliseconds): the primary key lets exactly one replica claim each tick, and the
-- newest row is the last tick, from which a replica starting up finds a tick it missed.
CREATE TABLE drift_ticks (
    tick_at    INTEGER PRIMARY KEY,
    job_id     INTEGER,                   -- the drift_tick job the claim queued
    claimed_at INTEGER NOT NULL
);
