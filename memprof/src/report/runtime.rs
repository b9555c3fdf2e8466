//! Allocations the language runtime makes for itself, not for the program:
//! Crystal's fiber stacks (8 MiB each, one per fiber, from
//! `Fiber::StackPool#checkout`) and the Boehm collector's own heap
//! sections (`mmap`/`malloc` calls made inside libgc, e.g. from `GC_init`);
//! and what shared libraries allocate in their initializers before `main`
//! (libstdc++'s 72 KiB emergency exception pool).
//! Tables name them for what they are and list them after the program's
//! rows, so the first rows are the user's.
use crate::profile::{Frame, Group, Profile};

/// What a runtime allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A fiber's stack (Crystal).
    FiberStack,
    /// A heap section of the Boehm collector, or its own bookkeeping.
    GcHeap,
    /// Made by a shared library's initializer before `main` (libstdc++'s
    /// emergency exception pool, …), from the dynamic linker's `_dl_init`.
    LibraryInit,
}

impl Role {
    /// The words a table shows for the row.
    pub fn label(self) -> &'static str {
        match self {
            Role::FiberStack => "fiber stack",
            Role::GcHeap => "GC heap section (the collector's own)",
            Role::LibraryInit => "library initializer (before main)",
        }
    }

    /// The name in JSON (`runtime`).
    pub fn name(self) -> &'static str {
        match self {
            Role::FiberStack => "fiber_stack",
            Role::GcHeap => "gc_heap",
            Role::LibraryInit => "library_init",
        }
    }
}

/// Frames looked at: the allocator plumbing and a few frames above it.
const LOOK: usize = 6;

/// The runtime role of `group`'s allocations, if they are the runtime's.
pub fn role(profile: &Profile, group: &Group) -> Option<Role> {
    let mut frames = profile.frames(group).take(LOOK).peekable();
    let innermost = frames.peek().copied()?;
    // libc and mmap blocks allocated by the collector itself: its heap.
    if matches!(group.kind.as_str(), "libc" | "mmap") && in_libgc(innermost) {
        return Some(Role::GcHeap);
    }
    if frames.any(is_fiber_stack) {
        return Some(Role::FiberStack);
    }
    // The dynamic linker running a library's constructors: the stack ends
    // in `_dl_init` (a few frames of the library above it).
    let from_dl_init = profile
        .frames(group)
        .take(INIT_LOOK)
        .any(|f| f.raw_name == "_dl_init" || f.function == "_dl_init");
    (from_dl_init && innermost.module != profile.target.exe).then_some(Role::LibraryInit)
}

/// Frames looked at for `_dl_init`: a library's constructor and what it calls.
const INIT_LOOK: usize = 16;

/// A frame of libgc: its module (shared) or a `GC_` function (linked in).
fn in_libgc(frame: &Frame) -> bool {
    let module = crate::allocators::short(std::path::Path::new(&frame.module));
    module.starts_with("libgc.")
        || module.starts_with("libgc-")
        || frame.raw_name.starts_with("GC_")
}

/// Crystal's fiber stack allocation: `Fiber::StackPool#checkout` and
/// `Crystal::System::Fiber.allocate_stack` (inlined in release builds:
/// DWARF's short `allocate_stack` in `system/*/fiber.cr`).
fn is_fiber_stack(frame: &Frame) -> bool {
    let raw = frame.raw_name.as_str();
    raw.starts_with("*Fiber::StackPool#checkout")
        || raw.starts_with("*Crystal::System::Fiber::allocate_stack")
        || raw == "allocate_stack"
            && frame
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("/fiber.cr"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collectors_heap_sections() {
        let mut profile = Profile::default();
        let f = |raw: &str, module: &str| Frame {
            raw_name: raw.into(),
            module: module.into(),
            ..Default::default()
        };
        let libgc = "/usr/lib/x86_64-linux-gnu/libgc.so.1.5.1";
        profile.push(
            Group {
                kind: "mmap".into(),
                ..Default::default()
            },
            vec![f("", libgc), f("GC_init", libgc)],
        );
        assert_eq!(role(&profile, &profile.groups[0]), Some(Role::GcHeap));
    }

    #[test]
    fn fiber_stacks_in_release_and_debug_builds() {
        let frame = |raw: &str, file: Option<&str>| Frame {
            raw_name: raw.into(),
            file: file.map(str::to_string),
            module: "/tmp/app".into(),
            ..Frame::default()
        };
        let mut profile = Profile::default();
        let mmap = Group {
            kind: "mmap".into(),
            ..Group::default()
        };
        profile.push(
            mmap.clone(),
            vec![
                frame(
                    "allocate_stack",
                    Some("/usr/lib/crystal/lib/crystal/system/unix/fiber.cr"),
                ),
                frame(
                    "*Fiber::StackPool#checkout:Tuple(Pointer(Void), Pointer(Void))",
                    None,
                ),
            ],
        );
        profile.push(
            mmap,
            vec![frame("*make_foos:Array(Foo)", Some("/tmp/app.cr"))],
        );
        assert_eq!(role(&profile, &profile.groups[0]), Some(Role::FiberStack));
        assert_eq!(role(&profile, &profile.groups[1]), None);
    }
}
