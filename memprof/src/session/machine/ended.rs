//! The processes that ended: their tables out of the kernel's, their
//! profiles made and merged, the oldest let go; and the end of `attach
//! --all`.
use super::*;

impl Host {
    /// Finalizes the processes that ended: their tables out of the
    /// kernel's, their profiles made.
    pub(super) fn finalize_ended(&mut self) -> Result<()> {
        if self.ended.is_empty() {
            return Ok(());
        }
        // Events of the last moment first (a `free` racing the exit is
        // already in the tables: the probes ran before the exit).
        self.read_events(Duration::ZERO);
        let indexes: HashSet<u32> = std::mem::take(&mut self.ended).into_iter().collect();
        self.finalize(&indexes)
    }

    /// Process `pid` is followed elsewhere from now on (a session of its
    /// own): not here any more, and what was recorded of it here is
    /// dropped (its session's profile says from when it is profiled).
    pub(super) fn leave_out(&mut self, pid: u32) -> Result<()> {
        self.probes.leave_out(pid, host::SESSION)?;
        self.left_out.insert(pid);
        let indexes: HashSet<u32> = self
            .processes
            .values()
            .filter(|p| p.pid == pid)
            .map(|p| p.index)
            .collect();
        self.drop_indexes(indexes)
    }

    /// Processes `indexes` are not profiled here: their tables are taken
    /// out of the kernel's and dropped.
    pub(super) fn drop_indexes(&mut self, indexes: HashSet<u32>) -> Result<()> {
        self.probes.take_ended(&indexes)?;
        self.probes.free_indexes(&indexes)?;
        for index in indexes {
            self.processes.remove(&index);
            self.tables
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(index);
            self.deferred.forget(index);
        }
        Ok(())
    }

    pub(super) fn finalize(&mut self, indexes: &HashSet<u32>) -> Result<()> {
        let mut taken = self.probes.take_ended(indexes)?;
        // Children before their parents: a forked child gone before it
        // was read is symbolized with its parent's mappings.
        let parents: HashSet<u32> = indexes
            .iter()
            .filter_map(|i| self.processes.get(i))
            .map(|p| p.ppid)
            .collect();
        let mut order: Vec<u32> = indexes.iter().copied().collect();
        order.sort_by_key(|i| {
            self.processes
                .get(i)
                .is_some_and(|p| parents.contains(&p.pid))
        });
        for index in &order {
            let Some(mut p) = self.processes.remove(index) else {
                continue;
            };
            self.tables
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(p.index);
            let tables = taken.remove(index).unwrap_or_default();
            // Given an index at its `exec`, it never allocated (or no
            // allocation was sampled): not a process of the profile.
            if tables.sites.is_empty() {
                self.deferred.forget(p.index);
                continue;
            }
            let orphan = !self
                .processes
                .values()
                .any(|q| q.pid == p.ppid && !q.unread);
            if p.unread && orphan {
                let line = format!(
                    "pid {} ({}) ended before memprof could read its mappings: its frames are addresses",
                    p.pid,
                    p.name()
                );
                self.notes.note(Kind::Unread, line);
            }
            // What blazesym read of the files serves the next processes,
            // renewed now and then (it keeps every file it read). Counted
            // at the ends, not the snapshots: a scrape of 500 processes
            // would renew it, and read every file again, at each scrape.
            self.symbolized += 1;
            if self.symbolized.is_multiple_of(SYMBOLS_RENEWED_EVERY) {
                self.symbols = Symbols(None);
            }
            match self.profile_of(&mut p, tables) {
                Ok(profile) => {
                    self.short_of_resources += profile.counters.short_of_resources;
                    self.name_losses.left_mangled += profile.counters.names_left_mangled;
                    self.name_losses.unnamed += profile.counters.frames_unnamed;
                    self.done.push(profile)
                }
                Err(e) => {
                    let line = format!(
                        "pid {} ({}): its profile could not be made: {e:#}",
                        p.pid,
                        p.name()
                    );
                    self.notes.note(Kind::NoProfile, line);
                }
            }
            self.deferred.forget(p.index);
        }
        if self.done.len() >= MERGE_EVERY {
            self.merge_done();
        }
        // Given again to processes that start: the kernel's tables hold
        // nothing of them any more.
        self.probes.free_indexes(indexes)
    }

