//! The note's ```diff bodies: computed on a second thread beside the note, handed over in order.
//!
//! With a budget, [`fill_bodies`] computes them two at a time before the note is rendered (the
//! budget needs their sizes); without one nothing is folded, and [`write_beside_bodies`]
//! renders the note while a second thread computes them, each section waiting for its own.

use super::diff::{Differ, Node, Phrases};
use super::{resource_at, resource_sizes, write_view, NoteView, ResourceView, UnitId, UnitState};
use crate::core::markdown;
use crate::core::plan::{ActionKind, Plan, ResourceChange};
use std::sync::{Arc, Condvar, Mutex};

/// A section's ```diff body as the note shows it: neutralised, its fence, how many attributes
/// it leaves out as unchanged.
#[derive(Debug, Clone)]
pub(super) struct SectionBody {
    text: String,
    fence: String,
    unchanged: usize,
}

impl SectionBody {
    fn fill(self, r: &mut ResourceView) {
        r.body = self.text;
        r.fence = self.fence;
        r.unchanged = self.unchanged;
    }
}

/// The ```diff body of one resource of `kind` (`None` when it has nothing to diff): only
/// changed attributes, through the masks; the write-only attributes it sets (found in `plan`,
/// given for a planned change, not for drift) say so.
fn section_body(
    kind: ActionKind,
    replace_paths: &[String],
    plan: Option<&Plan>,
    rc: &ResourceChange,
    phrases: &Phrases,
) -> Option<SectionBody> {
    if matches!(
        kind,
        // A pure move/import/forget has nothing to diff.
        ActionKind::NoOp | ActionKind::Forget | ActionKind::Read
    ) {
        return None;
    }
    // This resource's values only, dropped when its diff is written.
    let c = rc.change.values();
    let c = c.get();
    let write_only = plan
        .map(|p| p.write_only_attributes_of(rc, &c.after, &c.after_unknown))
        .unwrap_or_default();
    let body = Differ::new(phrases)
        .with_replace_paths(replace_paths)
        .with_write_only(&write_only)
        .diff("", Node::of_change(c, false));
    let text = markdown::neutralise(&body.text).into_owned();
    let fence = markdown::fence_for(&text);
    Some(SectionBody {
        text,
        fence,
        unchanged: body.unchanged,
    })
}

/// The sections whose bodies are to be computed, in the order the note shows them, with what
/// each body needs from its section (read before the sections are lent or written to).
struct Bodies<'p, 'r> {
    pending: &'p [(UnitId, Option<&'r Plan>, &'r ResourceChange)],
    inputs: Vec<(ActionKind, Vec<String>)>,
    phrases: &'p Phrases,
}

impl<'p, 'r> Bodies<'p, 'r> {
    fn new(
        view: &mut NoteView<'_>,
        pending: &'p [(UnitId, Option<&'r Plan>, &'r ResourceChange)],
        phrases: &'p Phrases,
    ) -> Self {
        let inputs = pending
            .iter()
            .map(|&(id, _, _)| {
                let r = resource_at(view, id);
                (r.kind, r.replace_paths.clone())
            })
            .collect();
        Bodies {
            pending,
            inputs,
            phrases,
        }
    }

    /// The body of the `n`th pending section.
    fn body(&self, n: usize) -> Option<SectionBody> {
        let (_, plan, rc) = self.pending[n];
        let (kind, paths) = &self.inputs[n];
        section_body(*kind, paths, plan, rc, self.phrases)
    }
}

/// How many diff bodies the helper thread of [`fill_bodies`] may compute ahead of the ones
/// taken: a bound on what waits in memory beside the bodies kept.
const BODIES_AHEAD: usize = 32;

