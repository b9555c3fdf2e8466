//! `/metrics`: Prometheus's text exposition format (version 0.0.4, as
//! documented at <https://prometheus.io/docs/instrumenting/exposition_formats/>):
//! each family's `# HELP` and `# TYPE`, then its samples, label values
//! escaped (`\`, `"`, newline).
//!
//! Labels are bounded: the [`Machine::top`] processes by live bytes have
//! their own (`pid`, `comm`, `exe`); the others are summed into one series
//! with `pid="other"` (its counters can go down as processes move in and
//! out of the top).
use std::fmt::Write;

use memprof_common::AllocKind;

use crate::driver::Figures;
use crate::profile::Counters;
use crate::report::LOSS_CATEGORIES;

/// What `/metrics` says of the machine.
pub struct Machine<'a> {
    /// Every process followed now.
    pub figures: &'a [Figures],
    /// The machine's losses.
    pub counters: &'a Counters,
    /// Processes that ended whose profiles are kept.
    pub ended_kept: usize,
    /// Processes with labels of their own.
    pub top: usize,
    /// `--dir`: its snapshots.
    pub dir: Option<super::dir::DirCounts>,
    /// Files held parsed, and files with unwind rows in the kernel's table.
    pub files: (usize, usize),
    /// The processes with allocator probes of their own.
    pub escalations: &'a super::escalate::Escalations,
}

