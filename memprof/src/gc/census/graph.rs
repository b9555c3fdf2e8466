//! The object graph of a census's live objects by the collector's own
//! conservative rule ([`HeapCopy::graph`]), and the bytes each type
//! retains through it ([`HeapCopy::retained`]).
use std::collections::BTreeMap;

use super::count::{LiveObject, Word};
use super::heap_copy::{is_atomic, HeapCopy};

/// The live objects' references, as compressed rows: object `i` points
/// into `targets[offsets[i]..offsets[i + 1]]`, from the word at `fields[…]`
/// bytes into it ([`HeapCopy::graph`]).
pub struct Graph {
    offsets: Vec<usize>,
    targets: Vec<u32>,
    fields: Vec<u32>,
}

impl Graph {
    /// What object `i` points into: (object, offset of the word in `i`).
    pub fn edges(&self, i: usize) -> impl Iterator<Item = (usize, u32)> + '_ {
        let range = self.offsets[i]..self.offsets[i + 1];
        self.targets[range.clone()]
            .iter()
            .zip(&self.fields[range])
            .map(|(&t, &f)| (t as usize, f))
    }

    /// The reverse graph: who points into each object, and from where.
    pub fn referrers(&self) -> Graph {
        let n = self.offsets.len() - 1;
        let mut counts = vec![0usize; n + 1];
        for &t in &self.targets {
            counts[t as usize + 1] += 1;
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut next = counts.clone();
        let mut targets = vec![0u32; self.targets.len()];
        let mut fields = vec![0u32; self.targets.len()];
        for i in 0..n {
            for (t, f) in self.edges(i) {
                targets[next[t]] = i as u32;
                fields[next[t]] = f;
                next[t] += 1;
            }
        }
        Graph {
            offsets: counts,
            targets,
            fields,
        }
    }
}

impl HeapCopy {
    /// The object graph by the collector's own conservative rule: every
    /// word of a scanned (not atomic) live object that points into a live
    /// object, interior pointers included; a typed object's first word is
    /// its id, not an edge. Large scanned objects have edges only when
    /// copied whole ([`HeapReader::copy`]).
    pub fn graph(&self, objects: &[LiveObject]) -> Graph {
        let n = objects.len();
        let (low, high) = match (objects.first(), objects.last()) {
            (Some(f), Some(l)) => (f.start, l.start + l.size),
            _ => (0, 0),
        };
        let mut offsets: Vec<usize> = Vec::with_capacity(n + 1);
        let mut targets: Vec<u32> = Vec::new();
        let mut fields: Vec<u32> = Vec::new();
        offsets.push(0);
        for (i, o) in objects.iter().enumerate() {
            let bytes = self
                .bytes_at(o.start, o.size)
                .filter(|b| !is_atomic(o.kind) && b.len() as u64 == o.size);
            let skip = usize::from(matches!(o.word, Word::Type(_)));
            let words = bytes
                .into_iter()
                .flat_map(|b| b.chunks_exact(8).enumerate().skip(skip));
            for (k, word) in words {
                let q = u64::from_le_bytes(word.try_into().unwrap());
                if q < low || q >= high {
                    continue;
                }
                let j = objects.partition_point(|x| x.start <= q);
                if let Some(j) = j
                    .checked_sub(1)
                    .filter(|&j| j != i && q < objects[j].start + objects[j].size)
                {
                    targets.push(j as u32);
                    fields.push(k as u32 * 8);
                }
            }
            offsets.push(targets.len());
        }
        Graph {
            offsets,
            targets,
            fields,
        }
    }

    /// Retained bytes per type id, as MemProf's `log_object_sizes` counts
    /// them: for each type, the bytes of every live object reachable from
    /// its objects (theirs included) in `graph`, each once.
    pub fn retained(&self, objects: &[LiveObject], graph: &Graph) -> BTreeMap<u32, u64> {
        let n = objects.len();
        let mut instances: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, o) in objects.iter().enumerate() {
            if let Word::Type(id) = o.word {
                instances.entry(id).or_default().push(i as u32);
            }
        }
        // Each walk stamps what it reached with its own number: nothing to clear.
        let mut stamp: Vec<u32> = vec![0; n];
        let mut stack: Vec<u32> = Vec::new();
        let mut retained = BTreeMap::new();
        for (walk, (id, from)) in instances.into_iter().enumerate() {
            let walk = walk as u32 + 1;
            let mut bytes = 0;
            for &i in &from {
                stamp[i as usize] = walk;
            }
            stack.extend(from);
            while let Some(i) = stack.pop() {
                let i = i as usize;
                bytes += objects[i].size;
                for (t, _) in graph.edges(i) {
                    if stamp[t] != walk {
                        stamp[t] = walk;
                        stack.push(t as u32);
                    }
                }
            }
            retained.insert(id, bytes);
        }
        retained
    }
}