/// Compute the diff bodies of the `pending` sections, holding no more of them than `room`
/// characters beyond their summary lines: whenever the bodies kept exceed it, the largest is
/// folded and its text freed. This keeps what the budget's fold-largest-first would keep (a
/// section folded here is larger than the ones kept and would not fit beside them either), and
/// memory stays near the note's size however many resources the plan has.
///
/// The bodies are computed two at a time: a helper thread computes every other one and hands
/// them over in order through a queue of [`BODIES_AHEAD`], so the bodies kept, and the note,
/// are the same as when one thread computes them all.
pub(super) fn fill_bodies(
    view: &mut NoteView<'_>,
    pending: &[(UnitId, Option<&Plan>, &ResourceChange)],
    phrases: &Phrases,
    room: usize,
) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let bodies = Bodies::new(view, pending, phrases);
    let bodies = &bodies;
    std::thread::scope(|s| {
        let (handed, taken) = std::sync::mpsc::sync_channel(BODIES_AHEAD);
        let helper = s.spawn(move || {
            for n in (1..pending.len()).step_by(2) {
                if handed.send(bodies.body(n)).is_err() {
                    break;
                }
            }
        });
        // (full size, earliest first among equals: the order the budget folds in; extra size,
        // which).
        let mut kept: BinaryHeap<(usize, Reverse<usize>, usize, UnitId)> = BinaryHeap::new();
        let mut held = 0;
        for (n, &(id, _, _)) in pending.iter().enumerate() {
            let body = if n % 2 == 0 {
                bodies.body(n)
            } else {
                match taken.recv() {
                    Ok(body) => body,
                    // The helper ended early: it panicked, and joining it says so below.
                    Err(_) => break,
                }
            };
            let r = resource_at(view, id);
            if let Some(body) = body {
                body.fill(r);
            }
            let (full, folded) = resource_sizes(r);
            let extra = full.saturating_sub(folded);
            kept.push((full, Reverse(n), extra, id));
            held += extra;
            while held > room {
                let Some((_, _, extra, largest)) = kept.pop() else {
                    break;
                };
                held -= extra;
                let r = resource_at(view, largest);
                r.state = UnitState::Folded;
                r.body = String::new();
                r.fence = String::new();
            }
        }
        drop(taken);
        if let Err(panic) = helper.join() {
            std::panic::resume_unwind(panic);
        }
    });
}

/// Render the note (nothing folded: no budget) while a second thread computes the `pending`
/// sections' bodies in the order the note shows them; the template, reaching a section, waits
/// for its body. The note is the one [`fill_bodies`] and [`render_view`] make without a budget,
/// written to `out` as it goes.
pub(super) fn write_beside_bodies(
    view: &mut NoteView<'_>,
    pending: &[(UnitId, Option<&Plan>, &ResourceChange)],
    phrases: &Phrases,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let bodies = Bodies::new(view, pending, phrases);
    let queue = Arc::new(BodyQueue::default());
    let waiting = Waiting {
        queue: Arc::clone(&queue),
        at: pending_positions(view, pending),
    };
    std::thread::scope(|s| {
        let bodies = &bodies;
        let queue = &*queue;
        let helper = s.spawn(move || {
            // Marks the queue ended however the loop ends (a panic included), so that no
            // section waits for a body that will not come.
            let _ended = EndOnDrop(queue);
            for n in 0..bodies.pending.len() {
                if queue.has_ended() {
                    break;
                }
                queue.push(bodies.body(n));
            }
        });
        let written = write_view(view, Some(&waiting), out);
        // A failed write ends the note: the helper is told so, and stops at its next body.
        if written.is_err() {
            queue.end();
        }
        if let Err(panic) = helper.join() {
            std::panic::resume_unwind(panic);
        }
        written
    })
}

