//! The call stacks of a profile, interned as pprof does.
//!
//! A [`Location`] is one distinct return address with the frames it stands
//! for (the functions inlined there, innermost first, then the function
//! holding it). A stack is a node of a tree: `[location, caller node]`,
//! the root side being the outermost frame, so stacks that share their
//! outer frames (all of a recursion's paths) share those nodes, and groups
//! of several kinds with one stack share it whole. Node 0 is the empty
//! stack. A caller's id is always below its callee's, so every walk ends.
//!
//! In the file the table is `{"strings": [...], "locations": [...],
//! "nodes": [[location, caller], ...]}` (node `i` is `nodes[i - 1]`), each
//! string once. Reading it checks every id.
//!
//! ```
//! use memprof::profile::{Frame, Stacks};
//! let f = |name: &str, address: u64| Frame { function: name.into(), address, ..Frame::default() };
//! let mut stacks = Stacks::default();
//! let a = stacks.intern(vec![f("leaf", 1), f("main", 9)]);
//! let b = stacks.intern(vec![f("other", 2), f("main", 9)]);
//! assert_eq!(stacks.locations().len(), 3); // `main` once
//! assert_eq!(stacks.node_count(), 4); // the empty stack, main, leaf, other
//! let names: Vec<&str> = stacks.frames(b).map(|f| f.function.as_str()).collect();
//! assert_eq!(names, ["other", "main"]);
//! assert_eq!(stacks.intern(vec![f("leaf", 1), f("main", 9)]), a);
//! ```
use std::collections::HashMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Frame;

/// The frames of one return address, innermost first; all share its
/// address, module and file offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    pub frames: Vec<Frame>,
}

/// Locations and stack nodes; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Stacks {
    locations: Vec<Location>,
    /// Node `i` (from 1) is `nodes[i - 1]`: `[location, caller node]`.
    nodes: Vec<[u32; 2]>,
    /// What is interned already, for [`Stacks::location`] and
    /// [`Stacks::stack`]; built up to date on demand (a loaded table has none).
    index: Index,
}

#[derive(Debug, Clone, Default)]
struct Index {
    /// Locations by address (several when symbolized differently, as in
    /// merged or hand-made profiles).
    by_address: HashMap<u64, Vec<u32>>,
    node_ids: HashMap<[u32; 2], u32>,
    /// How many locations and nodes are indexed.
    locations: usize,
    nodes: usize,
}

impl PartialEq for Stacks {
    fn eq(&self, other: &Stacks) -> bool {
        self.locations == other.locations && self.nodes == other.nodes
    }
}

impl Stacks {
    /// About what the table holds in memory, in bytes (its index counted
    /// at two words and a half per entry).
    pub fn estimated_bytes(&self) -> usize {
        let frames: usize = self
            .locations
            .iter()
            .flat_map(|l| &l.frames)
            .map(Frame::estimated_bytes)
            .sum();
        let entries = self.locations.len() + self.nodes.len();
        frames
            + self.locations.len() * std::mem::size_of::<Location>()
            + self.nodes.len() * 8
            + entries * 20
    }

    /// The location table, each distinct location once.
    pub fn locations(&self) -> &[Location] {
        &self.locations
    }

    /// Stack nodes, the empty stack (0) included: valid stack ids are below this.
    pub fn node_count(&self) -> usize {
        self.nodes.len() + 1
    }

    /// The node `[location, caller]` of stack `id` (not 0).
    pub fn node(&self, id: u32) -> [u32; 2] {
        self.nodes[id as usize - 1]
    }

