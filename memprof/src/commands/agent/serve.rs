//! The agent's server: HTTP (axum on tokio, one thread) on a Unix socket,
//! and on a TCP address when `--listen` asks. Each route asks the driver's
//! thread for what it serves ([`Request`]) and waits for the answer; what
//! is slow to write (pprof, the formats of `memprof report`) is written
//! here, off the driver's thread.
//!
//! | route | what it serves |
//! |---|---|
//! | `/metrics` | Prometheus's text format ([`super::metrics`]) |
//! | `/debug/pprof/heap?pid=N` or `?comm=NAME` (`&seconds=S`) | gzipped pprof, as Go's heap profile |
//! | `/api/processes` | JSON: the processes followed and those ended kept |
//! | `/api/escalations` | JSON: the processes given allocator probes of their own, and when |
//! | `/api/profile?pid=N` or `?comm=NAME` (`&format=F`, and `memprof report`'s filters: `&function=RE&top=N&leaked`…) | one profile in any format of `memprof report`, filtered as `report` filters |
//! | `/` | the page ([`super::page`]) |
//!
//! The socket is root's alone (mode 0600), or its group's too (`--group`,
//! mode 0660); a TCP address must be a loopback one unless
//! `--allow-remote`.
use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use super::{Request, ServeOptions, Which};
use crate::driver::signals::Waker;
use crate::profile::Profile;
use crate::report::{self, Format};

/// How long a route waits for the driver's thread (a snapshot of a big
/// process symbolizes its files first).
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// How long `/metrics` waits for the driver's thread before it serves
/// the last figures it had (the driver may be naming a process's frames
/// for up to `symbolize::Budget::BACKGROUND`): a scrape is answered
/// within a second whatever the driver does.
const METRICS_WAIT: Duration = Duration::from_millis(700);

/// `?seconds=` at most.
const MAX_SECONDS: u64 = 3600;

/// The server, running on its thread.
pub struct Server {
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
    /// The socket's inode: removed at the end only if still ours.
    inode: u64,
}

impl Server {
    /// Binds the socket (and the TCP address) and starts serving; the
    /// requests come out of the receiver, for the driver's thread.
    pub fn bind(
        options: &ServeOptions,
        driver: Waker,
    ) -> Result<(mpsc::Receiver<Request>, Server)> {
        if let Some(address) = options.listen {
            if !address.ip().is_loopback() && !options.allow_remote {
                bail!(
                    "--listen {address}: not a loopback address; refused, since anyone who can reach it would read every process's command line, executable and stacks (add --allow-remote to serve there anyway, or use 127.0.0.1)"
                );
            }
        }
        let unix = bind_socket(&options.socket, options.group.as_deref())?;
        let inode = std::fs::symlink_metadata(&options.socket)?.ino();
        let tcp = match options.listen {
            None => None,
            Some(address) => {
                let listener = std::net::TcpListener::bind(address).with_context(|| {
                    let _ = std::fs::remove_file(&options.socket);
                    format!("--listen {address}")
                })?;
                listener.set_nonblocking(true)?;
                Some(listener)
            }
        };
        unix.set_nonblocking(true)?;
        let (requests, received) = mpsc::channel();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("memprof-serve".to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    let app = routes(requests, driver);
                    let until = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    };
                    let mut serving = Vec::new();
                    if let Ok(unix) = tokio::net::UnixListener::from_std(unix) {
                        let serve = axum::serve(unix, app.clone())
                            .with_graceful_shutdown(until(stopped.clone()));
                        serving.push(tokio::spawn(async move {
                            let _ = serve.await;
                        }));
                    }
                    if let Some(Ok(tcp)) = tcp.map(tokio::net::TcpListener::from_std) {
                        let serve =
                            axum::serve(tcp, app).with_graceful_shutdown(until(stopped.clone()));
                        serving.push(tokio::spawn(async move {
                            let _ = serve.await;
                        }));
                    }
                    for s in serving {
                        let _ = s.await;
                    }
                });
            })?;
        Ok((
            received,
            Server {
                stop: Some(stop),
                thread: Some(thread),
                socket: options.socket.clone(),
                inode,
            },
        ))
    }

    /// Stops serving (requests under way get their answer or an error)
    /// and removes the socket.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            // Connections still open are not waited for past a moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while !thread.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let ours = std::fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| m.file_type().is_socket() && m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut();
    }
}

