//! How a session starts: `run` launches the command held right after its
//! `exec` and attaches everything before its first instruction; `attach`
//! finds a running process, traces it when collections are to be held, and
//! attaches. Both end in the same [`Session`].
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::{update_ranges, GcWatch, Session};
use crate::allocators;
use crate::driver::Output;
use crate::live::Live;
use crate::modules::maps::MapsCache;
use crate::modules::ModuleCache;
use crate::options::{CensusWhen, Mode, SessionOptions};
use crate::plan::{Choice, Plan, PlannedGcSampling};
use crate::predict::Predictor;
use crate::probes::{ProbeOptions, Probes};
use crate::tracee::preflight::{mapped_files, require_capabilities};
use crate::tracee::trace::Tracer;
use crate::tracee::{self, launch, startup, Tracee};
use memprof_common::LIBRARY_LOAD_SIGNAL;

impl Session {
    /// `run`: launches `command` held after its `exec`, with every probe
    /// attached; [`Session::begin`] lets it go. `child_mask` is the signal
    /// mask the command starts with. `launched` is told its pid as soon
    /// as it exists (held).
    pub fn launch(
        command: &[OsString],
        options: &SessionOptions,
        child_mask: &libc::sigset_t,
        launched: &mut dyn FnMut(u32),
    ) -> Result<Session> {
        require_capabilities()?;
        let program = tracee::find_command(&command[0])?;
        let output = Output::create(options.output.as_ref(), &program, None)?;
        let mut tracer = launch::launch(&program, command, child_mask)?;
        launched(tracer.pid);
        tracer.hold_execs = options.follow;
        tracer.own_exec = options.follow;
        Session::held_at_exec(tracer, Some(command), output, options, true)
    }

    /// `run`: the command's process `exec`ed another program (a script's
    /// `exec ./app`): the session goes on as that program's, built as at
    /// launch while the process waits before its first instruction, with
    /// the same tracer (the processes it started stay followed) and output.
    /// What the previous program allocated is not kept (said here). If the
    /// new program cannot be profiled, it is let go, untraced.
    pub fn exec_again(mut self, options: &SessionOptions) -> Result<Session> {
        let pid = self.pid();
        let tracer = self
            .tracer
            .take()
            .ok_or_else(|| anyhow::anyhow!("pid {pid} exec'd untraced"))?;
        let output = std::mem::replace(&mut self.output, Output::none());
        let before = self.target.exe.clone();
        // The previous program's probes go with its session.
        let _ = self.probes.disable();
        drop(self);
        let session = Session::held_at_exec(tracer, None, output, options, false).with_context(
            || format!("pid {pid}, the command, exec'd a program memprof could not profile; it runs on, untraced"),
        )?;
        eprintln!(
            "memprof: pid {pid}, the command, exec'd {}: profiled as that program from here on (what {} allocated before is not in the profile)",
            session.target.exe.display(),
            before.display()
        );
        Ok(session)
    }

    /// A running process attached to as `attach` does, for a profile it
    /// becomes part of: a worker `run` found forked without an `exec`, or
    /// a process `attach --comm/--exe` selects. What it allocated before is
    /// not seen.
    pub fn attach_followed(pid: u32, options: &SessionOptions) -> Result<Session> {
        Session::attach(pid, &options.for_followed())
    }

    /// `run`: a process the command started, stopped right after it
    /// `exec`ed a program ([`Tracer::take_execs`]), profiled like the
    /// command from its first instruction; [`Session::begin`] lets it go.
    /// If that fails, it is let go untraced.
    pub fn adopt(pid: u32, options: &SessionOptions) -> Result<Session> {
        let tracer = Tracer::for_exec_stopped(pid);
        Session::held_at_exec(tracer, None, Output::none(), &options.for_followed(), false)
    }

