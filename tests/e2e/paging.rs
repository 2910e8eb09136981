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

/// Issue 16: a list carries what it shows. ListSessions' `view` (extension) BASIC leaves out a
/// session's settings and options and cuts its task, live or ended; unset is every field, as
/// GetSession gives it; an unknown view is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_basic_view_carries_what_a_list_shows() {
    let mut d = Daemon::start().await;
    let task = "é".repeat(300); // 600 bytes: cut at 256, on a character boundary
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut req = d.request(None).await;
        req.initial_message = task.clone();
        req.timeout = Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        });
        req.provider_config
            .insert("permissions".into(), "ask".into());
        ids.push(d.create(req).await.id);
    }
    // One ended (read from the store), one live (from the loop).
    d.stop(&ids[0], false).await.unwrap();
    d.wait_status(&ids[0], pb::SessionStatus::Stopped).await;
    let mut c = d.client().await;
    let list = |view: pb::SessionView| pb::ListSessionsRequest {
        include_terminated: true,
        view: view.into(),
        ..Default::default()
    };
    // Twice: the second reads the ended session's row as the first list left it.
    for _ in 0..2 {
        let basic = c.list_sessions(list(pb::SessionView::Basic)).await.unwrap();
        let basic = basic.into_inner().sessions;
        assert_eq!(basic.len(), 2);
        for s in &basic {
            let full = d.get(&s.id).await;
            assert!(s.provider_config.is_empty() && s.timeout.is_none(), "{s:?}");
            assert_eq!(
                s.environment_spec, None,
                "the host's: unset, as at a create"
            );
            let cut = &s.initial_message;
            assert!(cut.starts_with(&"é".repeat(128)), "{cut}");
            assert!(cut.ends_with("… [truncated 344 bytes]"), "{cut}");
            // Every other field as GetSession gives it.
            let expected = pb::SessionInfo {
                provider_config: Default::default(),
                timeout: None,
                environment_spec: None,
                initial_message: cut.clone(),
                ..full.clone()
            };
            assert_eq!(s, &expected);
            assert_eq!(full.initial_message, task);
            assert_eq!(full.provider_config["permissions"], "ask");
            assert_eq!(full.environment_spec.unwrap().driver, "local");
        }
        for view in [pb::SessionView::Unspecified, pb::SessionView::Full] {
            let page = c.list_sessions(list(view)).await.unwrap().into_inner();
            for s in page.sessions {
                assert_eq!(s, d.get(&s.id).await, "{view:?}: as GetSession");
            }
        }
    }
    let refused = c
        .list_sessions(pb::ListSessionsRequest {
            view: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("view 9"),
        "{}",
        refused.message()
    );
    // The table shows the task's start; --json every field of every session.
    let out = d
        .dirs
        .cli(false)
        .args(["session", "list", "--all"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        table.matches(&format!("{}…", "é".repeat(39))).count(),
        2,
        "{table}"
    );
    let out = d
        .dirs
        .cli(false)
        .args(["--json", "session", "list", "--all"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for s in json.as_array().unwrap() {
        assert_eq!(s["initial_message"], json!(task));
        assert_eq!(s["provider_config"]["permissions"], "ask");
    }
}
