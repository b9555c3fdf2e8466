//! `memprof report`: a profile (or two, `--diff`) loaded, filtered and
//! written in the format asked for.
use std::io::Write;

use anyhow::{bail, Result};

use crate::commands::cli::ReportArgs;
use crate::outfile::OutFile;
use crate::profile::{self, Profile};
use crate::report::{self, diff, filter, Format};

/// `memprof report FILE` / `memprof report --diff BEFORE AFTER`.
pub(super) fn report(args: &ReportArgs) -> Result<()> {
    filter::check_sizes(args.size_min, args.size_max)?;
    let filter = filter_of(args)?;
    let mut options = options_of(args);
    check_format(args)?;
    let mut loaded = load(args, &filter)?;
    let leak_table = leaks(args, &mut loaded, &mut options);
    match write(args, &loaded, leak_table, &options) {
        // `memprof report … | head` is done, not failed.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

/// What the command line asks the writers to show.
fn options_of(args: &ReportArgs) -> report::Options {
    report::Options {
        min_bytes: args.min_bytes,
        depth: args.depth,
        skip: args.skip,
        top: args.top,
        skip_runtime: args.skip_runtime,
        count: args.count,
        total: args.total,
        inverted: args.inverted,
        filters: describe_filters(args),
        keep_order: false,
    }
}

/// --leaks: its own table in markdown (whether it is); for the other
/// formats (and both profiles of --diff), only the leaking stacks,
/// ranked by growth.
fn leaks(args: &ReportArgs, loaded: &mut [Profile], options: &mut report::Options) -> bool {
    let leak_table = args.leaks && args.format == Format::Markdown && args.diff.is_none();
    if args.leaks && !leak_table {
        for profile in loaded.iter_mut() {
            *profile = report::leaks::leaking(std::mem::take(profile));
        }
        options.keep_order = true;
        options.min_bytes.get_or_insert(0);
    }
    leak_table
}

/// `memprof report`'s flags that a query may give (`memprof agent`'s
/// `/api/profile?pid=N&function=make_foo&top=10&leaked`): all but those
/// naming files and processes.
pub(crate) const QUERY_FLAGS: [&str; 18] = [
    "min-bytes",
    "depth",
    "skip",
    "top",
    "skip-runtime",
    "count",
    "total",
    "inverted",
    "kind",
    "function",
    "source",
    "exclude-function",
    "size-min",
    "size-max",
    "leaked",
    "temporary",
    "temporary-ms",
    "leaks",
];

/// A query's parameters (`name=value`, `_` or `-` alike; a flag without a
/// value, or `=true`, set; `=false` not) read as `memprof report`'s flags,
/// for a profile in `format`; the error names the parameter.
pub(crate) fn args_of_query<'a>(
    query: impl IntoIterator<Item = (&'a str, &'a str)>,
    format: Format,
) -> Result<ReportArgs> {
    #[derive(clap::Parser)]
    #[command(name = "report", no_binary_name = true)]
    struct Asked {
        #[command(flatten)]
        args: ReportArgs,
    }
    let mut argv: Vec<String> = vec!["--agent".into()];
    for (name, value) in query {
        let flag = name.replace('_', "-");
        if !QUERY_FLAGS.contains(&flag.as_str()) {
            bail!(
                "{name}: not a parameter of a profile (pid or comm, format, and memprof report's {})",
                QUERY_FLAGS.join(", ")
            );
        }
        let switch = matches!(
            flag.as_str(),
            "total" | "inverted" | "leaked" | "temporary" | "leaks"
        );
        match (switch, value) {
            (true, "" | "true" | "1") => argv.push(format!("--{flag}")),
            (true, "false" | "0") => {}
            (true, _) => bail!("{name}={value}: true or false"),
            (false, _) => argv.push(format!("--{flag}={value}")),
        }
    }
    let asked = <Asked as clap::Parser>::try_parse_from(&argv).map_err(|e| {
        // clap's first line, without its "error: " and usage.
        let text = e.to_string();
        let line = text.lines().next().unwrap_or_default();
        anyhow::anyhow!("{}", line.trim_start_matches("error: "))
    })?;
    let mut args = asked.args;
    args.format = format;
    filter::check_sizes(args.size_min, args.size_max)?;
    Ok(args)
}

/// One profile (of the process the agent was asked for), filtered and
/// written as `args` ask (the agent's `/api/profile`).
pub(crate) fn write_one(args: &ReportArgs, profile: Profile, out: &mut dyn Write) -> Result<()> {
    let filter = filter_of(args)?;
    let mut options = options_of(args);
    let mut loaded = [match filter.is_empty() {
        true => profile,
        false => filter.apply(profile),
    }];
    match leaks(args, &mut loaded, &mut options) {
        true => report::leaks::write(&loaded[0], &options, out),
        false => report::render(&loaded[0], args.format, &options, out),
    }
}

/// The filters of the command line.
fn filter_of(args: &ReportArgs) -> Result<filter::Filter> {
    Ok(filter::Filter {
        kinds: filter::kinds(&args.kind)?,
        function: filter::regex("--function", args.function.as_deref())?,
        source: filter::regex("--source", args.source.as_deref())?,
        exclude_function: filter::regex("--exclude-function", args.exclude_function.as_deref())?,
        size_min: args.size_min,
        size_max: args.size_max,
        leaked: args.leaked,
        temporary: args.temporary,
        temporary_ns: args.temporary_ms.saturating_mul(1_000_000),
        pids: args.pid.clone(),
        comms: args.comm.clone(),
    })
}

/// Formats that cannot be written as asked: a diff not in markdown or
/// json, pprof (binary) to a terminal.
fn check_format(args: &ReportArgs) -> Result<()> {
    if args.diff.is_some() && !args.format.diffable() {
        bail!(
            "--diff writes markdown or json, not {}",
            clap::ValueEnum::to_possible_value(&args.format).map_or_else(
                || format!("{:?}", args.format),
                |v| v.get_name().to_string()
            )
        );
    }
    if args.format == Format::Pprof
        && args.output.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        bail!("pprof is binary (gzipped protobuf): write it to a file with -o FILE.pb.gz");
    }
    Ok(())
}