    /// A session for the process `tracer` holds right after its `exec`,
    /// every probe attached. `command`: the command line as given (else
    /// the process's own). Until the probes are attached, a failure kills
    /// the held process (`kill_on_failure`) or lets it go.
    fn held_at_exec(
        mut tracer: Tracer,
        command: Option<&[OsString]>,
        output: Output,
        options: &SessionOptions,
        kill_on_failure: bool,
    ) -> Result<Session> {
        let pid = tracer.pid;
        let give_up = |tracer: &mut Tracer| {
            if kill_on_failure {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                let _ = tracer.poll(&mut |_| {});
            } else {
                tracer.detach();
            }
        };
        let started = Tracee::attach(pid).and_then(|target| {
            // The program the command became (a script's interpreter).
            tracee::check_architecture(pid, &target.exe)?;
            let modules = ModuleCache::of_process(pid);
            run_to_libraries(pid, &modules)?;
            let plan = Plan::new(
                modules,
                &target.exe,
                &mapped_files(pid)?,
                &Choice::of(options),
            )?;
            Ok((target, plan))
        });
        let (mut target, plan) = match started {
            Ok(parts) => parts,
            Err(e) => {
                give_up(&mut tracer);
                return Err(e);
            }
        };
        if let Some(command) = command {
            target.command = command
                .iter()
                .map(|word| crate::text::lossy(word.as_bytes()))
                .collect();
        }
        let mut session = match Session::new(Mode::Run, target, plan, output, options) {
            Ok(session) => session,
            Err(e) => {
                give_up(&mut tracer);
                return Err(e);
            }
        };
        session.tracer = Some(tracer);
        if let Err(e) = session.prepare_launched() {
            if let Some(tracer) = &mut session.tracer {
                give_up(tracer);
            }
            return Err(e);
        }
        Ok(session)
    }

    /// The probes, the collection probes and the unwinder's module ranges
    /// of a command held after its `exec`.
    fn prepare_launched(&mut self) -> Result<()> {
        let pid = self.pid();
        let predictors = self.predictors();
        self.probes
            .attach(pid, &self.plan.probes, &self.plan.modules)?;
        self.predict_results(predictors);
        self.weigh_refills();
        self.probes.set_traced(pid)?;
        self.gc.start(&mut self.probes, pid)?;
        if self.plan.tables.is_some() {
            update_ranges(&mut self.probes, &self.plan, &mut self.maps, pid)?;
            // Libraries are mapped by the dynamic linker after this point:
            // have it stop the command each time, to place them in time.
            let modules = &self.plan.modules;
            if let Some(ld_so) = tracee::interpreter(modules, &self.target.exe) {
                let hook = allocators::symbol_in(modules, &ld_so, "_dl_debug_state");
                if let (Some((_, offset)), Ok(ld_so)) = (hook, modules.get(&ld_so)) {
                    self.probes.watch_library_loads(pid, &ld_so, offset)?;
                }
            }
        }
        Ok(())
    }

    /// `run`: lets the launched command go.
    pub fn begin(&mut self) {
        let pid = self.pid();
        self.start_clock();
        if let Some(tracer) = &mut self.tracer {
            tracer.resume_signal(pid, 0, false);
        }
        if self.options.followed {
            eprintln!(
                "memprof: following pid {pid} (started by {}): {}",
                self.target_parent,
                self.target.command.join(" ")
            );
            return;
        }
        eprintln!(
            "memprof: profiling {} (pid {pid}, {} probes, {} unwinding)",
            self.target.command.join(" "),
            self.probes.attached,
            self.plan.unwind_name()
        );
    }

