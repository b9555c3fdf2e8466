//! Text the writers share: frame names, numbers with thousands
//! separators, the lines saying what was lost or is missing.
use crate::profile::{Frame, Profile};

/// `file:line in 'name'`, the frame text of perf-tools' MemProf; the
/// target's names with their control characters shown ([`crate::text`]).
pub fn frame_text(frame: &Frame) -> String {
    let place = match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("{}:{line}", display_path(file)),
        (Some(file), None) => display_path(file),
        // No source line: the module and the offset in its file (stable
        // across runs, unlike the address).
        _ => format!(
            "{}+{:#x}",
            crate::allocators::short(std::path::Path::new(&frame.module)),
            frame.offset.unwrap_or(frame.address)
        ),
    };
    crate::text::visible(&format!("{place} in '{}'", frame.function)).into_owned()
}

/// Source paths relative to the current directory when under it.
fn display_path(path: &str) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            std::path::Path::new(path)
                .strip_prefix(&cwd)
                .ok()
                .map(|p| p.display().to_string())
        })
        .unwrap_or_else(|| path.to_string())
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What each loss category means, for the markdown header and the JSON
/// report (`loss_categories`). The categories are disjoint: each allocation
/// call is counted in at most one of them.
pub const LOSS_CATEGORIES: [(&str, &str); 5] = [
    (
        "live_map_full",
        "allocations in their stack's totals but not tracked as live (live table full, --max-live)",
    ),
    (
        "sites_map_full",
        "allocations tracked as live but missing from their stack's totals (site table full, --max-sites)",
    ),
    (
        "both_maps_full",
        "allocations in neither table (both full): only counted as seen",
    ),
    (
        "pending_full",
        "allocation calls not followed to their return (in-flight table full): not counted as seen",
    ),
    (
        "stale_calls",
        "allocation calls whose return was missed: not counted as seen",
    ),
];

/// One line naming what was lost, for report headers: the disjoint loss
/// categories (their sum is the lost events), then what else was missed.
pub fn loss_summary(profile: &Profile) -> String {
    format!(
        "lost events: {}; {}",
        lost_events(profile),
        other_losses(profile)
    )
}

/// The lost events and their categories: `0 (each counted once: …)`.
pub fn lost_events(profile: &Profile) -> String {
    let c = &profile.counters;
    format!(
        "{} (each counted once: not tracked as live, live table full: {}; missing from the stack totals, site table full: {}; in neither table: {}; calls not followed, in-flight table full: {}; returns missed: {}{}{}{})",
        thousands(c.lost_events()),
        thousands(c.live_map_full),
        thousands(c.sites_map_full),
        thousands(c.both_maps_full),
        thousands(c.pending_full),
        thousands(c.stale_calls),
        // `attach --all` only.
        match c.processes_not_followed {
            0 => String::new(),
            n => format!("; calls of processes not followed, process table full: {}", thousands(n)),
        },
        match c.short_of_resources {
            0 => String::new(),
            n => format!("; calls of processes memprof was short of descriptors or memory to read (frames may be unnamed): {}", thousands(n)),
        },
        match c.rss_pages_untracked {
            0 => String::new(),
            n => format!("; resident pages sampled, table of sampled ranges full: {}", thousands(n)),
        },
    )
}