    /// The locations of stack `id`, innermost first.
    pub fn stack_locations(&self, id: u32) -> impl Iterator<Item = &Location> + Clone + '_ {
        let mut node = id;
        std::iter::from_fn(move || {
            if node == 0 {
                return None;
            }
            let [location, caller] = self.node(node);
            node = caller;
            Some(&self.locations[location as usize])
        })
    }

    /// The frames of stack `id`, innermost first.
    pub fn frames(&self, id: u32) -> impl Iterator<Item = &Frame> + Clone + '_ {
        self.stack_locations(id).flat_map(|l| l.frames.iter())
    }

    /// The id of the location of these frames (one address, innermost
    /// first, not empty), added if new.
    pub fn location(&mut self, frames: Vec<Frame>) -> u32 {
        self.update_index();
        let address = frames.first().map_or(0, |f| f.address);
        let known = self.index.by_address.entry(address).or_default();
        if let Some(&id) = known
            .iter()
            .find(|&&id| self.locations[id as usize].frames == frames)
        {
            return id;
        }
        let id = self.locations.len() as u32;
        known.push(id);
        self.locations.push(Location { frames });
        self.index.locations = self.locations.len();
        id
    }

    /// The ids of many stacks at once, each given as [`Stacks::stack`]
    /// takes it. Into a table without stacks yet, they go in sorted order
    /// from the outermost frame: stacks sharing a prefix come together,
    /// so each node is the next one on the previous stack's path, and no
    /// index of the nodes is built (for the millions of nodes of a big
    /// program, that index's growth was the peak of memprof's memory).
    ///
    /// The stacks are given back to back in `locations`, stack `i` ending
    /// at `ends[i]` (one array: a big program's are tens of megabytes).
    pub fn stacks(&mut self, locations: &[u32], ends: &[usize]) -> Vec<u32> {
        let stack = |i: usize| &locations[i.checked_sub(1).map_or(0, |p| ends[p])..ends[i]];
        if !self.nodes.is_empty() {
            return (0..ends.len()).map(|i| self.stack(stack(i))).collect();
        }
        let mut order: Vec<u32> = (0..ends.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (stack(a as usize), stack(b as usize));
            a.iter().rev().cmp(b.iter().rev())
        });
        // Room for the most nodes there can be: pages never written are
        // never resident, and the table is not copied as it grows.
        self.nodes.reserve_exact(locations.len());
        let mut ids = vec![0; ends.len()];
        // The nodes of the previous stack's path, outermost first.
        let mut path: Vec<u32> = Vec::new();
        let mut previous: &[u32] = &[];
        for &i in &order {
            let stack = stack(i as usize);
            let shared = stack
                .iter()
                .rev()
                .zip(previous.iter().rev())
                .take_while(|(a, b)| a == b)
                .count();
            path.truncate(shared);
            for &location in stack.iter().rev().skip(shared) {
                self.nodes
                    .push([location, path.last().copied().unwrap_or(0)]);
                path.push(self.nodes.len() as u32);
            }
            ids[i as usize] = path.last().copied().unwrap_or(0);
            previous = stack;
        }
        self.nodes.shrink_to_fit();
        ids
    }

    /// The id of the stack of these locations (innermost first), added if new.
    pub fn stack(&mut self, locations: &[u32]) -> u32 {
        self.update_index();
        let mut node = 0;
        for &location in locations.iter().rev() {
            let key = [location, node];
            node = match self.index.node_ids.get(&key) {
                Some(&id) => id,
                None => {
                    self.nodes.push(key);
                    let id = self.nodes.len() as u32;
                    self.index.node_ids.insert(key, id);
                    id
                }
            };
        }
        self.index.nodes = self.nodes.len();
        node
    }

    /// The id of a stack given as frames (innermost first): consecutive
    /// frames of one address make one location, unless a frame repeats
    /// (a recursive call from the same place is another location).
    pub fn intern(&mut self, frames: Vec<Frame>) -> u32 {
        let mut locations = Vec::new();
        let mut run: Vec<Frame> = Vec::new();
        for frame in frames {
            let same = run.first().is_some_and(|first| {
                (first.address, &first.module, first.offset)
                    == (frame.address, &frame.module, frame.offset)
                    && !run.contains(&frame)
            });
            if !same && !run.is_empty() {
                locations.push(self.location(std::mem::take(&mut run)));
            }
            run.push(frame);
        }
        if !run.is_empty() {
            locations.push(self.location(run));
        }
        self.stack(&locations)
    }

    /// Indexes what was added since the last call (all of a loaded table).
    fn update_index(&mut self) {
        let index = &mut self.index;
        for id in index.locations..self.locations.len() {
            let address = self.locations[id].frames.first().map_or(0, |f| f.address);
            index.by_address.entry(address).or_default().push(id as u32);
        }
        index.locations = self.locations.len();
        for id in index.nodes..self.nodes.len() {
            index.node_ids.insert(self.nodes[id], id as u32 + 1);
        }
        index.nodes = self.nodes.len();
    }
}

