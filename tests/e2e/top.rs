//! `paddock top` in a real 80×24 terminal (tmux): every session listed, the one waiting for a
//! human first and marked, live updates from the daemon's streams, and its keys acting for real.

use paddock_proto::obey::local::v1 as pb;
use serde_json::json;

use crate::harness::*;
use crate::terminal::Tmux;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_who_waits_first_and_its_keys_act() {
    let mut d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    // An idle session, and one whose turn asks permission for Bash.
    let mut req = d.request(None).await;
    req.agent_name = "idle-one".into();
    d.create(req).await;
    let mut req = d
        .request(Some((
            "asking",
            json!({"turns": [{"steps": [
                {"thinking": "I need to clean the build directory."},
                {"ask": "Bash", "input": {"command": "rm -rf build"}, "allowed_result": "removed build/"},
                {"result": "Done: {answer}"}
            ]}]}),
        )))
        .await;
    req.provider_config
        .insert("permissions".into(), "ask".into());
    req.agent_name = "needs-me".into();
    let asking = d.create(req).await;

    tmux.spawn_sized(&d, "top", (80, 24), &["top"]);
    tmux.wait_for("top", "both sessions", |s| {
        s.contains("idle-one") && s.contains("needs-me")
    })
    .await;

    // The turn starts while top watches: the request arrives live, and its row goes first.
    let turn = d
        .client()
        .await
        .send_message(pb::SendMessageRequest {
            session_id: asking.id.clone(),
            message: "clean up".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let s = tmux
        .wait_for("top", "the request, first", |s| {
            s.lines()
                .find(|l| l.contains("needs-me") || l.contains("idle-one"))
                .is_some_and(|first| first.starts_with("! needs-me") && first.contains("asks: "))
        })
        .await;
    assert!(s.contains("1 waiting for you"), "{s}");
    assert!(s.contains("a approves · d denies"), "{s}");
    for line in s.lines() {
        assert!(line.chars().count() <= 80, "fits 80 columns: {line:?}");
    }

    // `a` approves it: the turn goes on and ends with what the agent was told.
    tmux.keys("top", &["a"]);
    let rest = collect_ok(turn).await;
    let last = rest.last().expect("the turn ended");
    assert_eq!(kind(last), "COMPLETION", "{rest:?}");
    assert!(last.content.contains("removed build/"), "{rest:?}");
    tmux.wait_for("top", "nobody waiting", |s| s.contains("0 waiting for you"))
        .await;

    // `s` stops the selected (first) session; `x` then `y` deletes it.
    tmux.keys("top", &["s"]);
    d.wait_status(&asking.id, pb::SessionStatus::Stopped).await;
    tmux.wait_for("top", "it stopped", |s| s.contains("stopped"))
        .await;
    tmux.keys("top", &["x"]);
    tmux.wait_for("top", "the question", |s| s.contains("y/N"))
        .await;
    tmux.keys("top", &["y"]);
    tmux.wait_for("top", "it is gone", |s| {
        !s.contains("needs-me") && s.contains("idle-one")
    })
    .await;
    let all = d.all_sessions().await;
    assert_eq!(all.len(), 1, "deleted: {all:?}");
    assert_eq!(
        all[0].agent_name, "idle-one",
        "the session acted on was deleted"
    );

    // Enter attaches to the selected session; Ctrl-D detaches, back to the dashboard.
    tmux.keys("top", &["Enter"]);
    tmux.wait_for("top", "the attach screen", |s| {
        s.contains("Ctrl-D detaches")
    })
    .await;
    tmux.keys("top", &["C-d"]);
    tmux.wait_for("top", "the dashboard again", |s| {
        s.contains("paddock top") && s.contains("idle-one")
    })
    .await;

    // Attached again, the session is stopped from elsewhere: attach says so, its line editor
    // lets go of the terminal, and the dashboard is back and takes keys.
    tmux.keys("top", &["Enter"]);
    tmux.wait_for("top", "the attach screen", |s| {
        s.contains("Ctrl-D detaches")
    })
    .await;
    d.stop(&all[0].id, false).await.unwrap();
    tmux.wait_for("top", "the dashboard after the session ended", |s| {
        s.contains("paddock top") && s.contains("idle-one") && s.contains("stopped")
    })
    .await;

    // q quits, and the terminal is given back.
    tmux.keys("top", &["q"]);
    tmux.wait_for("top", "the exit", |s| s.contains("[exit 0]"))
        .await;
}
