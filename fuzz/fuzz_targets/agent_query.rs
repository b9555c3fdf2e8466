//! The agent's HTTP routes with any query (`memprof::fuzzing::agent_router`:
//! the router of `commands/agent/serve.rs`, its driver answering with a
//! real profile): `/api/profile?pid=1&format=…&function=RE&top=N…` (the
//! query read as `memprof report`'s flags, the profile filtered and
//! written) and `/debug/pprof/heap?comm=app…`. Whoever can reach the
//! socket writes the query. A bad one gets a 4xx and one line; no
//! panic, no 500, no hang.
#![no_main]
use std::collections::HashMap;
use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{Request, Uri};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

/// A profile `memprof run` wrote (of a small C program), served for
/// `pid=1` and `comm=app`.
const PROFILE: &[u8] = include_bytes!("../seeds/agent_query.mprof");

/// The most a response may be: a profile's report, not a flood.
const MAX_BODY: usize = 64 << 20;

fn router() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static ROUTER: OnceLock<(tokio::runtime::Runtime, axum::Router)> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let profile = memprof::profile::parse(PROFILE).expect("the seed profile reads");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        (runtime, memprof::fuzzing::agent_router(profile))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    for path in ["/api/profile", "/debug/pprof/heap"] {
        let Ok(uri) = format!("{path}?{query}").parse::<Uri>() else {
            return;
        };
        if path == "/debug/pprof/heap" && waits(&uri) {
            // `seconds=S` waits S seconds between two profiles, as asked.
            continue;
        }
        let (runtime, router) = router();
        let request = Request::get(uri.clone()).body(Body::empty()).unwrap();
        let response = runtime
            .block_on(router.clone().oneshot(request))
            .expect("the router answers");
        let status = response.status();
        let body = runtime
            .block_on(axum::body::to_bytes(response.into_body(), MAX_BODY))
            .expect("a body within 64 MiB");
        assert!(
            !status.is_server_error(),
            "{uri}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
        if status.is_client_error() {
            let text = String::from_utf8_lossy(&body);
            assert_eq!(text.lines().count(), 1, "{uri}: {status}: {text}");
        }
    }
});

/// Whether the heap route would wait (`seconds` from 1 to 3600, read as
/// the route reads it).
fn waits(uri: &Uri) -> bool {
    let Ok(Query(query)) = Query::<HashMap<String, String>>::try_from_uri(uri) else {
        return false;
    };
    query
        .get("seconds")
        .and_then(|s| s.parse::<u64>().ok())
        .is_some_and(|s| s >= 1)
}