/// The Unix socket at `path`: its directory made if missing (root's,
/// 0755), a stale socket replaced, anything else there refused; mode 0600,
/// or 0660 with `group` as its group.
fn bind_socket(path: &Path, group: Option<&str>) -> Result<std::os::unix::net::UnixListener> {
    let gid = group.map(group_id).transpose()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_dir(
            &format!("--socket {}", path.display()),
            dir,
            "anyone who can write there could replace the agent's socket with their own",
            0o755,
        )?;
    }
    match std::fs::symlink_metadata(path) {
        Err(_) => {}
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!(
                    "--socket {}: another memprof agent serves there (stop it, or give another --socket)",
                    path.display()
                );
            }
            // A socket nobody listens on: an agent's that was killed.
            std::fs::remove_file(path)?;
        }
        Ok(_) => bail!(
            "--socket {}: something else is there (not a socket): not removed",
            path.display()
        ),
    }
    // Made with no permission for others from the start (no window
    // between `bind` and `chmod`).
    // SAFETY: umask only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound.with_context(|| format!("--socket {}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::lchown(path, Some(0), Some(gid))
            .with_context(|| format!("--socket {}: giving it to group {gid}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    Ok(listener)
}

/// Directory `dir` (of `what`, a flag and its value), where the agent
/// puts what others must not replace: made with `mode` if missing;
/// refused, with `why`, if it is a link, not a directory, not root's, or
/// writable by group or others.
pub(super) fn private_dir(what: &str, dir: &Path, why: &str, mode: u32) -> Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => bail!(
            "{what}: {} is a symbolic link: refused (give the directory it names; {why})",
            dir.display()
        ),
        Ok(m) if m.is_dir() && (m.uid() != 0 || m.mode() & 0o022 != 0) => bail!(
            "{what}: {} is {}: refused ({why})",
            dir.display(),
            if m.uid() != 0 {
                "not root's".to_string()
            } else {
                format!(
                    "writable by others than root (mode {:o})",
                    m.mode() & 0o7777
                )
            }
        ),
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("{what}: {} is not a directory", dir.display()),
        Err(_) => std::fs::DirBuilder::new()
            .mode(mode)
            .create(dir)
            .with_context(|| format!("{what}: creating {}", dir.display())),
    }
}

/// A group's id, by name or number.
fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).context("--group: a name without NUL")?;
    // SAFETY: getgrnam reads the group database; the entry is read at once,
    // on this thread, before another call could overwrite it.
    let entry = unsafe { libc::getgrnam(name.as_ptr()) };
    if entry.is_null() {
        bail!("--group {group}: no such group");
    }
    // SAFETY: a non-null entry getgrnam returned.
    Ok(unsafe { (*entry).gr_gid })
}

/// What every route holds: where to ask, how to wake the driver's
/// thread to answer at once (it sleeps long on a quiet machine), and the
/// last `/metrics` text, with when it was made.
#[derive(Clone)]
struct Asking(mpsc::Sender<Request>, Waker, LastMetrics);

type LastMetrics = Arc<Mutex<Option<(Instant, String)>>>;

impl Asking {
    /// The figures now, or, when the driver's thread is busy past
    /// [`METRICS_WAIT`], the last ones it gave (said so in a comment);
    /// its late answer is kept for the next scrape.
    async fn metrics(&self) -> Result<String, Response> {
        let (reply, answer) = oneshot::channel();
        if self.0.send(Request::Metrics(reply)).is_err() {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent is stopping",
            ));
        }
        self.1.wake();
        let mut answer = answer;
        let last = Arc::clone(&self.2);
        let keep = move |text: &String| {
            *last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), text.clone()));
        };
        match tokio::time::timeout(METRICS_WAIT, &mut answer).await {
            Ok(Ok(text)) => {
                keep(&text);
                return Ok(text);
            }
            Ok(Err(_)) => {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the agent is stopping",
                ))
            }
            Err(_) => {}
        }
        let cached = self.2.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some((at, text)) = cached else {
            // Nothing to serve yet: wait as the other routes do.
            return match tokio::time::timeout(ANSWER_WAIT, answer).await {
                Ok(Ok(text)) => {
                    keep(&text);
                    Ok(text)
                }
                _ => Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the agent did not answer",
                )),
            };
        };
        tokio::spawn(async move {
            if let Ok(Ok(text)) = tokio::time::timeout(ANSWER_WAIT, answer).await {
                keep(&text);
            }
        });
        Ok(format!(
            "# memprof agent: busy (naming a process's frames); these figures are from {:.1} s ago\n{text}",
            at.elapsed().as_secs_f64()
        ))
    }

    /// Asks the driver's thread, and waits for its answer.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Request,
    ) -> Result<T, Response> {
        let (reply, answer) = oneshot::channel();
        if self.0.send(make(reply)).is_err() {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent is stopping",
            ));
        }
        self.1.wake();
        match tokio::time::timeout(ANSWER_WAIT, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent is stopping",
            )),
            Err(_) => Err(error(
                StatusCode::GATEWAY_TIMEOUT,
                "the agent did not answer within 60 s",
            )),
        }
    }

    async fn profile(&self, which: Which) -> Result<Profile, Response> {
        self.ask(|reply| Request::Profile(which, reply))
            .await?
            .map_err(|e| error(StatusCode::NOT_FOUND, &e))
    }
}

