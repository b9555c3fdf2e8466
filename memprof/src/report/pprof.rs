//! pprof: a gzipped `profile.proto`, for `go tool pprof` and the pprof web
//! UI (`go tool pprof -http=: app.pb.gz`). Four sample types per stack:
//! `alloc_objects`/`alloc_space` (everything allocated) and
//! `inuse_objects`/`inuse_space` (live at the end, the default view); with
//! resident memory (kind `rss`), `resident_pages`/`resident_space` too,
//! its pages counted there alone (the default view when nothing else is
//! live); each sample carries a `kind` label. Frames become functions with file and
//! line; inlined frames share their caller's location, as in pprof's own
//! profiles; each module is a mapping, the executable's first (pprof's
//! main binary). A stack the unwinder could not
//! follow to its end has the root frame `[truncated]`.
//!
//! The messages are the subset of
//! [profile.proto](https://github.com/google/pprof/blob/main/proto/profile.proto)
//! memprof writes, declared here with prost's derive (no `protoc` needed).
//!
//! ```
//! use std::io::Read;
//! use memprof::profile::{Frame, Group, Profile};
//! use memprof::report::{render, Format, Options};
//! let mut profile = Profile::default();
//! profile.push(Group { kind: "libc".into(), live_count: 600, live_bytes: 28800,
//!     total_count: 1000, total_bytes: 48000, ..Default::default() },
//!     vec![Frame { function: "make_foo".into(), address: 0x1234, ..Default::default() }]);
//! let mut gzipped = Vec::new();
//! render(&profile, Format::Pprof, &Options::default(), &mut gzipped).unwrap();
//! let mut proto = Vec::new();
//! flate2::read::GzDecoder::new(&gzipped[..]).read_to_end(&mut proto).unwrap();
//! assert!(proto.windows(8).any(|w| w == b"make_foo"));
//! ```
use std::collections::HashMap;
use std::io::Write;

use anyhow::Result;
use flate2::write::GzEncoder;
use prost::Message;

use super::{select, Options};
use crate::profile::{Frame, Group, Profile};

/// profile.proto's messages (field numbers as upstream).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Innermost first: the last line is the caller the others were inlined into.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Builds the message: one sample per group (`--min-bytes`, `--top`,
/// `--skip`, `--depth` and the filters apply; stacks with nothing live are
/// kept for the `alloc_*` views).
pub fn build(profile: &Profile, options: &Options) -> proto::Profile {
    let mut b = Builder::default();
    b.string(""); // index 0 is the empty string
                  // Resident pages (`rss`) are not allocations: their own pair of
                  // sample types, or `alloc_space` would count a block's bytes and
                  // again its pages.
    let resident = profile.groups.iter().any(|g| g.kind == RSS);
    let mut types = vec![
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ];
    if resident {
        types.extend([("resident_pages", "count"), ("resident_space", "bytes")]);
    }
    let sample_type = types
        .iter()
        .map(|(t, u)| proto::ValueType {
            r#type: b.string(t),
            unit: b.string(u),
        })
        .collect();
    let labels = LabelKeys::new(&mut b, profile);
    let groups = select(profile, options, 0, false);
    let bar = crate::progress::bar(groups.len() as u64, "writing pprof samples");
    let mut samples = Vec::with_capacity(groups.len());
    for g in groups {
        bar.inc(1);
        let frames: Vec<&Frame> = options.frames(profile, g, usize::MAX).collect();
        let mut location_id = b.stack(&frames);
        if g.truncated {
            // The root, as in folded: where the unwinder gave up.
            location_id.push(b.truncated_location());
        }
        let label = labels.of(&mut b, profile, g);
        samples.push(proto::Sample {
            location_id,
            value: values(g, resident),
            label,
        });
    }
    bar.finish_and_clear();
    let comment = comments(&mut b, profile);
    let period_type = Some(proto::ValueType {
        r#type: b.string("space"),
        unit: b.string("bytes"),
    });
    // Resident memory alone (the agent's default): its view first.
    let heap = profile
        .groups
        .iter()
        .any(|g| g.kind != RSS && g.live_bytes > 0);
    let default_sample_type = b.string(match resident && !heap {
        true => "resident_space",
        false => "inuse_space",
    });
    b.main_mapping_first(&profile.target.exe);
    proto::Profile {
        sample_type,
        sample: samples,
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: (profile.start_unix_s * 1e9) as i64,
        duration_nanos: (profile.duration_s * 1e9) as i64,
        period_type,
        period: 1,
        comment,
        default_sample_type,
    }
}

/// The kind of resident pages.
const RSS: &str = "rss";

/// A sample's values, in the order of the sample types: an allocation's
/// in the four heap types, resident pages in their own pair.
fn values(g: &Group, resident: bool) -> Vec<i64> {
    let heap = [g.total_count, g.total_bytes, g.live_count, g.live_bytes];
    let values: Vec<u64> = match (resident, g.kind == RSS) {
        (false, _) => heap.to_vec(),
        (true, false) => heap.into_iter().chain([0, 0]).collect(),
        (true, true) => vec![0, 0, 0, 0, g.live_count, g.live_bytes],
    };
    values.into_iter().map(|v| v as i64).collect()
}

