//! What the kernel tells of the processes (new, exec'ed, exited, killed
//! by the OOM killer, a library loaded), read in real time.
use super::*;

impl Host {
    /// The events read (waiting up to `wait` for the first), then the
    /// files they named.
    pub(super) fn read_events(&mut self, wait: Duration) {
        if let Ok(seen) = self.events.seen.recv_timeout(wait) {
            self.on_event(seen);
        }
        while let Ok(seen) = self.events.seen.try_recv() {
            self.on_event(seen);
        }
        while let Ok(stack) = self.events.deferred.try_recv() {
            self.deferred.add(stack);
        }
        let mut pids = std::mem::take(&mut self.to_examine);
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            self.files.examine_pid(&mut self.probes, pid);
        }
    }

    pub(super) fn on_event(
        &mut self,
        Seen {
            event: e,
            read,
            refused,
        }: Seen,
    ) {
        let index_known = e.index < host::SESSION;
        match e.op {
            host::NEW if self.left_out.contains(&e.tgid) => {
                if let Err(err) = self.drop_indexes(HashSet::from([e.index])) {
                    let line = format!("pid {}: its tables stay: {err:#}", e.tgid);
                    self.notes.note(Kind::TablesStay, line);
                }
            }
            host::NEW => {
                let start_s = self.since(e.time_ns);
                // Running before memprof: from then on (as `attach`).
                let start_s = if self.initial.contains(&e.tgid) {
                    0.0
                } else {
                    start_s
                };
                let told = Told {
                    comm: comm_of(&e.comm),
                    command: command_of(&e),
                    cut: e.args_len as usize > host::ARGS_BYTES,
                    exe: crate::text::lossy_path(&path_of_components(&e.path)),
                };
                let mut process = HostProcess::seen(e.tgid, e.index, e.ppid, start_s, read, told);
                process.forked = e.exit_code == host::FORKED;
                process.refused = refused;
                process.seq = self.seen;
                self.processes.insert(e.index, process);
                self.seen += 1;
                self.publish(e.index);
            }
            host::LIBRARIES => {
                self.loads += 1;
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.refused |= refused;
                    if let Some(read) = read {
                        p.take(read);
                    }
                    self.publish(e.index);
                } else {
                    self.to_examine.push(e.tgid);
                }
            }
            host::MAPPING => {
                let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) else {
                    return;
                };
                let m = e.mapping;
                // Told again at each of its library loads: taken once.
                let told = |k: &Mapping| {
                    (k.start, k.end, k.file_offset) == (m.start, m.end, m.pgoff << 12)
                        && k.file_id == file_ids::file_id_of(&m.file)
                };
                if p.maps.all().iter().any(told) {
                    return;
                }
                let mut mapping = Mapping {
                    start: m.start,
                    end: m.end,
                    file_offset: m.pgoff << 12,
                    executable: true,
                    path: path_of_components(&e.path),
                    file_id: file_ids::file_id_of(&m.file),
                };
                // A file not seen yet is opened by the path the kernel
                // gave (the process may be gone already).
                let refused = self.files.refused;
                let opened = self.files.open_named(&mapping);
                p.refused |= self.files.refused > refused;
                match opened {
                    Some(module) => {
                        mapping.path = module.path().to_path_buf();
                        p.mapped(mapping, module);
                    }
                    // Told again at each of its library loads: kept once.
                    None if p.unknown.contains(&mapping) => {}
                    None => p.unknown.push(mapping),
                }
            }
            host::PROGRAM => {
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.program(&text_of(&e.path));
                }
            }
            host::OOM => {
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.oom_killed = true;
                }
                // A process left out to a session: the session's end
                // asks ([`Host::oom_killed`]).
                self.oom_killed.push_back(e.tgid);
                if self.oom_killed.len() > OOM_KEPT {
                    self.oom_killed.pop_front();
                }
                let line = format!(
                    "pid {} ({}) was ended by the OOM killer",
                    e.tgid,
                    comm_of(&e.comm)
                );
                self.notes.note(Kind::OomKilled, line);
            }
            host::EXIT if matches!(e.index, host::UNSELECTED | host::SESSION) => {
                // Left out: a session's process, or one not selected.
                let exit = ExitInfo {
                    oom_killed: self.oom_killed.contains(&e.tgid),
                    ..wait_status(e.exit_code)
                };
                self.exits.push_back((e.tgid, exit));
                if self.exits.len() > EXITS_KEPT {
                    self.exits.pop_front();
                }
            }
            host::EXEC | host::EXIT => {
                let end_s = self.since(e.time_ns);
                if let Some(p) = self.processes.get_mut(&e.index).filter(|_| index_known) {
                    p.end_s = Some(end_s);
                    if e.op == host::EXIT {
                        p.exit = Some(ExitInfo {
                            oom_killed: p.oom_killed,
                            ..wait_status(e.exit_code)
                        });
                    } else {
                        p.execed = true;
                    }
                    self.ended.push(e.index);
                }
                if e.op == host::EXEC {
                    self.initial.remove(&e.tgid);
                }
            }
            _ => {}
        }
    }
}
