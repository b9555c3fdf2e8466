//! `memprof heap --graph TYPE`: the objects that point to objects of a
//! type, level by level, as perf-tools MemProf's `pretty_log_object_graph`
//! prints them (`0x… ["0x… Type"] --@field,level--> 0x…`, a mermaid graph).
//!
//! The edges are the census's object graph ([`Graph`]: the collector's
//! conservative rule). Level 0 are the objects pointing to the type's
//! objects, level 1 those pointing to level 0, … up to `--ref-level`
//! levels; at most `--ref-limit` objects of the type are followed, and at
//! most `--ref-limit` referrers of each object. A field is named from the
//! DWARF of `--debug` builds (`@c`, [`crate::crystal::fields`]), else by its
//! offset in the referrer, `@(field 8)` (a default build's DWARF has no
//! field names). Roots pointing to the graph's objects are found by
//! [`super::roots`].
use std::collections::HashSet;

use anyhow::{bail, Result};

use crate::gc::census::{Graph, LiveObject};

/// One reference: `from` points into `to` from the word `field` bytes
/// into it, `level` steps away from the type's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: u64,
    pub to: u64,
    pub field: u32,
    /// The field's name (DWARF of `--debug` builds), if known.
    pub name: Option<String>,
    pub level: usize,
}

impl Edge {
    /// `@c`, or `@(field 8)` without a name.
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("@{name}"),
            None => format!("@(field {})", self.field),
        }
    }
}

/// The graph around a type's objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefGraph {
    pub target_type: String,
    /// (address, type name), the type's objects first.
    pub nodes: Vec<(u64, String)>,
    pub edges: Vec<Edge>,
    /// (node, what outside the heap points to it) ([`super::roots`]).
    pub roots: Vec<(u64, String)>,
}

/// Walks the referrers of the objects named `target` (by `name_of`), up
/// to `ref_level` levels, `ref_limit` objects and referrers each;
/// `field_name(type, offset)` names a referrer's field where it can.
pub(crate) fn walk(
    objects: &[LiveObject],
    graph: &Graph,
    name_of: &dyn Fn(&LiveObject) -> String,
    field_name: &dyn Fn(&str, u32) -> Option<String>,
    (target, ref_level, ref_limit): (&str, usize, usize),
) -> Result<RefGraph> {
    let starts: Vec<usize> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| name_of(o) == target)
        .map(|(i, _)| i)
        .take(ref_limit)
        .collect();
    if starts.is_empty() {
        bail!(
            "--graph {target}: no live object of that type (the names are those of the type table)"
        );
    }
    let referrers = graph.referrers();
    let mut seen: HashSet<usize> = starts.iter().copied().collect();
    let mut order: Vec<usize> = starts.clone();
    let mut edges = Vec::new();
    let mut frontier = starts;
    for level in 0..ref_level {
        let mut next = Vec::new();
        for &t in &frontier {
            for (r, field) in referrers.edges(t).take(ref_limit) {
                edges.push(Edge {
                    from: objects[r].start,
                    to: objects[t].start,
                    field,
                    name: field_name(&name_of(&objects[r]), field),
                    level,
                });
                if seen.insert(r) {
                    order.push(r);
                    next.push(r);
                }
            }
        }
        frontier = next;
    }
    Ok(RefGraph {
        target_type: target.to_string(),
        nodes: order
            .into_iter()
            .map(|i| (objects[i].start, name_of(&objects[i])))
            .collect(),
        edges,
        roots: Vec::new(),
    })
}

/// The graph as mermaid (`graph LR`), MemProf's way: each edge
/// `0x… ["0x… Type"] -- "@(field 8),0" --> 0x… ["0x… Type"]`.
pub(crate) fn mermaid(graph: &RefGraph) -> String {
    let name: std::collections::HashMap<u64, &str> =
        graph.nodes.iter().map(|(a, n)| (*a, n.as_str())).collect();
    let node = |a: u64| {
        format!(
            "{a:#x}[\"{a:#x} {}\"]",
            name.get(&a).copied().unwrap_or("?")
        )
    };
    let mut out = String::from("graph LR\n");
    for e in &graph.edges {
        out += &format!(
            "  {} -- \"{},{}\" --> {}\n",
            node(e.from),
            e.label(),
            e.level,
            node(e.to)
        );
    }
    for (i, (a, what)) in graph.roots.iter().enumerate() {
        out += &format!(
            "  root{i}([\"{}\"]) --> {}\n",
            what.replace('"', "'"),
            node(*a)
        );
    }
    if graph.edges.is_empty() && graph.roots.is_empty() {
        for &(a, _) in &graph.nodes {
            out += &format!("  {}\n", node(a));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mermaid_lines_read_as_memprof_prints_them() {
        let graph = RefGraph {
            target_type: "C".into(),
            nodes: vec![(0x20, "C".into()), (0x10, "B".into())],
            edges: vec![Edge {
                from: 0x10,
                to: 0x20,
                field: 8,
                name: None,
                level: 0,
            }],
            roots: vec![(0x10, "global Keep::all".into())],
        };
        assert_eq!(
            mermaid(&graph),
            "graph LR\n  0x10[\"0x10 B\"] -- \"@(field 8),0\" --> 0x20[\"0x20 C\"]\n  root0([\"global Keep::all\"]) --> 0x10[\"0x10 B\"]\n"
        );
    }
}
