//! Everything in the profile as one JSON document (schema in docs/formats.md,
//! `"version"` bumps on incompatible changes). Unlike the tables it keeps
//! stacks with nothing live and applies `--min-bytes`/`--top`/`--depth` only
//! when given; the allocator plumbing is hidden unless `--skip-runtime=false`.
use std::io::Write;

use anyhow::Result;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use super::{select, Options};
use crate::profile::{Group, Profile};

/// Version of the JSON report schema.
pub const VERSION: u32 = 1;

/// Streams the document: one group's value at a time (a big profile's
/// report is far bigger than the profile), keys in the order `to_value`
/// gives them (sorted).
pub fn write(profile: &Profile, options: &Options, out: &mut dyn Write) -> Result<()> {
    let doc = Doc {
        top: top(profile),
        groups: Groups {
            profile,
            options,
            rows: select(profile, options, 0, false),
        },
    };
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

/// The whole document as one value (the streamed one, in tests).
#[cfg(test)]
fn to_value(profile: &Profile, options: &Options) -> Value {
    let mut top = top(profile);
    let groups = select(profile, options, 0, false)
        .into_iter()
        .map(|g| group(profile, options, g))
        .collect();
    top.insert("groups".to_string(), Value::Array(groups));
    Value::Object(top)
}

struct Doc<'a> {
    /// Everything but the groups.
    top: Map<String, Value>,
    groups: Groups<'a>,
}

struct Groups<'a> {
    profile: &'a Profile,
    options: &'a Options,
    rows: Vec<&'a Group>,
}

impl Serialize for Doc<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.top.len() + 1))?;
        let mut groups = Some(&self.groups);
        for (key, value) in &self.top {
            if key.as_str() > "groups" {
                if let Some(groups) = groups.take() {
                    map.serialize_entry("groups", groups)?;
                }
            }
            map.serialize_entry(key, value)?;
        }
        if let Some(groups) = groups {
            map.serialize_entry("groups", groups)?;
        }
        map.end()
    }
}

impl Serialize for Groups<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.rows.len()))?;
        for g in &self.rows {
            seq.serialize_element(&group(self.profile, self.options, g))?;
        }
        seq.end()
    }
}

fn group(profile: &Profile, options: &Options, g: &Group) -> Value {
    let frames: Vec<Value> = options
        .frames(profile, g, usize::MAX)
        .map(|f| {
            json!({
                "function": f.function,
                "raw_name": f.raw_name,
                "file": f.file,
                "line": f.line,
                "module": f.module,
                "address": format!("{:#x}", f.address),
                "offset": f.offset.map(|o| format!("{o:#x}")),
            })
        })
        .collect();
    let program = super::program::frame(profile, g).map(|f| {
        json!({
            "function": f.function,
            "file": f.file,
            "line": f.line,
        })
    });
    json!({
        "program_frame": program,
        "pid": profile.pid_of(g),
        "pid_reuse": g.pid_reuse,
        "kind": g.kind,
        "live_count": g.live_count,
        "live_bytes": g.live_bytes,
        "total_count": g.total_count,
        "total_bytes": g.total_bytes,
        "type_name": g.type_name,
        "truncated": g.truncated,
        "folded": g.folded,
        "overflow": g.overflow,
        "runtime": super::runtime::role(profile, g).map(super::runtime::Role::name),
        "collected_count": g.collected_count,
        "collected_bytes": g.collected_bytes,
        "marked_count": g.marked_count,
        "marked_bytes": g.marked_bytes,
        "lifetimes": g.lifetimes,
        "gc_history": g.gc_history,
        "frames": frames,
    })
}