/// The label keys every sample uses, and each process's program name.
struct LabelKeys {
    kind: i64,
    pid: i64,
    comm: i64,
    comms: HashMap<u32, i64>,
}

impl LabelKeys {
    fn new(b: &mut Builder, profile: &Profile) -> LabelKeys {
        let kind = b.string("kind");
        let (pid, comm) = (b.string("pid"), b.string("comm"));
        let comms = profile
            .processes()
            .iter()
            .map(|p| (p.pid, b.string(p.comm())))
            .collect();
        LabelKeys {
            kind,
            pid,
            comm,
            comms,
        }
    }

    /// The labels of `g`'s sample: its kind, its process, its class,
    /// folded recursion.
    fn of(&self, b: &mut Builder, profile: &Profile, g: &Group) -> Vec<proto::Label> {
        let mut label = vec![proto::Label {
            key: self.kind,
            str: b.string(&g.kind),
            ..Default::default()
        }];
        // Which process: a number label and its program's name.
        let pid = profile.pid_of(g);
        label.push(proto::Label {
            key: self.pid,
            num: pid as i64,
            ..Default::default()
        });
        if let Some(&comm) = self.comms.get(&pid) {
            label.push(proto::Label {
                key: self.comm,
                str: comm,
                ..Default::default()
            });
        }
        // The class of GC objects (`-tagfocus class=Widget`).
        if let Some(class) = &g.type_name {
            label.push(proto::Label {
                key: b.string("class"),
                str: b.string(class),
                ..Default::default()
            });
        }
        if g.folded {
            label.push(proto::Label {
                key: b.string("stack"),
                str: b.string(super::FOLDED_FRAME),
                ..Default::default()
            });
        }
        label
    }
}

/// What the profile is, and that its figures are estimates when sampled
/// (pprof shows comments with `-comments`).
fn comments(b: &mut Builder, profile: &Profile) -> Vec<i64> {
    let mut comment = vec![b.string(&format!(
        "memprof {} of {}",
        profile.mode,
        super::flamegraph::target_name(profile)
    ))];
    if profile.sample_bytes > 0 {
        comment.push(b.string(&format!(
            "sampled: one allocation per {} bytes on average (--sample-bytes); counts and bytes are estimates",
            profile.sample_bytes
        )));
    }
    if profile.gc_sampling == "refill" {
        comment.push(b.string(&format!(
            "GC allocations sampled at the collector's free-list refills (--gc-sampling refill, {} refills{}); GC counts and bytes are estimates",
            profile.counters.refills,
            profile.refills_thinned()
        )));
    }
    comment
}

pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let bytes = build(profile, options).encode_to_vec();
    let mut gz = GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}

/// Module, address, and (function, line) of each frame at that address.
type LocationKey = (String, u64, Vec<(String, u32)>);

#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, String, String), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<LocationKey, u64>,
    /// Locations by the address of their first frame in the profile's
    /// stack table and their frame count: a stack table's frames are
    /// shared by every stack through them.
    seen: HashMap<(usize, usize), u64>,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<String, u64>,
    /// The `[truncated]` root's location, once made.
    truncated: Option<u64>,
}

