//! The dependencies between a repository's roots (`depends_on` in `.planbot.toml`): checked
//! (unknown names, a root on itself, cycles) and read (the order to plan and apply in, which
//! roots can run together, what is above and below a root). Pure, no I/O.
//!
//! The public API, kept small (other flows build on it):
//!
//! - [`RootGraph::new`]`(&[(name, depends_on)])`: the graph, or every [`GraphProblem`] (by the
//!   root's and the entry's index, so a caller can point at the line). `RepoConfig::graph()`
//!   builds it from a valid configuration, which always has a valid graph.
//! - [`RootGraph::order`]: every root, upstream before downstream; among roots with no path
//!   between them, the configuration's order (stable).
//! - [`RootGraph::layers`]: the roots in layers: a root's layer is one below its deepest upstream,
//!   so the roots of one layer have no path between them and can plan together once the layers
//!   above are done. Each layer in configuration order.
//! - [`RootGraph::upstream_of`] / [`RootGraph::downstream_of`]: the roots above (what it depends
//!   on, directly or through others) and below a root, transitively, in configuration order.
//! - [`RootGraph::depends_on`]: a root's own `depends_on` (direct), in configuration order.
//!
//! Names not in the graph give empty answers. The graph is small (a repository has tens of roots):
//! every answer is computed on demand, in time linear in the edges.

use std::collections::BTreeSet;

/// Roots and their `depends_on`, known to be acyclic and to name only roots of the graph.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RootGraph {
    /// The roots' names in configuration order.
    names: Vec<String>,
    /// For each root, the indices of the roots it depends on directly (sorted, no duplicates).
    upstream: Vec<Vec<usize>>,
}

/// Why a set of `depends_on` lists is not a graph. `root` is the index of the root whose list is
/// wrong and `entry` the index in that list, for the caller to find the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphProblem {
    /// The entry names no root; `suggestion` is the nearest root name, when one is near.
    Unknown {
        root: usize,
        entry: usize,
        name: String,
        suggestion: Option<String>,
    },
    /// The root names itself.
    OnItself { root: usize, entry: usize },
    /// The entry names a root already listed before it in the same list.
    Twice { root: usize, entry: usize },
    /// The roots depend on each other in a circle: `cycle` starts and ends with the same root
    /// (`["network", "vms", "network"]`), the one first in the configuration; the entry is that
    /// root's, naming the second. Each circle is reported once.
    Cycle {
        root: usize,
        entry: usize,
        cycle: Vec<String>,
    },
}

impl GraphProblem {
    /// The root's index and the entry's index in its list.
    pub fn at(&self) -> (usize, usize) {
        match self {
            GraphProblem::Unknown { root, entry, .. }
            | GraphProblem::OnItself { root, entry }
            | GraphProblem::Twice { root, entry }
            | GraphProblem::Cycle { root, entry, .. } => (*root, *entry),
        }
    }
}

/// How many unknown `depends_on` names [`RootGraph::new`] looks for a near name for.
pub const MAX_SUGGESTIONS: usize = 20;