/// A location in the file: the address, module and offset once, then its
/// frames with string ids.
#[derive(Serialize, Deserialize)]
struct WireLocation {
    address: u64,
    #[serde(default)]
    offset: Option<u64>,
    module: u32,
    frames: Vec<WireFrame>,
}

#[derive(Serialize, Deserialize)]
struct WireFrame {
    function: u32,
    raw_name: u32,
    #[serde(default)]
    file: Option<u32>,
    #[serde(default)]
    line: Option<u32>,
}

#[derive(Serialize)]
struct WireOut<'a> {
    strings: Vec<&'a str>,
    locations: Vec<WireLocation>,
    nodes: &'a [[u32; 2]],
}

#[derive(Deserialize)]
struct WireIn {
    strings: Vec<String>,
    locations: Vec<WireLocation>,
    nodes: Vec<[u32; 2]>,
}

/// Each string once, by first use.
#[derive(Default)]
struct StringTable<'a> {
    strings: Vec<&'a str>,
    ids: HashMap<&'a str, u32>,
}

impl<'a> StringTable<'a> {
    fn id(&mut self, s: &'a str) -> u32 {
        *self.ids.entry(s).or_insert_with(|| {
            self.strings.push(s);
            self.strings.len() as u32 - 1
        })
    }
}

impl Serialize for Stacks {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.wire().serialize(serializer)
    }
}

impl Stacks {
    /// The table as written: string ids for the text.
    fn wire<'a>(&'a self) -> WireOut<'a> {
        let mut table = StringTable::default();
        let mut string = |s: &'a str| table.id(s);
        let mut locations = Vec::with_capacity(self.locations.len());
        for location in &self.locations {
            let first = location.frames.first();
            let module = string(first.map_or("", |f| f.module.as_str()));
            let frames = location
                .frames
                .iter()
                .map(|f| WireFrame {
                    function: string(&f.function),
                    raw_name: string(&f.raw_name),
                    file: f.file.as_deref().map(&mut string),
                    line: f.line,
                })
                .collect();
            locations.push(WireLocation {
                address: first.map_or(0, |f| f.address),
                offset: first.and_then(|f| f.offset),
                module,
                frames,
            });
        }
        WireOut {
            strings: table.strings,
            locations,
            nodes: &self.nodes,
        }
    }
}