impl Builder {
    /// The id of `s`, added if new; stored with its control characters
    /// shown ([`crate::text`]): names and labels come from the target.
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(crate::text::visible(s).into_owned());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let file = f.file.clone().unwrap_or_default();
        let key = (f.function.clone(), f.raw_name.clone(), file);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let function = proto::Function {
            id,
            name: self.string(&key.0),
            system_name: self.string(if key.1.is_empty() { &key.0 } else { &key.1 }),
            filename: self.string(&key.2),
            start_line: 0,
        };
        self.functions.push(function);
        self.function_ids.insert(key, id);
        id
    }

    fn mapping(&mut self, f: &Frame) -> u64 {
        let start = f.address.saturating_sub(f.offset.unwrap_or(f.address));
        if let Some(&id) = self.mapping_ids.get(&f.module) {
            let m = &mut self.mappings[id as usize - 1];
            m.memory_start = m.memory_start.min(start);
            m.memory_limit = m.memory_limit.max(f.address + 1);
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let mapping = proto::Mapping {
            id,
            memory_start: start,
            memory_limit: f.address + 1,
            file_offset: 0,
            filename: self.string(&f.module),
            build_id: 0,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        };
        self.mappings.push(mapping);
        self.mapping_ids.insert(f.module.clone(), id);
        id
    }

    /// pprof takes the first mapping for the program (its `File:` line, the
    /// binary it looks symbols up in): the executable's, wherever its first
    /// frame came in the stacks (a library's `operator new` is innermost).
    fn main_mapping_first(&mut self, exe: &str) {
        let Some(&id) = self.mapping_ids.get(exe) else {
            return;
        };
        if id == 1 {
            return;
        }
        // Swap ids 1 and `id` in the mappings and the locations naming them.
        let swap = |m: u64| match m {
            1 => id,
            m if m == id => 1,
            m => m,
        };
        self.mappings.swap(0, id as usize - 1);
        for m in &mut self.mappings {
            m.id = swap(m.id);
        }
        for l in &mut self.locations {
            if l.mapping_id != 0 {
                l.mapping_id = swap(l.mapping_id);
            }
        }
    }

    /// The location of the `[truncated]` root frame: no mapping, no address.
    fn truncated_location(&mut self) -> u64 {
        if let Some(id) = self.truncated {
            return id;
        }
        let name = self.string(super::TRUNCATED_FRAME);
        let function_id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id: function_id,
            name,
            system_name: name,
            filename: 0,
            start_line: 0,
        });
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line {
                function_id,
                line: 0,
            }],
            is_folded: false,
        });
        self.truncated = Some(id);
        id
    }

    /// The locations of a stack's frames (innermost first).
    fn stack(&mut self, frames: &[&Frame]) -> Vec<u64> {
        let mut location_id = Vec::new();
        // Inlined frames share their caller's return address: one location.
        let mut i = 0;
        while i < frames.len() {
            let mut j = i + 1;
            while j < frames.len() && frames[j].address == frames[i].address {
                j += 1;
            }
            // The same frames of the stack table again: their location is known.
            let seen = (std::ptr::from_ref(frames[i]) as usize, j - i);
            let id = match self.seen.get(&seen) {
                Some(&id) => id,
                None => {
                    let id = self.location(&frames[i..j]);
                    self.seen.insert(seen, id);
                    id
                }
            };
            location_id.push(id);
            i = j;
        }
        location_id
    }

    /// One location for frames sharing an address (innermost first).
    fn location(&mut self, frames: &[&Frame]) -> u64 {
        let key = (
            frames[0].module.clone(),
            frames[0].address,
            frames
                .iter()
                .map(|f| (f.function.clone(), f.line.unwrap_or(0)))
                .collect::<Vec<_>>(),
        );
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let mapping_id = self.mapping(frames[0]);
        let line = frames
            .iter()
            .map(|f| proto::Line {
                function_id: self.function(f),
                line: i64::from(f.line.unwrap_or(0)),
            })
            .collect();
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: frames[0].address,
            line,
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sample_per_group_and_a_message_that_decodes() {
        let mut profile = Profile::default();
        profile.push(
            Group {
                kind: "libc".into(),
                live_count: 600,
                live_bytes: 28800,
                total_count: 1000,
                total_bytes: 48000,
                ..Default::default()
            },
            vec![Frame {
                function: "make_foo".into(),
                address: 0x1234,
                ..Default::default()
            }],
        );
        let proto = build(&profile, &Options::default());
        assert_eq!(proto.sample[0].value, [1000, 48000, 600, 28800]);
        let bytes = proto.encode_to_vec();
        assert_eq!(proto::Profile::decode(&bytes[..]).unwrap(), proto);
    }

    #[test]
    fn resident_pages_are_their_own_sample_types() {
        let group = |kind: &str, function: &str, live: u64| {
            (
                Group {
                    kind: kind.into(),
                    live_count: live / 4096,
                    live_bytes: live,
                    total_count: live / 4096,
                    total_bytes: live,
                    ..Default::default()
                },
                vec![Frame {
                    function: function.into(),
                    address: 0x1234,
                    ..Default::default()
                }],
            )
        };
        let type_names = |proto: &proto::Profile| -> Vec<String> {
            let name = |i: i64| proto.string_table[i as usize].clone();
            proto.sample_type.iter().map(|t| name(t.r#type)).collect()
        };
        // Resident pages alone: their view is the default.
        let mut profile = Profile::default();
        let (g, frames) = group("rss", "touch_pages", 1 << 20);
        profile.push(g, frames);
        let proto = build(&profile, &Options::default());
        assert_eq!(
            type_names(&proto),
            [
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space",
                "resident_pages",
                "resident_space"
            ]
        );
        assert_eq!(proto.sample[0].value, [0, 0, 0, 0, 256, 1 << 20]);
        assert_eq!(
            proto.string_table[proto.default_sample_type as usize],
            "resident_space"
        );
        // Beside allocations: each in its own types, the heap's the default.
        let (g, frames) = group("libc", "make_foo", 8192);
        profile.push(g, frames);
        let proto = build(&profile, &Options::default());
        let mut values: Vec<Vec<i64>> = proto.sample.iter().map(|s| s.value.clone()).collect();
        values.sort();
        assert_eq!(
            values,
            [vec![0, 0, 0, 0, 256, 1 << 20], vec![2, 8192, 2, 8192, 0, 0]]
        );
        assert_eq!(
            proto.string_table[proto.default_sample_type as usize],
            "inuse_space"
        );
    }
}