    /// The profiles of the processes finalized merged into one; beyond
    /// [`KEEP_ENDED`] ended processes or [`KEEP_ENDED_BYTES`], the oldest
    /// let go. Not under `run` (its family's profiles go to the command's).
    pub(super) fn merge_done(&mut self) {
        if matches!(self.scope, Scope::Family(_)) {
            return;
        }
        let done = std::mem::take(&mut self.done);
        let Some(mut merged) = profiles::merge(self.merged.take(), done) else {
            return;
        };
        let ends = |merged: &Profile| {
            let mut ends: Vec<f64> = merged.processes.iter().filter_map(|p| p.end_s).collect();
            ends.sort_by(f64::total_cmp);
            ends
        };
        let by_count = ends(&merged);
        if by_count.len() > KEEP_ENDED {
            self.evict_ended(&mut merged, by_count[by_count.len() - KEEP_ENDED - 1]);
        }
        // By bytes: the oldest whose groups are the excess's share of all
        // (stacks go with their groups), a few times over since stacks
        // are shared; the one that ended last is kept.
        for _ in 0..4 {
            let bytes = merged.estimated_bytes();
            let ends = ends(&merged);
            if bytes <= KEEP_ENDED_BYTES || ends.len() < 2 {
                break;
            }
            let excess = (bytes - KEEP_ENDED_BYTES) as f64 / bytes as f64;
            let wanted = (excess * merged.groups.len() as f64).ceil() as usize;
            let mut groups: HashMap<(u32, u32), usize> = HashMap::new();
            for g in &merged.groups {
                *groups.entry((g.pid, g.pid_reuse)).or_default() += 1;
            }
            let mut ended: Vec<(f64, usize)> = merged
                .processes
                .iter()
                .filter_map(|p| Some((p.end_s?, groups.get(&(p.pid, p.pid_reuse)).copied()?)))
                .collect();
            ended.sort_by(|a, b| a.0.total_cmp(&b.0));
            ended.pop();
            let mut taken = 0;
            let mut last = None;
            for (end, n) in ended {
                taken += n;
                last = Some(end);
                if taken >= wanted {
                    break;
                }
            }
            match last {
                Some(last) => self.evict_ended(&mut merged, last),
                None => break,
            }
        }
        self.merged = Some(merged);
    }

    /// Lets go of the processes of `merged` that ended at `last_evicted`
    /// or before, counted.
    pub(super) fn evict_ended(&mut self, merged: &mut Profile, last_evicted: f64) {
        let evict = |p: &crate::profile::ProcessInfo| p.end_s.is_some_and(|e| e <= last_evicted);
        let gone: HashSet<(u32, u32)> = merged
            .processes
            .iter()
            .filter(|&p| evict(p))
            .map(|p| (p.pid, p.pid_reuse))
            .collect();
        self.evicted.0 += gone.len() as u64;
        self.evicted.1 += merged
            .processes
            .iter()
            .filter(|&p| evict(p))
            .filter_map(|p| p.counters.as_ref())
            .map(|c| c.allocs)
            .sum::<u64>();
        merged.processes.retain(|p| !evict(p));
        merged
            .groups
            .retain(|g| !gone.contains(&(g.pid, g.pid_reuse)));
        merged.compact_stacks();
    }

    /// The profile of process `p`, from its tables.
    pub(super) fn profile_of(
        &mut self,
        p: &mut HostProcess,
        tables: crate::probes::Prefetched,
    ) -> Result<Profile> {
        let recorded: u64 = tables.sites.iter().map(|(_, t)| t.count).sum();
        // Its blocks freed (those found dead by address reuse were not).
        let freed: u64 = tables
            .sites
            .iter()
            .map(|(_, t)| t.died.saturating_sub(t.reused))
            .sum();
        // Files it mapped that another process's reading opened since.
        for m in std::mem::take(&mut p.unknown) {
            match self.files.module_by_id(&m.file_id) {
                Some(module) => {
                    let mapping = Mapping {
                        path: module.path().to_path_buf(),
                        ..m
                    };
                    p.mapped(mapping, module);
                }
                None => p.unknown.push(m),
            }
        }
        // A forked child gone (or `exec`ed) before it was read maps what
        // its parent maps (the kernel unwound it with its parent's table):
        // the parent's image it was forked from, the latest before it
        // (a parent that `exec`ed has an older image, at other addresses,
        // under an older index).
        let parent = self
            .processes
            .values()
            .filter(|q| p.forked && (p.unread || p.execed) && q.pid == p.ppid && !q.unread)
            .filter(|q| q.seq < p.seq)
            .max_by_key(|q| q.seq);
        let (maps, modules) = match parent {
            Some(q) => {
                // And runs its parent's program (its command line is
                // its own, if it was read).
                if p.exe.is_empty() {
                    p.exe = q.exe.clone();
                }
                (&q.maps, &q.modules)
            }
            None => (&p.maps, &p.modules),
        };
        // The files parsed already (examined, or with rows: a program
        // run again and again, a build's compiler) are not parsed again
        // for this process's names, nor read again by the symbolizer.
        for m in maps.all().iter().filter(|m| m.executable) {
            if let Some(module) = self.files.module_by_id(&m.file_id) {
                modules.share(&m.path, module);
            }
        }
        self.deferred.finish_process(p.index, maps, modules);
        let view = self
            .probes
            .peek()?
            .of_process(tables)
            .with_finished(self.deferred.finished(p.index));
        let raw = groups::collect(&view, None)?;
        let named = profiles::groups_within(
            p.pid,
            raw,
            (maps, modules),
            (false, self.naming),
            self.symbols.0.get_or_insert_with(SymbolCache::default),
        );
        let short = p.short_of_resources();
        let (groups, stacks) = (named.groups, named.stacks);
        let counters = Counters {
            allocs: recorded,
            frees: freed,
            short_of_resources: if short { recorded } else { 0 },
            names_left_mangled: named.losses.left_mangled,
            frames_unnamed: named.losses.unnamed,
            calls_live_let_go: p.calls_let_go.0,
            calls_live_let_go_bytes: p.calls_let_go.1,
            ..Counters::default()
        };
        let mut info = p.info();
        info.counters = Some(counters.clone());
        Ok(Profile {
            duration_s: self.started.0.elapsed().as_secs_f64(),
            exit: p.exit,
            counters,
            groups,
            stacks,
            processes: vec![info],
            ..profiles::header(Header {
                // `run`'s family: each from its start (or its fork).
                mode: match self.scope {
                    Scope::Family(_) => "run",
                    _ => "attach",
                },
                target: TargetInfo {
                    pid: p.pid,
                    command: p.command.clone(),
                    exe: p.exe.clone(),
                },
                started: self.started.1,
                unwind: "dwarf".to_string(),
                sample_bytes: self.probes.sample_bytes(),
            })
        })
    }

