//! The agent's routes answering queries through its router, the driver's
//! thread stood in for (`crate::fuzzing::agent_router`).
use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use crate::profile::{Frame, Group, Profile};

/// A profile of one stack.
fn profile() -> Profile {
    let mut profile = Profile::default();
    let group = Group {
        kind: "libc".into(),
        live_count: 2,
        live_bytes: 2048,
        total_count: 2,
        total_bytes: 2048,
        ..Group::default()
    };
    let frame = Frame {
        function: "make_foo".into(),
        raw_name: "make_foo".into(),
        address: 0x1139,
        ..Frame::default()
    };
    profile.push(group, vec![frame]);
    profile
}

/// The status and body of a GET of `uri`.
fn get(uri: &str) -> (StatusCode, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let router = crate::fuzzing::agent_router(profile());
    let request = Request::get(uri).body(Body::empty()).unwrap();
    runtime.block_on(async {
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
}

/// Found by the agent_query fuzz target: a parameter's name with a
/// newline (`%0A`) broke the error into two lines, and any control
/// character in a quoted name or value reached the client as it was
/// (its terminal's, with curl).
#[test]
fn a_bad_query_is_answered_in_one_line_its_control_characters_escaped() {
    for (query, said) in [
        (
            "pid=1&fun%0Action=x",
            r"fun\nction: not a parameter of a profile",
        ),
        ("pid=1&leaked=%1B%5B2J", r"leaked=\u{1b}[2J: true or false"),
        ("pid=%0A1", r"pid=\n1: not a process id"),
        ("pid=1&format=x%07", r"format=x\u{7}: one of"),
    ] {
        let (status, body) = get(&format!("/api/profile?{query}"));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body.lines().count(), 1, "{query}: {body}");
        assert!(body.contains(said), "{query}: {body}");
    }
    let (status, body) = get("/api/profile?pid=1&format=tsv&min_bytes=0");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("make_foo"), "{body}");
}
