//! One profile for a command and the processes `run` followed: each
//! followed process (one that `exec`ed a program) has a session and a
//! profile of its own; the command's profile takes them in: their groups,
//! each with its pid, their stacks (interned again), their counters (the
//! profile's are the sum; each process keeps its own), and their processes.
//!
//! The GC summary, census and timeline stay the command's.
use super::{Frame, Profile};

/// Makes `followed` part of `profile` (the command's).
pub fn merge(profile: &mut Profile, followed: Vec<Profile>) {
    if followed.is_empty() {
        return;
    }
    if profile.processes.is_empty() {
        profile.processes = profile.processes();
    }
    for other in followed {
        // Its times count from its own start.
        let shift = other.start_unix_s - profile.start_unix_s;
        // Its processes whose pid an earlier one had: which one of that
        // pid each is.
        let mut reused: Vec<(u32, u32)> = Vec::new();
        for (i, mut p) in other.processes().into_iter().enumerate() {
            p.start_s += shift;
            p.end_s = p.end_s.map(|e| e + shift);
            if i == 0 && p.counters.is_none() {
                p.counters = Some(other.counters.clone());
            }
            let latest = profile.processes.iter_mut().rfind(|q| q.pid == p.pid);
            // The kernel gave the pid of a process that exited to this
            // one, started after: another process.
            let latest = match latest {
                Some(q) if q.exit.is_some() && q.end_s.is_some_and(|end| end <= p.start_s) => {
                    p.pid_reuse = q.pid_reuse + 1;
                    reused.push((p.pid, p.pid_reuse));
                    None
                }
                latest => latest,
            };
            match latest {
                // The followed process itself, listed since its fork: its
                // start and parent stay, the rest is its session's.
                Some(q) if i == 0 => {
                    q.profiled = true;
                    // Attached to a running worker: from then on only.
                    if other.mode == "attach" {
                        q.profiled_from_s = Some(p.start_s);
                    }
                    q.ns_pid = q.ns_pid.or(p.ns_pid);
                    // Its program before an `exec` (a shell's fork that
                    // ran `true`): the row names the program it became,
                    // as the tracer read it at the `exec`.
                    let execed = p.end_s.is_some() && p.exit.is_none();
                    if !execed || q.command.is_empty() {
                        q.command = p.command;
                        q.exe = p.exe;
                        q.end_s = p.end_s;
                        q.exit = p.exit;
                    }
                    // A process followed before and after an `exec`
                    // has a profile for each program: both count.
                    q.counters = match (q.counters.take(), p.counters) {
                        (Some(mut before), Some(after)) => {
                            before.add(&after);
                            Some(before)
                        }
                        (before, after) => after.or(before),
                    };
                }
                Some(_) => {}
                None => profile.processes.push(p),
            }
        }
        profile.counters.add(&other.counters);
        for mut group in other.groups {
            let pid = match group.pid {
                0 => other.target.pid,
                pid => pid,
            };
            if let Some(&(_, again)) = reused.iter().find(|(p, _)| *p == pid) {
                group.pid_reuse = again;
            }
            let frames: Vec<Frame> = other.stacks.frames(group.stack).cloned().collect();
            profile.push(group, frames);
        }
    }
    // The command first, then in the order they started.
    let command = profile.target.pid;
    profile.processes.sort_by(|a, b| {
        (a.pid != command)
            .cmp(&(b.pid != command))
            .then(a.start_s.total_cmp(&b.start_s))
    });
}