impl RootGraph {
    /// The graph of `roots` (name, its `depends_on`), in configuration order; or every problem,
    /// ordered by root and entry. A name given twice counts as its first root.
    pub fn new<N: AsRef<str>, D: AsRef<str>>(
        roots: &[(N, &[D])],
    ) -> Result<RootGraph, Vec<GraphProblem>> {
        let names: Vec<String> = roots.iter().map(|(n, _)| n.as_ref().to_string()).collect();
        // The first root of each name.
        let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, n) in names.iter().enumerate() {
            first.entry(n.as_str()).or_insert(i);
        }
        let index = |name: &str| first.get(name).copied();
        let mut problems = Vec::new();
        // Unknown names get a suggestion up to this many (each is compared with every name).
        let mut suggestions_left = MAX_SUGGESTIONS;
        // Edges kept with the entry that wrote them, for the cycle's line.
        let mut edges: Vec<Vec<(usize, usize)>> = vec![Vec::new(); names.len()];
        for (i, (name, deps)) in roots.iter().enumerate() {
            for (e, dep) in deps.iter().enumerate() {
                let dep = dep.as_ref();
                match index(dep) {
                    None => problems.push(GraphProblem::Unknown {
                        root: i,
                        entry: e,
                        name: dep.to_string(),
                        suggestion: (suggestions_left > 0)
                            .then(|| {
                                suggestions_left -= 1;
                                crate::core::suggest::nearest(
                                    dep,
                                    names
                                        .iter()
                                        .map(String::as_str)
                                        .filter(|n| *n != name.as_ref()),
                                )
                            })
                            .flatten()
                            .map(str::to_string),
                    }),
                    Some(_) if dep == name.as_ref() => {
                        problems.push(GraphProblem::OnItself { root: i, entry: e })
                    }
                    Some(j) if edges[i].iter().any(|(to, _)| *to == j) => {
                        problems.push(GraphProblem::Twice { root: i, entry: e })
                    }
                    Some(j) => edges[i].push((j, e)),
                }
            }
        }
        problems.extend(cycles(&names, &edges));
        if !problems.is_empty() {
            problems.sort_by_key(GraphProblem::at);
            return Err(problems);
        }
        let upstream = edges
            .into_iter()
            .map(|list| {
                let set: BTreeSet<usize> = list.into_iter().map(|(to, _)| to).collect();
                set.into_iter().collect()
            })
            .collect();
        Ok(RootGraph { names, upstream })
    }

    /// Roots with no dependencies, in this order.
    pub fn independent<N: AsRef<str>>(names: &[N]) -> RootGraph {
        RootGraph {
            names: names.iter().map(|n| n.as_ref().to_string()).collect(),
            upstream: vec![Vec::new(); names.len()],
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Every root, each after all it depends on; roots with no path between them keep the
    /// configuration's order (the smallest ready index goes first).
    pub fn order(&self) -> Vec<&str> {
        let n = self.names.len();
        let mut waiting: Vec<usize> = self.upstream.iter().map(Vec::len).collect();
        let mut ready: BTreeSet<usize> = (0..n).filter(|i| waiting[*i] == 0).collect();
        let mut out = Vec::with_capacity(n);
        while let Some(i) = ready.pop_first() {
            out.push(self.names[i].as_str());
            for (j, ups) in self.upstream.iter().enumerate() {
                if ups.contains(&i) {
                    waiting[j] -= 1;
                    if waiting[j] == 0 {
                        ready.insert(j);
                    }
                }
            }
        }
        out
    }

    /// The roots by layer: layer 0 depends on nothing, a root in layer k has an upstream in layer
    /// k-1 and none below. Each layer in configuration order; no layer is empty.
    pub fn layers(&self) -> Vec<Vec<&str>> {
        let mut depth: Vec<Option<usize>> = vec![None; self.names.len()];
        for name in self.order() {
            let i = self.index(name).expect("a name of the graph");
            let d = self.upstream[i]
                .iter()
                .map(|u| depth[*u].expect("upstream ordered first") + 1)
                .max()
                .unwrap_or(0);
            depth[i] = Some(d);
        }
        let deepest = depth.iter().flatten().max().map_or(0, |d| d + 1);
        let mut layers: Vec<Vec<&str>> = vec![Vec::new(); deepest];
        for (i, d) in depth.iter().enumerate() {
            layers[d.expect("every root has a depth")].push(self.names[i].as_str());
        }
        layers
    }

    /// What `root` depends on directly (its `depends_on`), in configuration order.
    pub fn depends_on(&self, root: &str) -> Vec<&str> {
        self.index(root)
            .map(|i| {
                self.upstream[i]
                    .iter()
                    .map(|u| self.names[*u].as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every root `root` depends on, directly or through others, in configuration order.
    pub fn upstream_of(&self, root: &str) -> Vec<&str> {
        self.reach(root, |g, i| g.upstream[i].clone())
    }

    /// Every root that depends on `root`, directly or through others, in configuration order.
    pub fn downstream_of(&self, root: &str) -> Vec<&str> {
        self.reach(root, |g, i| {
            (0..g.names.len())
                .filter(|j| g.upstream[*j].contains(&i))
                .collect()
        })
    }

    fn reach(&self, root: &str, next: impl Fn(&RootGraph, usize) -> Vec<usize>) -> Vec<&str> {
        let Some(start) = self.index(root) else {
            return Vec::new();
        };
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(i) = todo.pop() {
            for j in next(self, i) {
                if seen.insert(j) {
                    todo.push(j);
                }
            }
        }
        seen.remove(&start);
        seen.into_iter().map(|i| self.names[i].as_str()).collect()
    }
}

/// Every circle among the edges (`edges[i]`: (root it depends on, entry)), once each: the
/// strongly connected parts of more than one root, each reported from its root first in the
/// configuration along the shortest way back to it.
fn cycles(names: &[String], edges: &[Vec<(usize, usize)>]) -> Vec<GraphProblem> {
    let n = names.len();
    // Which roots each root reaches (n is small: tens of roots).
    let reaches: Vec<BTreeSet<usize>> = (0..n)
        .map(|s| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![s];
            while let Some(i) = todo.pop() {
                for (j, _) in &edges[i] {
                    if seen.insert(*j) {
                        todo.push(*j);
                    }
                }
            }
            seen
        })
        .collect();
    let mut done = vec![false; n];
    let mut out = Vec::new();
    for start in 0..n {
        if done[start] || !reaches[start].contains(&start) {
            continue;
        }
        // The circle's members: the roots start reaches that reach it back.
        let members: BTreeSet<usize> = (0..n)
            .filter(|j| *j == start || (reaches[start].contains(j) && reaches[*j].contains(&start)))
            .collect();
        for m in &members {
            done[*m] = true;
        }
        // The shortest way from start back to itself inside the circle (breadth first, lowest
        // index first at each step, so the answer is the same on every run).
        let mut previous: Vec<Option<(usize, usize)>> = vec![None; n];
        let mut queue = std::collections::VecDeque::from([start]);
        let mut back: Option<(usize, usize)> = None;
        'search: while let Some(i) = queue.pop_front() {
            let mut next: Vec<(usize, usize)> = edges[i]
                .iter()
                .copied()
                .filter(|(j, _)| members.contains(j))
                .collect();
            next.sort();
            for (j, e) in next {
                if j == start {
                    back = Some((i, e));
                    break 'search;
                }
                if previous[j].is_none() {
                    previous[j] = Some((i, e));
                    queue.push_back(j);
                }
            }
        }
        let Some((last, _)) = back else { continue };
        let mut path = vec![start, last];
        let mut at = last;
        while at != start {
            let (p, _) = previous[at].expect("reached from start");
            path.push(p);
            at = p;
        }
        path.reverse();
        // path: start → … → last → start; the entry is start's, naming the second root.
        let second = path[1];
        let entry = edges[start]
            .iter()
            .find(|(j, _)| *j == second)
            .map(|(_, e)| *e)
            .expect("start's edge to the second root");
        out.push(GraphProblem::Cycle {
            root: start,
            entry,
            cycle: path.iter().map(|i| names[*i].clone()).collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(roots: &[(&str, &[&str])]) -> Result<RootGraph, Vec<GraphProblem>> {
        RootGraph::new(roots)
    }

    #[test]
    fn order_puts_upstream_first_and_keeps_the_configuration_order_otherwise() {
        // dns is written first but depends on vms, which depends on network.
        let g = graph(&[
            ("dns", &["vms"]),
            ("storage", &[]),
            ("vms", &["network", "storage"]),
            ("network", &[]),
            ("monitoring", &[]),
        ])
        .unwrap();
        assert_eq!(
            g.order(),
            ["storage", "network", "vms", "dns", "monitoring"]
        );
        assert_eq!(
            g.layers(),
            vec![
                vec!["storage", "network", "monitoring"],
                vec!["vms"],
                vec!["dns"]
            ]
        );
        assert_eq!(g.depends_on("vms"), ["storage", "network"]);
        assert_eq!(g.upstream_of("dns"), ["storage", "vms", "network"]);
        assert_eq!(g.upstream_of("network"), Vec::<&str>::new());
        assert_eq!(g.downstream_of("network"), ["dns", "vms"]);
        assert_eq!(g.downstream_of("monitoring"), Vec::<&str>::new());
        assert_eq!(g.upstream_of("nope"), Vec::<&str>::new());
    }

    #[test]
    fn a_layer_is_one_below_the_deepest_upstream() {
        // c depends on a (layer 0) and b (layer 1): it is in layer 2, not 1.
        let g = graph(&[("a", &[]), ("b", &["a"]), ("c", &["a", "b"])]).unwrap();
        assert_eq!(g.layers(), vec![vec!["a"], vec!["b"], vec!["c"]]);
        let g = RootGraph::independent(&["x", "y"]);
        assert_eq!(g.layers(), vec![vec!["x", "y"]]);
        assert_eq!(g.order(), ["x", "y"]);
        assert!(RootGraph::independent::<&str>(&[]).layers().is_empty());
    }

    #[test]
    fn unknown_names_themselves_and_twice_are_problems_with_a_suggestion() {
        let err = graph(&[
            ("network", &[]),
            ("vms", &["netwrok", "vms", "network", "network", "zzz"]),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            vec![
                GraphProblem::Unknown {
                    root: 1,
                    entry: 0,
                    name: "netwrok".into(),
                    suggestion: Some("network".into())
                },
                GraphProblem::OnItself { root: 1, entry: 1 },
                GraphProblem::Twice { root: 1, entry: 3 },
                GraphProblem::Unknown {
                    root: 1,
                    entry: 4,
                    name: "zzz".into(),
                    suggestion: None
                },
            ]
        );
    }

    #[test]
    fn each_cycle_is_named_once_from_its_first_root() {
        let err = graph(&[
            ("network", &["dns"]),
            ("vms", &["network"]),
            ("dns", &["vms"]),
            ("a", &["b"]),
            ("b", &["a"]),
            ("ok", &["network"]),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            vec![
                GraphProblem::Cycle {
                    root: 0,
                    entry: 0,
                    cycle: vec![
                        "network".into(),
                        "dns".into(),
                        "vms".into(),
                        "network".into()
                    ]
                },
                GraphProblem::Cycle {
                    root: 3,
                    entry: 0,
                    cycle: vec!["a".into(), "b".into(), "a".into()]
                },
            ]
        );
        // Two circles through one root are one part: reported once, along the shortest way.
        let err = graph(&[("x", &["y", "z"]), ("y", &["x"]), ("z", &["y"])]).unwrap_err();
        assert_eq!(
            err,
            vec![GraphProblem::Cycle {
                root: 0,
                entry: 0,
                cycle: vec!["x".into(), "y".into(), "x".into()]
            }]
        );
    }
}