pub(crate) fn routes(requests: mpsc::Sender<Request>, driver: Waker) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/debug/pprof/heap", get(heap))
        .route("/api/processes", get(processes))
        .route("/api/escalations", get(escalations))
        .route("/api/profile", get(profile))
        .with_state(Asking(requests, driver, LastMetrics::default()))
}

/// A plain-text error, one line: what it quotes of the query (a
/// parameter's name or value) with its control characters escaped.
fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("memprof agent: {}\n", crate::text::visible(message)),
    )
        .into_response()
}

async fn metrics(State(asking): State<Asking>) -> Response {
    match asking.metrics().await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(response) => response,
    }
}

async fn processes(State(asking): State<Asking>) -> Response {
    match asking.ask(Request::Processes).await {
        Ok(rows) => json(&rows),
        Err(response) => response,
    }
}

async fn escalations(State(asking): State<Asking>) -> Response {
    match asking.ask(Request::Escalations).await {
        Ok(rows) => json(&rows),
        Err(response) => response,
    }
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `?pid=N` or `?comm=NAME`.
fn which(query: &HashMap<String, String>) -> Result<Which, String> {
    match (query.get("pid"), query.get("comm")) {
        (Some(pid), None) => pid
            .parse()
            .map(Which::Pid)
            .map_err(|_| format!("pid={pid}: not a process id")),
        (None, Some(comm)) => Ok(Which::Comm(comm.clone())),
        _ => Err(
            "say which process: ?pid=N or ?comm=NAME (GET /api/processes lists them)".to_string(),
        ),
    }
}

/// Go's heap profile: the four sample types, inuse_space first; with
/// `?seconds=S`, what was allocated in the next S seconds.
async fn heap(
    State(asking): State<Asking>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let which = match which(&query) {
        Ok(which) => which,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let seconds = match query.get("seconds").map(|s| s.parse::<u64>()) {
        None => None,
        Some(Ok(s)) if (1..=MAX_SECONDS).contains(&s) => Some(s),
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("seconds: a whole number of seconds from 1 to {MAX_SECONDS}"),
            )
        }
    };
    let profile = match seconds {
        None => asking.profile(which).await,
        Some(s) => match asking.profile(which.clone()).await {
            Ok(earlier) => {
                tokio::time::sleep(Duration::from_secs(s)).await;
                asking
                    .profile(which)
                    .await
                    .map(|later| super::delta::since(later, &earlier))
            }
            Err(response) => Err(response),
        },
    };
    match profile {
        Ok(profile) => rendered(&profile, Format::Pprof, "application/octet-stream"),
        Err(response) => response,
    }
}

/// One profile in a format of `memprof report` (`?format=`, JSON unless said).
async fn profile(
    State(asking): State<Asking>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let which = match which(&query) {
        Ok(which) => which,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    if query.get("format").is_some_and(|f| f == "mprof") {
        return match asking.profile(which).await {
            Ok(profile) => {
                let mut out = Vec::new();
                match crate::profile::write(&profile, &mut out) {
                    Ok(()) => {
                        ([(header::CONTENT_TYPE, "application/octet-stream")], out).into_response()
                    }
                    Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
                }
            }
            Err(response) => response,
        };
    }
    let format = match query.get("format").map(String::as_str) {
        None | Some("json") => Format::Json,
        Some(name) => match <Format as clap::ValueEnum>::from_str(name, true) {
            Ok(format) => format,
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("format={name}: one of json, markdown, tsv, types, folded, flamegraph, pprof, timeline, html, mprof"),
                )
            }
        },
    };
    let content_type = match format {
        Format::Json => "application/json",
        Format::Html => "text/html; charset=utf-8",
        Format::Flamegraph | Format::Timeline => "image/svg+xml",
        Format::Pprof => "application/octet-stream",
        _ => "text/plain; charset=utf-8",
    };
    // The rest of the query: `memprof report`'s filters and options.
    let rest = query
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "pid" | "comm" | "format"))
        .map(|(k, v)| (k.as_str(), v.as_str()));
    let args = match crate::commands::report::args_of_query(rest, format) {
        Ok(args) => args,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("{e:#}")),
    };
    match asking.profile(which).await {
        Ok(profile) => {
            let mut out = Vec::new();
            match crate::commands::report::write_one(&args, profile, &mut out) {
                Ok(()) => ([(header::CONTENT_TYPE, content_type)], out).into_response(),
                Err(e) => error(StatusCode::BAD_REQUEST, &format!("{e:#}")),
            }
        }
        Err(response) => response,
    }
}

fn rendered(profile: &Profile, format: Format, content_type: &'static str) -> Response {
    let mut out = Vec::new();
    match report::render(profile, format, &report::Options::default(), &mut out) {
        Ok(()) => ([(header::CONTENT_TYPE, content_type)], out).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    }
}

async fn page(State(asking): State<Asking>) -> Response {
    match asking.ask(Request::Processes).await {
        Ok(rows) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            super::page::render(&rows),
        )
            .into_response(),
        Err(response) => response,
    }
}