/// The whole exposition.
pub fn render(machine: &Machine<'_>) -> String {
    let mut ranked: Vec<&Figures> = machine.figures.iter().collect();
    ranked.sort_by_key(|f| (std::cmp::Reverse(live_bytes(f)), f.pid));
    let shown = ranked.len().min(machine.top);
    let mut series: Vec<(Labels, Figures)> = ranked[..shown]
        .iter()
        .map(|f| (Labels::of(f), (*f).clone()))
        .collect();
    if ranked.len() > shown {
        let mut other = Figures::default();
        for f in &ranked[shown..] {
            for (sum, k) in other.live.iter_mut().zip(f.live) {
                sum[0] += k[0];
                sum[1] += k[1];
            }
            other.allocations += f.allocations;
        }
        let labels = Labels {
            pid: "other".to_string(),
            comm: String::new(),
            exe: String::new(),
        };
        series.push((labels, other));
    }

    let mut out = String::new();
    family(
        &mut out,
        "memprof_process_live_bytes",
        "gauge",
        "Bytes live now per process and kind: libc, mmap, gc, gc_atomic (allocations, followed at their calls: --calls, and the Boehm GC sessions) and rss (resident pages, counted at the stack of their first write: the agent's default); estimated when sampled.",
    );
    for (labels, f) in &series {
        for kind in AllocKind::ALL {
            let value = f.live[kind as usize][1];
            sample(
                &mut out,
                "memprof_process_live_bytes",
                labels,
                Some(kind),
                value,
            );
        }
    }
    family(
        &mut out,
        "memprof_process_live_blocks",
        "gauge",
        "Blocks (objects) live now per process and kind; estimated when sampled.",
    );
    for (labels, f) in &series {
        for kind in AllocKind::ALL {
            let value = f.live[kind as usize][0];
            sample(
                &mut out,
                "memprof_process_live_blocks",
                labels,
                Some(kind),
                value,
            );
        }
    }
    family(
        &mut out,
        "memprof_process_allocations_total",
        "counter",
        "Allocations followed since the agent started following the process; estimated when sampled.",
    );
    for (labels, f) in &series {
        sample(
            &mut out,
            "memprof_process_allocations_total",
            labels,
            None,
            f.allocations,
        );
    }
    family(
        &mut out,
        "memprof_process_gc_collections_total",
        "counter",
        "Boehm GC collections seen (programs with a session of their own).",
    );
    for (labels, f) in &series {
        if let Some(n) = f.collections {
            sample(
                &mut out,
                "memprof_process_gc_collections_total",
                labels,
                None,
                n,
            );
        }
    }
    family(
        &mut out,
        "memprof_process_gc_heap_bytes",
        "gauge",
        "The Boehm collector's heap size, where readable.",
    );
    for (labels, f) in &series {
        if let Some(n) = f.gc_heap_bytes {
            sample(&mut out, "memprof_process_gc_heap_bytes", labels, None, n);
        }
    }
    family(
        &mut out,
        "memprof_processes",
        "gauge",
        "Processes followed now (state=running) and ended processes whose profiles are kept (state=ended).",
    );
    let _ = writeln!(
        out,
        "memprof_processes{{state=\"running\"}} {}",
        machine.figures.len()
    );
    let _ = writeln!(
        out,
        "memprof_processes{{state=\"ended\"}} {}",
        machine.ended_kept
    );
    family(
        &mut out,
        "memprof_processes_unlabelled",
        "gauge",
        "Processes summed into the pid=\"other\" series (beyond --metrics-top).",
    );
    let _ = writeln!(out, "memprof_processes_unlabelled {}", ranked.len() - shown);
    family(
        &mut out,
        "memprof_lost_events_total",
        "counter",
        "Allocation calls not fully recorded, machine-wide, per loss category (each counted once).",
    );
    let counters = serde_json::to_value(machine.counters).unwrap_or_default();
    // The disjoint categories `Counters::lost_events` sums.
    let categories = LOSS_CATEGORIES
        .iter()
        .map(|(name, _)| *name)
        .chain(["processes_not_followed", "short_of_resources"]);
    for category in categories {
        let n = counters.get(category).and_then(|v| v.as_u64()).unwrap_or(0);
        let _ = writeln!(
            out,
            "memprof_lost_events_total{{category=\"{}\"}} {n}",
            escape(category)
        );
    }
    family(
        &mut out,
        "memprof_processes_evicted_total",
        "counter",
        "Ended processes whose profiles were let go to keep the agent's memory bounded (the oldest first).",
    );
    let evicted = machine.counters.processes_evicted;
    let _ = writeln!(out, "memprof_processes_evicted_total {evicted}");
    family(
        &mut out,
        "memprof_names_left_mangled_total",
        "counter",
        "Frames whose C++ or Rust name was left mangled, its demangled form over the budget (processes that ended).",
    );
    let _ = writeln!(
        out,
        "memprof_names_left_mangled_total {}",
        machine.counters.names_left_mangled
    );
    family(
        &mut out,
        "memprof_frames_unnamed_total",
        "counter",
        "Frames left as module+offset, naming out of its time or memory budget (processes that ended).",
    );
    let _ = writeln!(
        out,
        "memprof_frames_unnamed_total {}",
        machine.counters.frames_unnamed
    );
    family(
        &mut out,
        "memprof_gc_sessions_missed_total",
        "counter",
        "Boehm GC programs that ended before their session attached (their GC objects not seen).",
    );
    let _ = writeln!(
        out,
        "memprof_gc_sessions_missed_total {}",
        machine.counters.gc_sessions_missed
    );
    family(
        &mut out,
        "memprof_process_calls_probed",
        "gauge",
        "Processes whose allocator functions are probed now, for them alone (their libc and mmap figures exact, or sampled by --sample-bytes): why=named (--examine) or why=growth (their resident memory grew by --escalate, for --escalate-for).",
    );
    for (pid, why) in machine.escalations.probed() {
        let comm = machine
            .figures
            .iter()
            .find(|f| f.pid == pid)
            .map_or(String::new(), |f| f.program.clone());
        let _ = writeln!(
            out,
            "memprof_process_calls_probed{{pid=\"{pid}\",comm=\"{}\",why=\"{why}\"}} 1",
            escape(&comm)
        );
    }
    family(
        &mut out,
        "memprof_escalations_total",
        "counter",
        "Processes given allocator probes of their own since the agent started (named or grown).",
    );
    let _ = writeln!(
        out,
        "memprof_escalations_total {}",
        machine.escalations.started
    );
    family(
        &mut out,
        "memprof_files",
        "gauge",
        "Files of the processes followed the agent holds: parsed (symbols, sections), and with unwind rows in the kernel's table; the parse let go once no process followed maps the file, its rows kept for the next process that does (10 minutes at most, or until their room is wanted).",
    );
    let (parsed, rows) = machine.files;
    let _ = writeln!(out, "memprof_files{{state=\"parsed\"}} {parsed}");
    let _ = writeln!(out, "memprof_files{{state=\"unwind_rows\"}} {rows}");
    if let Some(dir) = machine.dir {
        for (name, kind, help, value) in [
            (
                "memprof_dir_snapshots",
                "gauge",
                "Snapshot files in --dir now.",
                dir.files,
            ),
            (
                "memprof_dir_bytes",
                "gauge",
                "Bytes of the snapshot files in --dir now (kept within --dir-budget).",
                dir.bytes,
            ),
            (
                "memprof_dir_snapshots_written_total",
                "counter",
                "Snapshots written to --dir.",
                dir.written,
            ),
            (
                "memprof_dir_snapshots_deleted_total",
                "counter",
                "Snapshots deleted from --dir to keep it within --dir-budget (the oldest first).",
                dir.deleted,
            ),
            (
                "memprof_dir_snapshot_failures_total",
                "counter",
                "Snapshots that could not be written to --dir.",
                dir.failed,
            ),
            (
                "memprof_dir_snapshots_unreadable",
                "gauge",
                "Files in --dir that could not be read at the start (skipped).",
                dir.unreadable,
            ),
        ] {
            family(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
    }
    out
}

fn live_bytes(f: &Figures) -> u64 {
    f.live.iter().map(|k| k[1]).sum()
}

/// A process's labels, escaped once.
struct Labels {
    pid: String,
    comm: String,
    exe: String,
}

impl Labels {
    fn of(f: &Figures) -> Labels {
        Labels {
            pid: f.pid.to_string(),
            comm: escape(&f.program),
            exe: escape(&f.exe),
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP {name} {}",
        help.replace('\\', "\\\\").replace('\n', "\\n")
    );
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, l: &Labels, kind: Option<AllocKind>, value: u64) {
    let _ = write!(
        out,
        "{name}{{pid=\"{}\",comm=\"{}\",exe=\"{}\"",
        l.pid, l.comm, l.exe
    );
    if let Some(kind) = kind {
        let _ = write!(out, ",kind=\"{}\"", kind.name());
    }
    let _ = writeln!(out, "}} {value}");
}

/// A label value as the text format wants it.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, program: &str, libc_bytes: u64) -> Figures {
        let mut f = Figures {
            pid,
            program: program.to_string(),
            exe: format!("/usr/bin/{program}"),
            allocations: 10,
            ..Figures::default()
        };
        f.live[AllocKind::Libc as usize] = [2, libc_bytes];
        f
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn beyond_the_top_processes_are_summed() {
        let figures = [
            process(1, "small", 100),
            process(2, "big", 5000),
            process(3, "mid", 700),
        ];
        let text = render(&Machine {
            figures: &figures,
            counters: &Counters::default(),
            ended_kept: 4,
            top: 1,
            dir: None,
            files: (0, 0),
            escalations: &super::super::escalate::Escalations::new(Default::default()),
        });
        assert!(text.contains(
            "memprof_process_live_bytes{pid=\"2\",comm=\"big\",exe=\"/usr/bin/big\",kind=\"libc\"} 5000\n"
        ));
        assert!(text.contains(
            "memprof_process_live_bytes{pid=\"other\",comm=\"\",exe=\"\",kind=\"libc\"} 800\n"
        ));
        assert!(text
            .contains("memprof_process_allocations_total{pid=\"other\",comm=\"\",exe=\"\"} 20\n"));
        assert!(text.contains("memprof_processes{state=\"running\"} 3\n"));
        assert!(text.contains("memprof_processes{state=\"ended\"} 4\n"));
        assert!(text.contains("memprof_processes_unlabelled 2\n"));
        assert!(!text.contains("comm=\"small\""));
    }
}