/// The profile, or the two of `--diff`, loaded and filtered.
fn load(args: &ReportArgs, filter: &filter::Filter) -> Result<Vec<Profile>> {
    Ok(match (&args.diff, &args.file) {
        (Some(files), _) => {
            let [before, after] = [0, 1].map(|i| profile::load(&files[i]));
            let (before, after) = (before?, after?);
            filter.check_processes(&before)?;
            filter.check_processes(&after)?;
            let (before, after) = (filter.apply(before), filter.apply(after));
            diff::check_compatible(&before, &after)?;
            vec![before, after]
        }
        (None, Some(file)) => {
            let profile = profile::load(file)?;
            filter.check_processes(&profile)?;
            vec![if filter.is_empty() {
                profile
            } else {
                filter.apply(profile)
            }]
        }
        (None, None) => match &args.agent {
            Some(socket) => {
                let which = match (&args.pid[..], &args.comm[..]) {
                    ([pid], []) => format!("pid={pid}"),
                    ([], [comm]) => {
                        format!("comm={}", crate::commands::agent::client::query_value(comm))
                    }
                    _ => bail!("--agent: say which process, with one --pid N or one --comm NAME"),
                };
                let profile = crate::commands::agent::client::profile(socket, &which)?;
                // The agent chose the process(es) already.
                let mut chosen = filter.clone();
                chosen.pids.clear();
                chosen.comms.clear();
                vec![match chosen.is_empty() {
                    true => profile,
                    false => chosen.apply(profile),
                }]
            }
            None => bail!("no profile given"),
        },
    })
}

/// Writes the report: to `-o` (whole or not at all), else stdout.
fn write(
    args: &ReportArgs,
    loaded: &[Profile],
    leak_table: bool,
    options: &report::Options,
) -> Result<()> {
    let mut file = args.output.as_deref().map(OutFile::create).transpose()?;
    let mut stdout = std::io::stdout().lock();
    let out: &mut dyn Write = match &mut file {
        Some(file) => file,
        None => &mut stdout,
    };
    // One profile, or the two of --diff.
    match loaded {
        [profile] if leak_table => report::leaks::write(profile, options, out),
        [profile] => report::render(profile, args.format, options, out),
        [before, after, ..] => {
            let files = args.diff.as_deref().unwrap_or_default();
            let names = [0, 1].map(|i| files[i].to_str().unwrap_or("?"));
            diff::write(
                before,
                after,
                names,
                args.format == Format::Json,
                options,
                out,
            )
        }
        [] => Ok(()),
    }
    .and_then(|()| out.flush().map_err(Into::into))
    .and_then(|()| file.map_or(Ok(()), OutFile::commit))
}