/// The session's processes. A profiled one carries the figures of its
/// groups shown and its counters; one memprof did not profile has `null`
/// figures.
fn processes(profile: &Profile) -> Vec<Value> {
    profile
        .processes()
        .into_iter()
        .map(|p| {
            let sum = |f: fn(&Group) -> u64| -> Value {
                if p.profiled {
                    let of_it = profile.groups.iter().filter(|g| profile.is_of(g, &p));
                    Value::from(of_it.map(f).sum::<u64>())
                } else {
                    Value::Null
                }
            };
            json!({
                "pid": p.pid,
                "pid_reuse": p.pid_reuse,
                "ns_pid": p.ns_pid,
                "ppid": p.ppid,
                "command": p.command,
                "comm": p.comm(),
                "exe": p.exe,
                "start_s": p.start_s,
                "end_s": p.end_s,
                "exit": p.exit,
                "profiled": p.profiled,
                "profiled_from_s": p.profiled_from_s,
                "live_count": sum(|g| g.live_count),
                "live_bytes": sum(|g| g.live_bytes),
                "total_count": sum(|g| g.total_count),
                "total_bytes": sum(|g| g.total_bytes),
                "counters": match (&p.counters, p.profiled) {
                    (Some(c), _) => json!(c),
                    // A profile of one process, from before processes had counters.
                    (None, true) => json!(profile.counters),
                    (None, false) => Value::Null,
                },
            })
        })
        .collect()
}

/// The document's fields but `groups`.
fn top(profile: &Profile) -> Map<String, Value> {
    let c = &profile.counters;
    let doc = json!({
        "modules_without_symbols": super::modules_without_symbols(profile)
            .into_iter()
            .map(|(module, unknown, all)| json!({
                "module": module,
                "addresses_without_symbol": unknown,
                "addresses": all,
            }))
            .collect::<Vec<_>>(),
        "format": "memprof-report",
        "version": VERSION,
        "memprof_version": profile.memprof_version,
        "kernel": profile.kernel,
        "mode": profile.mode,
        "target": {
            "pid": profile.target.pid,
            "command": profile.target.command,
            "exe": profile.target.exe,
            "exit_code": profile.exit.and_then(|e| e.code),
            "exit_signal": profile.exit.and_then(|e| e.signal),
            "oom_killed": profile.exit.is_some_and(|e| e.oom_killed),
        },
        "start_unix_s": profile.start_unix_s,
        "duration_s": profile.duration_s,
        "sample_bytes": profile.sample_bytes,
        "gc_sampling": if profile.gc_sampling.is_empty() { "exact" } else { profile.gc_sampling.as_str() },
        "gc_refill_every": profile.gc_refill_every.max(1),
        "unwind": profile.unwind,
        "gc": profile.gc,
        "census": profile.census,
        "lost_events": c.lost_events(),
        "recorded": c.recorded(),
        "live_is_lower_bound": c.live_incomplete(),
        "truncated_groups": super::truncated_groups(profile),
        "folded_groups": super::folded_groups(profile),
        "loss_categories": super::LOSS_CATEGORIES
            .iter()
            .map(|(name, meaning)| (name.to_string(), Value::from(*meaning)))
            .collect::<serde_json::Map<String, Value>>(),
        "counters": c,
        "probes": profile.probes,
        "timeline": profile.timeline,
        "processes": processes(profile),
    });
    match doc {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object is an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Frame;

    #[test]
    fn groups_carry_type_and_truncation() {
        let raw = "*GC::malloc<UInt64>:Pointer(Void)";
        let mut profile = Profile {
            gc: Some(crate::profile::GcSummary {
                liveness: "address reuse only".into(),
                ..Default::default()
            }),
            ..Profile::default()
        };
        let group = Group {
            kind: "gc".into(),
            type_name: Some("Foo".into()),
            truncated: true,
            ..Group::default()
        };
        let frames = vec![
            Frame {
                function: "GC.malloc".into(),
                raw_name: raw.into(),
                address: 1,
                ..Frame::default()
            },
            Frame {
                function: "Foo.new".into(),
                raw_name: "*Foo::new:Foo".into(),
                address: 2,
                ..Frame::default()
            },
        ];
        profile.push(group, frames);
        let json = to_value(&profile, &Options::default());
        assert_eq!(json["gc"]["liveness"], "address reuse only");
        let group = &json["groups"][0];
        assert_eq!(group["type_name"], "Foo");
        assert_eq!(group["truncated"], true);
        assert_eq!(group["frames"][0]["raw_name"], "*Foo::new:Foo");
        let all = Options {
            skip_runtime: false,
            ..Options::default()
        };
        let json = to_value(&profile, &all);
        assert_eq!(json["groups"][0]["frames"][0]["raw_name"], raw);
    }
}
