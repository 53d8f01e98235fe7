//! Drift: whether the infrastructure still matches the default branch, one GitLab issue per
//! drifted root. It exists because `main` is the infrastructure's truth in GitLab Flow, and a
//! change made by hand (a VM resized in the Proxmox UI) otherwise surfaces only by accident,
//! inside an unrelated MR's plan, and is silently reverted by the next apply.
//!
//! [`issue::report`] keeps a root's issue in step with a check's [`DriftVerdict`]
//! (`core::drift`): opened on drift, edited in place while it lasts, closed with a note when the
//! root is clean, "could not check" written on the open issue without ever opening one.
//! [`check::tick`] is one check of every configured root (`planbot drift`): planned at the
//! default branch's head with the plan credentials, classified, reported, recorded.
//! [`schedule`] runs it inside `planbot serve` on `[drift] schedule`: one replica claims each
//! tick and queues it as a job.
//!
//! [`DriftVerdict`]: crate::core::drift::DriftVerdict

pub mod check;
pub mod issue;
pub mod schedule;