/// Each lent section's place among the pending bodies: `[detail] -> (resources, drift)`.
fn pending_positions(
    view: &NoteView<'_>,
    pending: &[(UnitId, Option<&Plan>, &ResourceChange)],
) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut at: Vec<(Vec<usize>, Vec<usize>)> = view
        .details
        .iter()
        .map(|d| {
            (
                vec![usize::MAX; d.resources.len()],
                vec![usize::MAX; d.drift.len()],
            )
        })
        .collect();
    for (n, &((d, part, i), _, _)) in pending.iter().enumerate() {
        match part {
            0 => at[d].0[i] = n,
            _ => at[d].1[i] = n,
        }
    }
    at
}

/// The bodies computed so far, in pending order, and whether their thread has ended.
#[derive(Debug, Default)]
pub(super) struct BodyQueue {
    state: Mutex<(Vec<Option<SectionBody>>, bool)>,
    grown: Condvar,
}

impl BodyQueue {
    fn push(&self, body: Option<SectionBody>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0.push(body);
        drop(state);
        self.grown.notify_all();
    }

    fn end(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1 = true;
        drop(state);
        self.grown.notify_all();
    }

    fn has_ended(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// The `n`th body, once computed; `None` when it has none, or its thread ended without it
    /// (it panicked: joining it says so).
    fn wait_for(&self, n: usize) -> Option<SectionBody> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.0.len() <= n && !state.1 {
            state = self.grown.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.0.get(n).cloned().flatten()
    }
}

struct EndOnDrop<'q>(&'q BodyQueue);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The bodies a render waits for, and where each lent section's body is among them.
pub(super) struct Waiting {
    queue: Arc<BodyQueue>,
    at: Vec<(Vec<usize>, Vec<usize>)>,
}

/// A list of resource sections as a template sequence (see [`render_view`]): each item becomes
/// a template value when the template reaches it, with its body taken from the queue when the
/// bodies are computed beside the render.
#[derive(Debug)]
pub(super) struct Sections {
    list: Arc<Vec<ResourceView>>,
    bodies: Option<(Arc<BodyQueue>, Vec<usize>)>,
}

impl Sections {
    /// Detail `d`'s resources (`drift` false) or drift sections.
    pub(super) fn new(
        list: Arc<Vec<ResourceView>>,
        waiting: Option<&Waiting>,
        d: usize,
        drift: bool,
    ) -> Sections {
        let bodies = waiting.map(|w| {
            let (resources, drifted) = &w.at[d];
            let at = if drift { drifted } else { resources };
            (Arc::clone(&w.queue), at.clone())
        });
        Sections { list, bodies }
    }
}

impl minijinja::value::Object for Sections {
    fn repr(self: &Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let i = key.as_usize()?;
        let section = self.list.get(i)?;
        let body = match &self.bodies {
            Some((queue, at)) if at[i] != usize::MAX => queue.wait_for(at[i]),
            _ => None,
        };
        Some(match body {
            Some(body) => {
                let mut section = section.clone();
                body.fill(&mut section);
                minijinja::Value::from_serialize(&section)
            }
            None => minijinja::Value::from_serialize(section),
        })
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Seq(self.list.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Option<SectionBody> {
        Some(SectionBody {
            text: text.to_string(),
            fence: "```".to_string(),
            unchanged: 0,
        })
    }

    #[test]
    fn a_section_waits_for_its_own_body_and_a_queue_that_ended_without_it_gives_none() {
        let queue = Arc::new(BodyQueue::default());
        let waiter = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.wait_for(2).map(|b| b.text))
        };
        queue.push(body("first"));
        queue.push(None);
        queue.push(body("third"));
        assert_eq!(waiter.join().unwrap().as_deref(), Some("third"));
        assert!(queue.wait_for(1).is_none(), "a section without a body");
        // Its thread ended (a panic) before the fifth body: the section is not kept waiting.
        let waiter = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || queue.wait_for(4).map(|b| b.text))
        };
        queue.push(body("fourth"));
        drop(EndOnDrop(&queue));
        assert_eq!(waiter.join().unwrap(), None);
        assert_eq!(queue.wait_for(3).map(|b| b.text).as_deref(), Some("fourth"));
    }
}
