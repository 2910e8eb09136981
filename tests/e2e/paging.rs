//! Replies are bounded by bytes, not only by count (reliability review D4): large sessions or
//! multi-MiB activities never make a list fail for good; clients follow the pages.

use paddock_proto::obey::local::v1 as pb;
use serde_json::json;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_sessions_larger_than_a_message_comes_in_pages() {
    let mut d = Daemon::start_with(Dirs::new(), &["--max-sessions", "64"]).await;
    let task = "t".repeat(120_000);
    let mut ids = Vec::new();
    for _ in 0..40 {
        let mut req = d.request(None).await;
        req.initial_message = task.clone();
        ids.push(d.create(req).await.id);
    }
    // 40 × 120 kB: more than the 4 MiB a message may be, so more than one page.
    let mut c = d.client().await;
    let mut seen = Vec::new();
    let mut req = pb::ListSessionsRequest::default();
    let mut pages = 0;
    loop {
        let page = c.list_sessions(req.clone()).await.unwrap().into_inner();
        pages += 1;
        seen.extend(page.sessions.iter().map(|s| s.id.clone()));
        assert!(page.sessions.iter().all(|s| s.initial_message == task));
        if page.next_page_token.is_empty() {
            break;
        }
        req.page_token = page.next_page_token;
    }
    assert!(pages >= 2, "{pages} page(s)");
    // Newest first (ids are ULIDs: creation order).
    ids.sort();
    ids.reverse();
    assert_eq!(seen, ids, "every session once, newest first");
    // The CLI follows the pages.
    let out = d
        .dirs
        .cli(false)
        .args(["session", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(listed, 41, "a header and every session");
}

/// Issue 16: a list costs what it shows. ListSessions' page_size (extension) gives a first page
/// of that many, newest first, with the token to go on (older ones); `session list` shows the
/// newest 100 in a table (--limit N, --limit 0 for all) and says when there are more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_size_gives_a_first_page_and_the_cli_shows_one() {
    let mut d = Daemon::start_with(Dirs::new(), &["--max-sessions", "16"]).await;
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(d.session(None).await.id);
    }
    ids.sort();
    ids.reverse();
    let mut c = d.client().await;
    let mut req = pb::ListSessionsRequest {
        page_size: 3,
        ..Default::default()
    };
    let mut pages = Vec::new();
    loop {
        let page = c.list_sessions(req.clone()).await.unwrap().into_inner();
        pages.push(
            page.sessions
                .iter()
                .map(|s| s.id.clone())
                .collect::<Vec<_>>(),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        req.page_token = page.next_page_token;
    }
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(pages.concat(), ids, "every session once, newest first");
    let refused = c
        .list_sessions(pb::ListSessionsRequest {
            page_size: -1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let list = |args: &[&str]| {
        let out = d.dirs.cli(false).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).lines().count(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (lines, note) = list(&["session", "list", "--limit", "5"]);
    assert_eq!(lines, 6, "a header and the newest 5");
    assert!(note.contains("the newest 5"), "{note}");
    let (lines, note) = list(&["session", "list"]);
    assert_eq!(lines, 8, "under the default 100: all");
    assert!(note.is_empty(), "{note}");
    let (lines, _) = list(&["session", "list", "--limit", "0"]);
    assert_eq!(lines, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activities_of_several_mib_are_listed_page_by_page() {
    let mut d = Daemon::start().await;
    let big = "b".repeat(3 * 1024 * 1024);
    let s = d
        .session(Some((
            "big",
            turns(json!([
                {"thinking": big},
                {"thinking": big},
                {"result": "done"}
            ])),
        )))
        .await;
    let acts = d.send(&s.id, "go").await;
    assert_eq!(acts.len(), 3, "{}", acts.len());
    let mut c = d.client().await;
    let first = c
        .list_activities(pb::ListActivitiesRequest {
            session_id: s.id.clone(),
            after_seq: 0,
            limit: 0,
        })
        .await
        .expect("a page, not OUT_OF_RANGE")
        .into_inner()
        .activities;
    assert!(
        !first.is_empty() && first.len() < 3,
        "{} on the first page",
        first.len()
    );
    let history = c
        .get_history(pb::GetHistoryRequest {
            session_id: s.id.clone(),
            limit: 0,
        })
        .await
        .expect("the newest history that fits")
        .into_inner();
    assert!(history.truncated);
    assert_eq!(history.items.last().unwrap().content, "done");
    // `session logs` follows the pages to the end.
    let out = d
        .dirs
        .cli(false)
        .args(["--json", "session", "logs", s.id.as_str()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(lines >= 3, "{lines} activities printed");
}