    /// `attach`: profiles the running process `pid` from now on.
    pub fn attach(pid: u32, options: &SessionOptions) -> Result<Session> {
        if !tracee::is_alive(pid) {
            bail!("no process with pid {pid}");
        }
        require_capabilities()?;
        let target = Tracee::attach(pid)?;
        tracee::check_architecture(pid, &target.exe)?;
        let loaded = mapped_files(pid)?;
        let output = if options.followed {
            Output::none()
        } else {
            Output::create(options.output.as_ref(), &target.exe, Some(pid))?
        };
        let plan = Plan::new(
            ModuleCache::of_process(pid),
            &target.exe,
            &loaded,
            &Choice::of(options),
        )?;
        let mut session = Session::new(Mode::Attach, target, plan, output, options)?;
        session.refresh_maps()?;
        // Collections are watched before allocations are: every GC object
        // recorded then reaches the mark-bit pass's copy.
        session.tracer = session.gc.trace(&mut session.probes, pid)?;
        let predictors = session.predictors();
        session
            .probes
            .attach(pid, &session.plan.probes, &session.plan.modules)
            .map_err(|e| {
                if tracee::is_alive(pid) {
                    e
                } else {
                    anyhow::anyhow!("pid {pid} exited while memprof was attaching")
                }
            })?;
        session.predict_results(predictors);
        session.weigh_refills();
        session.start_clock();
        if options.followed {
            eprintln!(
                "memprof: following pid {pid} (parent {}) from now on: {}",
                session.target_parent,
                session.target.command.join(" ")
            );
            return Ok(session);
        }
        eprintln!(
            "memprof: attached to pid {pid} ({} probes, {} unwinding); Ctrl-C to stop{}",
            session.probes.attached,
            session.plan.unwind_name(),
            options
                .duration
                .map(|d| format!(", or wait {} s", d.as_secs_f64()))
                .unwrap_or_default()
        );
        Ok(session)
    }

    /// Profiling starts now: the duration and the timeline count from here.
    /// Before attaching: the allocators whose results can be read at
    /// their entry ([`Predictor`]: Boehm's `GC_malloc`, glibc's `malloc`);
    /// their functions get a uprobe session. Each with its module.
    fn predictors(&mut self) -> Vec<(Predictor, PathBuf)> {
        let mut found = Vec::new();
        let planned = |symbol: &str| {
            self.plan
                .probes
                .iter()
                .find(|p| p.func.func.symbol == symbol)
                .map(|p| p.func.module.clone())
        };
        let wanted = [
            ("GC_malloc", planned("GC_malloc")),
            ("malloc", planned("malloc")),
        ];
        for (symbol, module) in wanted {
            let Some(module) = module else { continue };
            let made = self
                .plan
                .modules
                .get(&module)
                .map_err(anyhow::Error::from)
                .and_then(|m| {
                    if symbol == "malloc" {
                        Predictor::malloc(&m)
                    } else {
                        Predictor::gc(&m, module == self.target.exe)
                    }
                });
            match made {
                Ok(predictor) => {
                    self.probes.predict = true;
                    found.push((predictor, module));
                }
                Err(e) => eprintln!("memprof: note: every {symbol} return is probed ({e:#})"),
            }
        }
        found
    }

    /// After attaching: the kernel starts predicting (checking first).
    fn predict_results(&mut self, predictors: Vec<(Predictor, PathBuf)>) {
        let pid = self.pid();
        for (predictor, module) in predictors {
            if !self.probes.predict {
                return; // no uprobe sessions here (`--verbose` says so)
            }
            let which = predictor.which();
            let started = self
                .plan
                .modules
                .get(&module)
                .map_err(anyhow::Error::from)
                .and_then(|m| Ok(m.load_bias(pid)?))
                .and_then(|bias| {
                    self.probes
                        .predict_results(which, &predictor.settings(pid, bias))
                });
            if let Err(e) = started {
                eprintln!("memprof: note: every result read at the return ({e:#})");
            }
        }
    }