impl<'de> Deserialize<'de> for Stacks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Stacks, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        let string = |id: u32| -> Result<&String, D::Error> {
            wire.strings.get(id as usize).ok_or_else(|| {
                D::Error::custom(format!("string {id} of a table of {}", wire.strings.len()))
            })
        };
        let mut locations = Vec::with_capacity(wire.locations.len());
        for location in &wire.locations {
            if location.frames.is_empty() {
                return Err(D::Error::custom("a location without frames"));
            }
            let module = string(location.module)?;
            let frames = location
                .frames
                .iter()
                .map(|f| {
                    Ok(Frame {
                        function: string(f.function)?.clone(),
                        raw_name: string(f.raw_name)?.clone(),
                        file: f.file.map(string).transpose()?.cloned(),
                        line: f.line,
                        module: module.clone(),
                        address: location.address,
                        offset: location.offset,
                    })
                })
                .collect::<Result<Vec<Frame>, D::Error>>()?;
            locations.push(Location { frames });
        }
        for (i, &[location, caller]) in wire.nodes.iter().enumerate() {
            if location as usize >= locations.len() || caller as usize > i {
                return Err(D::Error::custom(format!(
                    "stack node {} names location {location} of {} and caller {caller}",
                    i + 1,
                    locations.len()
                )));
            }
        }
        Ok(Stacks {
            locations,
            nodes: wire.nodes,
            index: Index::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, address: u64) -> Frame {
        Frame {
            function: function.into(),
            raw_name: format!("raw_{function}"),
            file: Some("/src/a.cr".into()),
            line: Some(address as u32),
            module: "/bin/a".into(),
            address,
            offset: Some(address - 0x1000),
        }
    }

    #[test]
    fn shares_locations_and_outer_nodes() {
        let mut stacks = Stacks::default();
        let main = frame("main", 0x1900);
        // Recursion from one call site: the same location twice, not merged.
        let deep = stacks.intern(vec![
            frame("alloc", 0x1100),
            frame("rec", 0x1200),
            frame("rec", 0x1200),
            main.clone(),
        ]);
        let shallow = stacks.intern(vec![frame("rec", 0x1200), main.clone()]);
        assert_eq!(stacks.locations().len(), 3);
        // main; rec←main; rec←rec←main; alloc←…: the shallow stack is a node of the deep one.
        assert_eq!(stacks.node_count(), 5);
        assert_eq!(stacks.node(stacks.node(deep)[1])[1], shallow);
        let names = |id| {
            stacks
                .frames(id)
                .map(|f| f.function.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(deep), ["alloc", "rec", "rec", "main"]);
        assert_eq!(names(shallow), ["rec", "main"]);
        assert_eq!(names(0), Vec::<String>::new());
    }

    /// Interned at once, stacks get the nodes one-by-one interning gives
    /// them: each prefix once, every id naming its own locations.
    #[test]
    fn stacks_at_once_share_prefixes_as_one_by_one() {
        let all: Vec<Vec<u32>> = vec![
            vec![3, 2, 1, 0],
            vec![2, 1, 0],
            vec![4, 1, 0],
            vec![],
            vec![3, 2, 1, 0],
            vec![0],
            vec![1, 5],
        ];
        let mut at_once = Stacks::default();
        let ends: Vec<usize> = all
            .iter()
            .scan(0, |end, s| {
                *end += s.len();
                Some(*end)
            })
            .collect();
        let ids = at_once.stacks(&all.concat(), &ends);
        let mut one_by_one = Stacks::default();
        for s in &all {
            one_by_one.stack(s);
        }
        assert_eq!(at_once.node_count(), one_by_one.node_count());
        let path = |stacks: &Stacks, mut id: u32| {
            let mut locations = Vec::new();
            while id != 0 {
                let [location, caller] = stacks.node(id);
                locations.push(location);
                id = caller;
            }
            locations
        };
        for (stack, &id) in all.iter().zip(&ids) {
            assert_eq!(&path(&at_once, id), stack);
        }
        assert_eq!(ids[0], ids[4]);
        // Indexed afterwards on demand: a known stack is found, not added.
        assert_eq!(at_once.stack(&all[1]), ids[1]);
        assert_eq!(at_once.node_count(), one_by_one.node_count());
    }

    #[test]
    fn inlined_frames_make_one_location() {
        let mut stacks = Stacks::default();
        let inlined = frame("inlined", 0x1100);
        let outer = Frame {
            function: "outer".into(),
            ..inlined.clone()
        };
        let id = stacks.intern(vec![inlined.clone(), outer.clone(), inlined, outer]);
        assert_eq!(stacks.locations().len(), 1);
        assert_eq!(stacks.locations()[0].frames.len(), 2);
        assert_eq!(stacks.frames(id).count(), 4);
    }

    #[test]
    fn round_trips_with_each_string_once() {
        let mut stacks = Stacks::default();
        let a = stacks.intern(vec![frame("a", 0x1100), frame("main", 0x1900)]);
        let b = stacks.intern(vec![frame("b", 0x1200), frame("main", 0x1900)]);
        let json = serde_json::to_string(&stacks).unwrap();
        assert_eq!(json.matches("/src/a.cr").count(), 1, "{json}");
        assert_eq!(json.matches("raw_main").count(), 1, "{json}");
        let mut back: Stacks = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stacks);
        assert!(back.frames(a).eq(stacks.frames(a)));
        // A loaded table interns on: the same ids for the same stacks.
        assert_eq!(back.intern(stacks.frames(b).cloned().collect()), b);
        assert_eq!(back.node_count(), stacks.node_count());
    }

    #[test]
    fn refuses_ids_out_of_range() {
        let bad = [
            r#"{"strings":["m"],"locations":[{"address":1,"module":3,"frames":[{"function":0,"raw_name":0}]}],"nodes":[]}"#,
            r#"{"strings":["m"],"locations":[{"address":1,"module":0,"frames":[]}],"nodes":[]}"#,
            r#"{"strings":["m"],"locations":[{"address":1,"module":0,"frames":[{"function":0,"raw_name":0}]}],"nodes":[[1,0]]}"#,
            // A node its own caller: a walk that never ends.
            r#"{"strings":["m"],"locations":[{"address":1,"module":0,"frames":[{"function":0,"raw_name":0}]}],"nodes":[[0,1]]}"#,
        ];
        for json in bad {
            assert!(serde_json::from_str::<Stacks>(json).is_err(), "{json}");
        }
    }
}
