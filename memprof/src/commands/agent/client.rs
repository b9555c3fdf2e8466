//! `memprof report --agent` and `memprof top --agent`: what a running
//! agent serves, asked over its Unix socket (HTTP/1.1, hyper's client).
//! A profile comes in the profile file's own format
//! (`/api/profile?…&format=mprof`): every report format then works on a
//! live process without a second set of probes; `top`'s figures are
//! `/api/processes`'s rows.
use std::path::Path;

use anyhow::{bail, Context, Result};
use http_body_util::BodyExt;

use crate::profile::Profile;

/// How long the agent may take (a snapshot of a big process symbolizes
/// its files first).
const WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// `value` as a query string's value.
pub fn query_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// The profile `which` (`pid=N` or `comm=NAME`) names, from the agent on
/// `socket`.
pub fn profile(socket: &Path, which: &str) -> Result<Profile> {
    let body = get(socket, &format!("/api/profile?{which}&format=mprof"))?;
    crate::profile::parse(&body)
        .with_context(|| format!("the agent on {} sent no profile", socket.display()))
}

/// The processes the agent on `socket` lists (`/api/processes`): those
/// it follows, and those that ended it keeps.
pub fn processes(socket: &Path) -> Result<Vec<super::ProcessRow>> {
    let body = get(socket, "/api/processes")?;
    serde_json::from_slice(&body).with_context(|| {
        format!(
            "--agent {}: /api/processes is not the list of processes memprof agent serves",
            socket.display()
        )
    })
}

/// GET `path` of the agent on `socket`: the body of a 200, else its
/// message as the error.
pub fn get(socket: &Path, path: &str) -> Result<Vec<u8>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let at = || format!("--agent {}", socket.display());
    runtime.block_on(async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .with_context(|| format!("{}: no agent answers there (is `memprof agent` running, and are you root or in its --group?)", at()))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .with_context(at)?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, "agent")
            .body(http_body_util::Empty::<axum::body::Bytes>::new())?;
        let answer = tokio::time::timeout(WAIT, async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        })
        .await
        .with_context(|| format!("{}: no answer within {} s", at(), WAIT.as_secs()))?
        .with_context(at)?;
        let (status, body) = answer;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            bail!("{}", text.trim().trim_start_matches("memprof agent: "));
        }
        Ok(body.to_vec())
    })
}