    /// After attaching, `--gc-sampling refill`: where the collector's
    /// `GC_bytes_allocd` is, for the kernel to weigh each refill by.
    fn weigh_refills(&mut self) {
        let PlannedGcSampling::Refill { module, layout } = &self.plan.gc_sampling else {
            return;
        };
        let pid = self.pid();
        let set = self
            .plan
            .modules
            .get(module)
            .map_err(anyhow::Error::from)
            .and_then(|m| Ok(m.load_bias(pid)?))
            .and_then(|bias| {
                self.tables.refill_frame = layout
                    .caller
                    .as_ref()
                    .map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias));
                self.probes.refill_settings(&layout.settings(bias))
            });
        if let Err(e) = set {
            eprintln!(
                "memprof: note: each refill weighed by its list's place in its block alone ({e:#})"
            );
        }
    }

    fn start_clock(&mut self) {
        self.started = (Instant::now(), SystemTime::now());
        self.live = Live::new(
            self.options.live.clone(),
            self.started.0,
            self.output.path(),
        );
    }

    /// The session of `target` with the probes of `plan` loaded (no probe
    /// attached yet).
    fn new(
        mode: Mode,
        target: Tracee,
        mut plan: Plan,
        output: Output,
        options: &SessionOptions,
    ) -> Result<Session> {
        let started = (Instant::now(), SystemTime::now());
        let target_parent =
            crate::tracee::family::process_of(target.pid).map_or(0, |(_, parent)| parent);
        let target_ns_pid = crate::tracee::family::namespace_pid(target.pid);
        let mut gc = GcWatch::new(&plan, options, target.pid);
        gc.name_types(&plan, &target.exe);
        let census = CensusWhen::or_default(options.census, mode);
        if census != CensusWhen::Off {
            gc.census_heap(&plan, target.pid, &target.exe, mode == Mode::Attach, census);
        }
        // Whether GC objects go to memprof's copy, and are judged in the
        // kernel, is decided by now: load-time settings of the probes.
        let mut probe_options = plan.probe_options(options);
        (probe_options.gc_copy, probe_options.gc_verdicts) = gc.kernel_copy();
        let mut probes = Probes::load(&probe_options, plan.tables.as_ref())?;
        if options.followed && mode == Mode::Attach {
            // A process found running (`agent`, `attach --comm/--exe`,
            // `run`'s forked workers): the next one like it is not held
            // while its session starts either, so a spare is loaded for
            // it meanwhile.
            probes.prepare_spare();
        }
        plan.loaded();
        gc.keep_copy(&mut probes)?;
        if matches!(plan.gc_sampling, PlannedGcSampling::Refill { .. }) && !gc.copies() {
            bail!(
                "--gc-sampling refill needs the collector's mark bits ({}); use --gc-sampling exact",
                gc.why_no_marks().unwrap_or("--gc-liveness reuse")
            );
        }
        Ok(Session {
            mode,
            tables: probes.peek()?,
            gc,
            live: Live::new(options.live.clone(), started.0, output.path()),
            target,
            plan,
            options: options.clone(),
            probes,
            tracer: None,
            maps: MapsCache::default(),
            output,
            deferred: Vec::new(),
            started,
            target_parent,
            target_ns_pid,
            last_refresh: Instant::now(),
            last_exit_check: Instant::now(),
            execed: false,
        })
    }
}

/// `run`: lets the command held after its `exec` run until its dynamic
/// linker has mapped its libraries ([`startup`]), stopped there by the
/// library-load uprobe of a small first load of the probes.
fn run_to_libraries(pid: u32, modules: &ModuleCache) -> Result<()> {
    let Some(hook) = startup::linker_hook(pid, modules)? else {
        return Ok(()); // static: nothing to wait for
    };
    let mut probes = Probes::load(&ProbeOptions::smallest(), None)?;
    probes.watch_library_loads(pid, &hook.ld_so, hook.offset)?;
    startup::run_to_libraries(pid, &hook, LIBRARY_LOAD_SIGNAL as i32, &mut || {
        probes.take_library_load_signal()
    })?;
    probes.stop_library_loads()?;
    // Its one link closes in the background (~0.1 s).
    drop(probes.detach());
    Ok(())
}