/// The filters given, in words, for report headers.
fn describe_filters(args: &ReportArgs) -> Option<String> {
    let mut parts = Vec::new();
    if !args.kind.is_empty() {
        parts.push(format!("--kind {}", args.kind.join(",")));
    }
    for pid in &args.pid {
        parts.push(format!("--pid {pid}"));
    }
    for comm in &args.comm {
        parts.push(format!("--comm {comm}"));
    }
    for (flag, value) in [
        ("--function", &args.function),
        ("--source", &args.source),
        ("--exclude-function", &args.exclude_function),
    ] {
        if let Some(v) = value {
            parts.push(format!("{flag} '{v}'"));
        }
    }
    if let Some(min) = args.size_min {
        parts.push(format!("--size-min {min} (mean allocation size)"));
    }
    if let Some(max) = args.size_max {
        parts.push(format!("--size-max {max} (mean allocation size)"));
    }
    if args.leaked {
        parts.push("--leaked (stacks with blocks live at the end)".to_string());
    }
    if args.temporary {
        parts.push(format!(
            "--temporary: live counts and bytes are the allocations that died soon (GC: at the first collection; libc and mmap: within {} ms)",
            args.temporary_ms
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Whether writing failed because the reader went away (`… | head`),
/// whichever writer met it.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == BrokenPipe)
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(query: &[(&str, &str)]) -> Result<ReportArgs> {
        args_of_query(query.iter().copied(), Format::Json)
    }

    /// A query's parameters are `report`'s flags of the same names.
    #[test]
    fn a_query_reads_as_reports_flags() {
        let args = asked(&[
            ("function", "^make_foo$"),
            ("min_bytes", "0"),
            ("top", "3"),
            ("leaked", ""),
            ("total", "false"),
            ("skip-runtime", "false"),
            ("kind", "libc,gc"),
        ])
        .unwrap();
        assert_eq!(args.function.as_deref(), Some("^make_foo$"));
        assert_eq!((args.min_bytes, args.top), (Some(0), Some(3)));
        assert!(args.leaked && !args.total && !args.skip_runtime);
        assert_eq!(args.kind, ["libc,gc"]);
        assert_eq!(args.format, Format::Json);
        let filter = filter_of(&args).unwrap();
        assert_eq!(filter.kinds, ["libc", "gc"]);
        // None: everything, as `report` shows it.
        let args = asked(&[]).unwrap();
        assert!(filter_of(&args).unwrap().is_empty() && args.skip_runtime);
    }

    /// Files, processes and unknown names are no parameters; a bad value
    /// says which; one line each.
    #[test]
    fn a_query_outside_reports_filters_is_refused_by_name() {
        for (query, said) in [
            (
                ("output", "/etc/passwd"),
                "output: not a parameter of a profile",
            ),
            (("diff", "a"), "diff: not a parameter"),
            (("file", "x"), "file: not a parameter"),
            (("agent", "/tmp/s"), "agent: not a parameter"),
            (("pid", "1"), "pid: not a parameter"),
            (("top", "x"), "invalid value 'x' for '--top <N>'"),
            (("leaked", "maybe"), "leaked=maybe: true or false"),
            (("size-min", "9"), ""),
        ] {
            match asked(&[query]) {
                Ok(_) => assert!(said.is_empty(), "{query:?} taken"),
                Err(e) => {
                    let text = format!("{e:#}");
                    assert!(!said.is_empty() && text.contains(said), "{query:?}: {text}");
                    assert_eq!(text.lines().count(), 1, "{text}");
                }
            }
        }
        let e = asked(&[("size_min", "9"), ("size_max", "2")]).unwrap_err();
        assert!(format!("{e:#}").contains("--size-min"), "{e:#}");
    }
}