/// What else was missed, after the lost events: stacks not captured,
/// frees of unknown blocks, truncated and folded stacks, coarser
/// attribution.
pub fn other_losses(profile: &Profile) -> String {
    let c = &profile.counters;
    let mut line = format!(
        "stacks not captured: {}; frees of unknown blocks: {}",
        thousands(c.stack_errors),
        thousands(c.unknown_frees)
    );
    let truncated = truncated_groups(profile);
    if c.truncated_stacks > 0 || truncated > 0 {
        line += &format!(
            "; allocations with a truncated stack: {} (stacks marked truncated: {}, incl. those not captured)",
            thousands(c.truncated_stacks),
            thousands(truncated)
        );
    }
    if c.names_left_mangled > 0 {
        line += &format!(
            "; names left mangled (their demangled form over its budget, shown cut): {}",
            thousands(c.names_left_mangled)
        );
    }
    if c.frames_unnamed > 0 {
        line += &format!(
            "; frames left unnamed (module+offset: naming stopped or out of time or memory): {}",
            thousands(c.frames_unnamed)
        );
    }
    if c.processes_evicted > 0 {
        line += &format!(
            "; ended processes let go to keep memory bounded (the oldest first): {}, with their allocations: {}",
            thousands(c.processes_evicted),
            thousands(c.evicted_allocs)
        );
    }
    if c.calls_live_let_go > 0 {
        line += &format!(
            "; blocks still live when the process's own allocator probes came off, let go (their frees are not seen after): {} ({} bytes)",
            thousands(c.calls_live_let_go),
            thousands(c.calls_live_let_go_bytes)
        );
    }
    if c.gc_sessions_missed > 0 {
        line += &format!(
            "; Boehm GC programs that ended before their session attached (their GC objects not seen): {}",
            thousands(c.gc_sessions_missed)
        );
    }
    if c.tables_from_proc > 0 {
        line += &format!(
            "; processes whose first stacks waited for /proc (kernel has no task-VMA iterator): {}",
            thousands(c.tables_from_proc)
        );
    }
    if c.stacks_not_finished > 0 {
        line += &format!(
            "; stacks cut at a file not read in time and not finished (no room for their copy): {}",
            thousands(c.stacks_not_finished)
        );
    }
    if c.rss_releases_cut > 0 {
        line += &format!(
            "; ranges given back too big to look through (their sampled pages may still count as resident): {}",
            thousands(c.rss_releases_cut)
        );
    }
    let folded = folded_groups(profile);
    if c.folded_stacks > 0 || folded > 0 {
        line += &format!(
            "; allocations with recursion folded (repeated frames shown once): {} (stacks marked folded: {})",
            thousands(c.folded_stacks),
            thousands(folded)
        );
    }
    // Coarser attribution, not losses: said only when it happened.
    let coarser = [
        (
            c.stacks_shortened,
            "allocations under their innermost 8 frames (stack table full, --max-stacks)",
        ),
        (
            c.stacks_degraded,
            "allocations under their caller alone (stack tables full, --max-stacks)",
        ),
        (
            c.sites_overflowed,
            "allocations in their kind's overflow group (site table full, --max-sites, or no kernel memory for a new entry)",
        ),
    ];
    for (count, what) in coarser {
        if count > 0 {
            line += &format!("; {what}: {}", thousands(count));
        }
    }
    line
}

/// Modules with return addresses no symbol covers: (module path,
/// addresses without a symbol, addresses in the module), most first. Their
/// frames read `module+offset` (stable across runs, so profiles still diff).
pub fn modules_without_symbols(profile: &Profile) -> Vec<(String, u64, u64)> {
    let mut per_module: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for location in profile.stacks.locations() {
        // The outermost frame of a location is the symbol's (or `[unknown]`).
        let Some(frame) = location.frames.last() else {
            continue;
        };
        if frame.module.is_empty() || frame.module == "[unknown]" {
            continue;
        }
        let entry = per_module.entry(frame.module.as_str()).or_default();
        entry.1 += 1;
        if frame.raw_name.is_empty() {
            entry.0 += 1;
        }
    }
    let mut out: Vec<(String, u64, u64)> = per_module
        .into_iter()
        .filter(|(_, (unknown, _))| *unknown > 0)
        .map(|(m, (unknown, all))| (m.to_string(), unknown, all))
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// One line per module without symbols for some of its addresses, saying
/// what is missing and how to get it.
pub fn symbol_notes(profile: &Profile) -> Vec<String> {
    modules_without_symbols(profile)
        .into_iter()
        .map(|(module, unknown, all)| {
            let name = crate::allocators::short(std::path::Path::new(&module));
            let what = if unknown == all {
                "no symbols at all (stripped)".to_string()
            } else {
                format!(
                    "no symbol for {} of its {} addresses (functions missing from its symbol table)",
                    thousands(unknown),
                    thousands(all)
                )
            };
            format!(
                "{name}: {what}; its frames read {name}+0xOFFSET. For names, install its separate debug info (looked up through .gnu_debuglink and /usr/lib/debug/.build-id/, as Debian's -dbgsym packages install it) or profile a build that keeps its symbols ({module})."
            )
        })
        .collect()
}

/// Groups whose stack had repeated frames of recursive functions folded
/// into one.
pub fn folded_groups(profile: &Profile) -> u64 {
    profile.groups.iter().filter(|g| g.folded).count() as u64
}

/// What markdown and html add below a stack whose recursion was folded.
pub const FOLDED_NOTE: &str = "…(recursion folded)";
/// The frame folded and flamegraph add above the innermost frame of such a
/// stack, and the `stack` label of its pprof sample.
pub const FOLDED_FRAME: &str = "[recursion folded]";
/// The root frame folded, flamegraph (and html's) and pprof put below the
/// outermost frame of a stack the unwinder could not follow to its end, so
/// a cut stack never reads as if its last frame were the program's entry.
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Groups whose stack is marked truncated (cut short by the unwinder, or
/// not captured at all): counted per stack, where `truncated_stacks`
/// counts allocation calls.
pub fn truncated_groups(profile: &Profile) -> u64 {
    profile.groups.iter().filter(|g| g.truncated).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(28800), "28,800");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