    /// The end: recording stops, every process still running is
    /// finalized (it runs on, untraced), the profile written.
    pub(super) fn finish(mut self, output: &mut Output, top: usize) -> Result<i32> {
        let running = self.processes.len();
        let mut host_counters = self.stop()?;
        let duration_s = self.started.0.elapsed().as_secs_f64();
        self.merge_done();
        // Those let go by this last merge counted too.
        (
            host_counters.processes_evicted,
            host_counters.evicted_allocs,
        ) = self.evicted;
        let closing = self.closing.take();
        let detaching = self.probes.detach();
        let done = std::mem::take(&mut self.done);
        let merged = self.merged.take();
        let profiled = merged
            .iter()
            .chain(&done)
            .map(|p| p.processes.len())
            .sum::<usize>()
            + self.evicted.0 as usize;
        eprintln!(
            "memprof: {profiled} processes profiled ({running} still running, let go untraced); {} programs started or seen, those with no allocation followed are not listed",
            self.seen
        );
        let loads_merged = self
            .events
            .loads_merged
            .load(std::sync::atomic::Ordering::Relaxed);
        if self.loads + loads_merged > 0 {
            eprintln!(
                "memprof: {} library loads and unloads, {loads_merged} of them read together with a later one of their process (one reading per process per 0.1 s at most)",
                self.loads + loads_merged
            );
        }
        {
            let rows = self.files.rows.lock().unwrap_or_else(|e| e.into_inner());
            for (why, files) in &rows.refusals {
                eprintln!("memprof: {files} files got no unwind rows: {why}");
            }
            if rows.let_go > 0 {
                eprintln!(
                    "memprof: the unwind rows of {} files were let go, no process mapping them any more",
                    rows.let_go
                );
            }
        }
        let Some(mut profile) = profiles::merge(merged, done) else {
            if let Some(closing) = closing {
                closing.wait();
            }
            detaching.wait();
            bail!(
                "no process allocated while memprof watched ({duration_s:.1} s): nothing to write"
            );
        };
        // Each from its start, or (running before memprof) from start_s 0.
        for p in &mut profile.processes {
            p.profiled_from_s = None;
        }
        // The machine's: every process's, and what no process could be
        // given (processes not followed, frees of blocks never seen).
        profile.counters = host_counters;
        // Boehm GC objects (`--heap all`) are live until their address is
        // allocated again: nothing is traced, no collection held.
        let gc = |g: &crate::profile::Group| g.kind == "gc" || g.kind == "gc_atomic";
        profile.gc = profile.groups.iter().any(gc).then(|| GcSummary {
            liveness: "address reuse only: attach --all traces no process and reads no mark bits (attach --pid or --comm does)".to_string(),
            ..GcSummary::default()
        });
        profile.duration_s = duration_s;
        profile.exit = None;
        profile.target = TargetInfo {
            pid: 0,
            command: vec!["--all".to_string()],
            exe: String::new(),
        };
        let result = output.write_and_print(&profile, top);
        if let Some(closing) = closing {
            closing.wait();
        }
        detaching.wait();
        result.map(|()| 0)
    }
}
