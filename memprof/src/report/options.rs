//! What a report shows ([`Options`]) and which frames of a stack it shows:
//! the allocator plumbing hidden (`--skip-runtime`), `--skip`, `--depth`.
use crate::profile::{Frame, Group, Profile};

use super::{plumbing, Count};

/// What to show.
#[derive(Debug, Clone)]
pub struct Options {
    /// Leave out stacks with fewer live bytes (default: 1024 for markdown and tsv, 0 for json).
    pub min_bytes: Option<u64>,
    /// Frames shown per stack (default: 5 in tables, all in json).
    pub depth: Option<usize>,
    /// Innermost frames to skip.
    pub skip: usize,
    /// At most this many stacks.
    pub top: Option<usize>,
    /// Hide the allocator plumbing (`GC.malloc`, `__crystal_malloc64`,
    /// `Pointer(T).malloc`, C++'s `operator new` and the standard library
    /// frames it was called through, …) at the top of each stack, before `--skip`.
    pub skip_runtime: bool,
    /// Folded and flamegraph: count bytes or objects.
    pub count: Count,
    /// Folded and flamegraph: everything allocated instead of what is live.
    pub total: bool,
    /// Flamegraph: icicle graph (roots at the top).
    pub inverted: bool,
    /// The filters applied, in words (`--function make_foo; --temporary …`),
    /// for the headers of markdown, types and html; `None` when unfiltered.
    pub filters: Option<String>,
    /// Keep the profile's order of stacks (`--leaks` ranks them itself).
    pub keep_order: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_bytes: None,
            depth: None,
            skip: 0,
            top: None,
            skip_runtime: true,
            count: Count::Bytes,
            total: false,
            inverted: false,
            filters: None,
            keep_order: false,
        }
    }
}

impl Options {
    /// The frames of `group` (of `profile`) to show; `default_depth`
    /// applies when `--depth` was not given.
    pub(crate) fn frames<'a>(
        &self,
        profile: &'a Profile,
        group: &Group,
        default_depth: usize,
    ) -> impl Iterator<Item = &'a Frame> + 'a {
        let hidden = if self.skip_runtime {
            runtime_frames(profile, group)
        } else {
            0
        };
        profile
            .frames(group)
            .skip(hidden + self.skip)
            .take(self.depth.unwrap_or(default_depth))
    }
}

impl Options {
    /// The frames a table shows for `group`: [`Options::frames`] before
    /// `--depth`, with recursion folded (a run of frames of one function
    /// shown once, its innermost), then `--depth` (`default_depth` when not
    /// given). Also whether a frame was folded.
    pub(crate) fn shown<'a>(
        &self,
        profile: &'a Profile,
        group: &Group,
        default_depth: usize,
    ) -> (Vec<&'a Frame>, bool) {
        let depth = self.depth.unwrap_or(default_depth);
        let hidden = if self.skip_runtime {
            runtime_frames(profile, group)
        } else {
            0
        };
        let mut frames: Vec<&'a Frame> = Vec::new();
        let mut folded = false;
        for f in profile.frames(group).skip(hidden + self.skip) {
            if frames.last().is_some_and(|last: &&Frame| {
                last.function == f.function && !f.function.starts_with('[')
            }) {
                folded = true;
                continue;
            }
            if frames.len() == depth {
                break;
            }
            frames.push(f);
        }
        (frames, folded)
    }
}

/// How many innermost frames of `group` are allocator plumbing
/// ([`plumbing::count`]: Crystal's runtime, C++'s `operator new` and the
/// standard library's allocator templates). Only that
/// first run: plumbing deeper in a stack (a GC callback) stays. A stack of
/// nothing but plumbing (cut short) is shown whole.
fn runtime_frames(profile: &Profile, group: &Group) -> usize {
    let n = plumbing::count(profile.frames(group));
    // Nothing after the plumbing: keep it all.
    if profile.frames(group).nth(n).is_none() {
        0
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(raw: &str) -> Frame {
        Frame {
            function: crate::symbolize::display_name(raw),
            raw_name: raw.into(),
            ..Frame::default()
        }
    }

    #[test]
    fn hides_the_allocator_plumbing_before_skip_and_depth() {
        let mut p = Profile::default();
        let frames = [
            "*GC::malloc<UInt64>:Pointer(Void)",
            "__crystal_malloc64",
            "*Foo::new<Int32>:Foo",
            "*make_foos:Array(Foo)",
            "__crystal_main",
        ]
        .map(named)
        .to_vec();
        p.push(Group::default(), frames);
        // Nothing but plumbing: shown as it is rather than as no stack.
        p.push(Group::default(), vec![named("__crystal_malloc64")]);
        let (group, cut) = (&p.groups[0], &p.groups[1]);
        let shown = |options: &Options| -> Vec<String> {
            options
                .frames(&p, group, usize::MAX)
                .map(|f| f.function.clone())
                .collect()
        };
        assert_eq!(
            shown(&Options::default()),
            ["Foo.new", "make_foos", "__crystal_main"]
        );
        let options = Options {
            skip: 1,
            depth: Some(1),
            ..Options::default()
        };
        assert_eq!(shown(&options), ["make_foos"]);
        let options = Options {
            skip_runtime: false,
            ..Options::default()
        };
        assert_eq!(shown(&options)[..2], ["GC.malloc", "__crystal_malloc64"]);
        assert_eq!(Options::default().frames(&p, cut, 5).count(), 1);
    }
}
