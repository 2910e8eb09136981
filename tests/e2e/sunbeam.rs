//! sunbeam's `CodeAgent.Session` stream over the daemon's socket, with the scripted agent:
//! a whole turn (snapshot), detach and resume with history, two clients on one session, the
//! project context reaching the agent, EndSession, a failed session restarted on resume, and
//! the fatal and non-fatal errors.

use paddock_proto::obey::local::v1 as obey;
use paddock_proto::sunbeam::code::v1 as sb;
use sb::client_message::Payload as In;
use sb::server_message::Payload as Out;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::harness::*;

/// One client stream.
struct Client {
    tx: Option<mpsc::Sender<sb::ClientMessage>>,
    rx: tonic::Streaming<sb::ServerMessage>,
}

impl Client {
    async fn open(d: &Daemon) -> Client {
        let ch = paddock::transport::channel(&d.dirs.socket)
            .await
            .expect("connect");
        let mut c = sb::code_agent_client::CodeAgentClient::new(ch);
        let (tx, rx) = mpsc::channel(16);
        let stream = within(c.session(ReceiverStream::new(rx)))
            .await
            .expect("open the session stream")
            .into_inner();
        Client {
            tx: Some(tx),
            rx: stream,
        }
    }

    async fn send(&self, p: In) {
        self.tx
            .as_ref()
            .expect("sending side open")
            .send(sb::ClientMessage { payload: Some(p) })
            .await
            .expect("send");
    }

    async fn input(&self, text: &str) {
        self.send(In::Input(sb::UserInput { text: text.into() }))
            .await;
    }

    /// The next server message; None at the stream's end. A gRPC error fails the test.
    async fn next(&mut self) -> Option<Out> {
        match next(&mut self.rx).await {
            Some(Ok(m)) => Some(m.payload.expect("a payload")),
            Some(Err(e)) => panic!("stream error: {e:?}"),
            None => None,
        }
    }

    async fn expect(&mut self) -> Out {
        self.next().await.expect("the stream ended early")
    }

    /// Messages up to and including the first that `stop` accepts.
    async fn until(&mut self, stop: impl Fn(&Out) -> bool) -> Vec<Out> {
        let mut out = Vec::new();
        loop {
            let m = self.expect().await;
            let done = stop(&m);
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// One turn's messages, through its TextDone (or Error).
    async fn turn(&mut self) -> Vec<Out> {
        self.until(|m| matches!(m, Out::Done(_) | Out::Error(_)))
            .await
    }

    async fn ready(&mut self) -> sb::SessionReady {
        match self.expect().await {
            Out::Ready(r) => r,
            other => panic!("expected SessionReady, got {other:?}"),
        }
    }

    /// Asserts the server ends the stream next.
    async fn assert_ended(&mut self) {
        if let Some(m) = self.next().await {
            panic!("expected the stream to end, got {m:?}");
        }
    }
}

fn start(d: &Daemon) -> sb::StartSession {
    sb::StartSession {
        project_path: d.dirs.root.display().to_string(),
        model: "scripted".into(),
        ..Default::default()
    }
}

/// A start with a script (written to scripts/<name>.json) as its provider_config.
fn start_with_script(d: &Daemon, name: &str, script: Value) -> sb::StartSession {
    let rel = d.dirs.script(name, &script);
    sb::StartSession {
        config_toml: format!("[provider_config]\nscript = \"{rel}\"\n"),
        ..start(d)
    }
}

async fn attach(d: &Daemon, s: sb::StartSession) -> (Client, sb::SessionReady) {
    let mut c = Client::open(d).await;
    c.send(In::Start(s)).await;
    let r = c.ready().await;
    (c, r)
}

fn fatal_error(m: Option<Out>) -> String {
    match m {
        Some(Out::Error(e)) if e.fatal => e.message,
        other => panic!("expected a fatal Error, got {other:?}"),
    }
}

fn kind_name(k: i32) -> &'static str {
    sb::StatusKind::try_from(k)
        .map(|k| k.as_str_name())
        .unwrap_or("?")
}

/// A server message as JSON for snapshots.
fn render(r: &Redact, m: &Out) -> Value {
    match m {
        Out::Ready(x) => json!({"ready": {
            "session_id": r.apply(&x.session_id), "room_id": "<campaign>", "model": x.model,
            "resumed": x.resumed,
            "history": x.history.iter().map(|h| json!([h.role, r.apply(&h.content)])).collect::<Vec<_>>(),
        }}),
        Out::Delta(x) => json!({"delta": r.apply(&x.text)}),
        Out::Done(x) => json!({"done": {
            "full_text": r.apply(&x.full_text),
            "input_tokens": x.input_tokens, "output_tokens": x.output_tokens,
        }}),
        Out::ToolCall(x) => json!({"tool_call": {
            "call_id": x.call_id, "name": x.name, "args_json": r.apply(&x.args_json),
            "is_local": x.is_local, "needs_approval": x.needs_approval,
        }}),
        Out::Approval(x) => json!({"approval": x.call_id}),
        Out::Status(x) => json!({"status": [kind_name(x.kind), r.apply(&x.message)]}),
        Out::End(x) => json!({"end": r.apply(&x.summary)}),
        Out::Error(x) => json!({"error": {"message": r.apply(&x.message), "fatal": x.fatal}}),
    }
}

fn done(turn: &[Out]) -> &sb::TextDone {
    match turn.last() {
        Some(Out::Done(d)) => d,
        other => panic!("the turn did not end with TextDone: {other:?}"),
    }
}

/// The built-in scripted answer's text for `message` in the test project.
fn builtin_answer(message: &str) -> String {
    format!(
        "The directory has 4 entries: README.md, notes.txt, scripts/, src/\n\n\
         You said: \"{message}\". The working directory has 4 entries."
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_turn_detach_and_resume() {
    let d = Daemon::start().await;
    let (mut c, ready) = attach(&d, start(&d)).await;
    assert!(!ready.resumed);
    assert!(ready.history.is_empty());
    assert_eq!(ready.model, "scripted");
    assert!(ready.session_id.starts_with("sess_"), "{ready:?}");
    // The project became a campaign of its own, named after its directory.
    let campaigns = campaigns(&d).await;
    assert_eq!(campaigns.len(), 1);
    assert_eq!(campaigns[0].id, ready.room_id);
    assert_eq!(campaigns[0].name, "project");
    assert_eq!(campaigns[0].root_path, d.dirs.root.display().to_string());

    c.input("hello").await;
    let turn = c.turn().await;
    let r = Redact::new(&d).session(&ready.session_id);
    let mut all = vec![render(&r, &Out::Ready(ready.clone()))];
    all.extend(turn.iter().map(|m| render(&r, m)));
    insta::assert_json_snapshot!("sunbeam_turn", all);
    // The scripted agent's formula: input 100 + 2·⌊len/4⌋, output 30.
    let td = done(&turn);
    assert_eq!((td.input_tokens, td.output_tokens), (102, 30));
    assert_eq!(td.full_text, builtin_answer("hello"));
    let deltas: String = turn
        .iter()
        .filter_map(|m| match m {
            Out::Delta(x) => Some(x.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, td.full_text);

    // Detach: drop the stream. The session goes on: it still takes work (here from an obey
    // client) while no sunbeam client is attached.
    drop(c);
    let meanwhile = d.send(&ready.session_id, "while away").await;
    assert_eq!(kind(meanwhile.last().unwrap()), "COMPLETION");
    let s = d.get(&ready.session_id).await;
    assert_eq!(status_name(s.status), "RUNNING");

    let (mut c2, again) = attach(&d, start(&d)).await;
    assert!(again.resumed);
    assert_eq!(again.session_id, ready.session_id);
    assert_eq!(again.room_id, ready.room_id);
    let history: Vec<(String, String)> = again
        .history
        .iter()
        .map(|h| (h.role.clone(), h.content.clone()))
        .collect();
    assert_eq!(
        history,
        [
            ("user".to_string(), "hello".to_string()),
            ("assistant".to_string(), builtin_answer("hello")),
            ("user".to_string(), "while away".to_string()),
            ("assistant".to_string(), builtin_answer("while away")),
        ]
    );
    // And the resumed stream works.
    c2.input("more please").await;
    let t2 = c2.turn().await;
    assert_eq!(done(&t2).full_text, builtin_answer("more please"));
    assert_eq!(done(&t2).input_tokens, 100 + 2 * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_project_context_reaches_the_agent() {
    let d = Daemon::start().await;
    let script = turns(json!([
        {"text": "{system_prompt}"},
        {"result": "Read it."}
    ]));
    let s = sb::StartSession {
        prompt_md: "Always run the tests.".into(),
        git_branch: "feature-x".into(),
        git_status: " M src/main.rs".into(),
        file_tree: vec!["README.md".into(), "src/main.rs".into()],
        ..start_with_script(&d, "context", script)
    };
    let (mut c, ready) = attach(&d, s).await;
    c.input("what do you know?").await;
    let turn = c.turn().await;
    let text = &done(&turn).full_text;
    let root = d.dirs.root.display().to_string();
    let expected = format!(
        "# Project context (from the sunbeam client)\n\n\
         Project root: {root}\n\
         Git branch: feature-x\n\n\
         ## git status\n\n```\n M src/main.rs\n```\n\n\
         ## Files (2 of 2)\n\nREADME.md\nsrc/main.rs\n\n\
         ## Project instructions\n\nAlways run the tests.\n"
    );
    assert_eq!(text, &format!("{expected}\n\nRead it."));
    // The agent's own command line carries it, as Claude Code's would.
    let pid = d.get(&ready.session_id).await.pid;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let i = argv
        .iter()
        .position(|a| a == "--append-system-prompt")
        .expect("--append-system-prompt in the agent's argv");
    assert_eq!(argv[i + 1], expected);
}

/// Clients that start on a new project at the same moment share one session: which session a
/// project gets is one step of the core, so only one of them makes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_clients_starting_at_once_share_one_session() {
    let d = Daemon::start().await;
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(Client::open(&d).await);
    }
    for c in &clients {
        c.send(In::Start(start(&d))).await;
    }
    let mut readies = Vec::new();
    for c in &mut clients {
        readies.push(c.ready().await);
    }
    let ids: std::collections::BTreeSet<&str> =
        readies.iter().map(|r| r.session_id.as_str()).collect();
    assert_eq!(ids.len(), 1, "one session for the project: {readies:?}");
    let made = readies.iter().filter(|r| !r.resumed).count();
    assert_eq!(made, 1, "exactly one client made it: {readies:?}");
    assert_eq!(d.all_sessions().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_two_clients_see_every_turn() {
    let d = Daemon::start().await;
    let (mut a, ra) = attach(&d, start(&d)).await;
    let (mut b, rb) = attach(&d, start(&d)).await;
    assert!(rb.resumed);
    assert_eq!(ra.session_id, rb.session_id);
    let r = Redact::new(&d).session(&ra.session_id);

    a.input("from a").await;
    let ta: Vec<Value> = a.turn().await.iter().map(|m| render(&r, m)).collect();
    let tb: Vec<Value> = b.turn().await.iter().map(|m| render(&r, m)).collect();
    assert_eq!(ta, tb);
    assert_eq!(
        ta.last().unwrap()["done"]["full_text"],
        json!(builtin_answer("from a"))
    );

    // Input from the other client works, and both see that turn too.
    b.input("from b").await;
    let tb2: Vec<Value> = b.turn().await.iter().map(|m| render(&r, m)).collect();
    let ta2: Vec<Value> = a.turn().await.iter().map(|m| render(&r, m)).collect();
    assert_eq!(ta2, tb2);
    assert_eq!(
        ta2.last().unwrap()["done"]["full_text"],
        json!(builtin_answer("from b"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_end_session_stops_and_is_not_resumed() {
    let d = Daemon::start().await;
    let (mut c, ready) = attach(&d, start(&d)).await;
    let (mut watcher, _) = attach(&d, start(&d)).await;
    c.input("hello").await;
    c.turn().await;
    watcher.turn().await;
    c.send(In::End(sb::EndSession {})).await;
    let end = c.until(|m| matches!(m, Out::End(_))).await;
    let Some(Out::End(e)) = end.last() else {
        unreachable!()
    };
    assert_eq!(
        e.summary,
        "1 turn, 102 input + 30 output tokens; last answer: You said: \"hello\". \
         The working directory has 4 entries."
    );
    c.assert_ended().await;
    // The other client is told too.
    let w = watcher.until(|m| matches!(m, Out::End(_))).await;
    assert!(matches!(w.last(), Some(Out::End(x)) if x.summary == e.summary));
    watcher.assert_ended().await;
    let s = d.get(&ready.session_id).await;
    assert_eq!(status_name(s.status), "STOPPED");

    // The ended session is not resumed: a new one starts, in the same campaign.
    let (_c2, next) = attach(&d, start(&d)).await;
    assert!(!next.resumed);
    assert_ne!(next.session_id, ready.session_id);
    assert_eq!(next.room_id, ready.room_id);
    assert!(next.history.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_failed_session_is_restarted_on_resume() {
    let d = Daemon::start().await;
    let script = turns(json!([{"thinking": "about to crash"}, {"crash": 3}]));
    let (mut c, ready) = attach(&d, start_with_script(&d, "crash", script.clone())).await;
    c.input("crash now").await;
    let turn = c.turn().await;
    let msg = fatal_error(turn.last().cloned());
    assert!(msg.starts_with("OBEY-2031"), "{msg}");
    c.assert_ended().await;
    d.wait_status(&ready.session_id, obey::SessionStatus::Failed)
        .await;

    // The same project again: the failed session is restarted, not replaced.
    let (mut c2, again) = attach(&d, start_with_script(&d, "crash", script)).await;
    assert!(again.resumed);
    assert_eq!(again.session_id, ready.session_id);
    assert_eq!(again.history[0].content, "crash now");
    let s = d.get(&ready.session_id).await;
    assert_eq!(status_name(s.status), "RUNNING");
    assert_eq!(s.restart_count, 1);
    c2.input("hello").await;
    let t = c2.turn().await;
    // The restarted agent is a new process, attached to this stream: it crashes again.
    assert!(matches!(t.last(), Some(Out::Error(e)) if e.fatal), "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_refusals() {
    let d = Daemon::start().await;

    // The first message must be StartSession.
    let mut c = Client::open(&d).await;
    c.input("hi").await;
    let m = fatal_error(c.next().await);
    assert_eq!(m, "the first message must be StartSession (got UserInput)");
    c.assert_ended().await;

    // A project that does not exist.
    let mut c = Client::open(&d).await;
    let missing = d.dirs.base.join("no-such-project");
    c.send(In::Start(sb::StartSession {
        project_path: missing.display().to_string(),
        ..Default::default()
    }))
    .await;
    let m = fatal_error(c.next().await);
    assert!(
        m.starts_with(&format!(
            "project_path {} cannot be used: ",
            missing.display()
        )),
        "{m}"
    );
    c.assert_ended().await;

    // TOML that does not parse, and keys it does not know.
    for (toml, expected) in [
        ("provider = ", "config_toml is not valid TOML"),
        (
            "provider = \"scripted\"\nmodle = \"x\"\ncolour = \"red\"",
            "config_toml has unknown key(s): colour, modle (known: provider, permissions, \
             max_tokens, timeout, env, provider_config)",
        ),
        (
            "provider = \"nope\"",
            "config_toml: unknown provider \"nope\"",
        ),
    ] {
        let mut c = Client::open(&d).await;
        c.send(In::Start(sb::StartSession {
            config_toml: toml.into(),
            ..start(&d)
        }))
        .await;
        let m = fatal_error(c.next().await);
        assert!(m.starts_with(expected), "{toml:?}: {m}");
        c.assert_ended().await;
    }
    // Client tools paddock refuses (a name twice): refused before the project is registered.
    let mut c = Client::open(&d).await;
    let twice = |name: &str| sb::ToolDef {
        name: name.into(),
        description: String::new(),
        schema_json: String::new(),
    };
    c.send(In::Start(sb::StartSession {
        client_tools: vec![twice("run_tests"), twice("run_tests")],
        ..start(&d)
    }))
    .await;
    let m = fatal_error(c.next().await);
    assert!(
        m.starts_with("provider_config.client_tools: every tool needs a name of its own"),
        "{m}"
    );
    c.assert_ended().await;
    let campaigns = campaigns(&d).await;
    assert!(campaigns.is_empty(), "{campaigns:?}");
    // A model the provider refuses: the core's own error.
    let mut c = Client::open(&d).await;
    c.send(In::Start(sb::StartSession {
        model: "gpt-9".into(),
        ..start(&d)
    }))
    .await;
    assert!(fatal_error(c.next().await).starts_with("OBEY-2003"));
    // Nothing was created by the refused starts.
    let sessions = d.all_sessions().await;
    assert!(sessions.is_empty(), "{sessions:?}");

    // Once attached: answers to nothing pending, a second StartSession, an empty input.
    let (mut c, ready) = attach(&d, start(&d)).await;
    c.send(In::Approval(sb::ToolApproval {
        call_id: "call_1".into(),
        approved: true,
    }))
    .await;
    c.send(In::ToolResult(sb::ToolResult {
        call_id: "call_2".into(),
        result: "ok".into(),
        is_error: false,
    }))
    .await;
    c.send(In::Start(start(&d))).await;
    c.input("  ").await;
    let r = Redact::new(&d).session(&ready.session_id);
    let mut errors = Vec::new();
    for _ in 0..4 {
        errors.push(render(&r, &c.expect().await));
    }
    assert_eq!(
        errors,
        [
            json!({"error": {"message": "OBEY-2040: no open approval request or client-side tool call \"call_1\" in session <session>", "fatal": false}}),
            json!({"error": {"message": "OBEY-2040: no open approval request or client-side tool call \"call_2\" in session <session>", "fatal": false}}),
            json!({"error": {"message": "session <session> is already started on this stream", "fatal": false}}),
            json!({"error": {"message": "UserInput.text is empty", "fatal": false}}),
        ]
    );
    // The stream goes on.
    c.input("still here").await;
    assert_eq!(
        done(&c.turn().await).full_text,
        builtin_answer("still here")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_input_while_busy() {
    let d = Daemon::start().await;
    let (mut c, _) = attach(&d, start_with_script(&d, "slow", slow_turn(1500))).await;
    c.input("first").await;
    let first = c.expect().await;
    assert!(
        matches!(&first, Out::Status(s) if s.kind == sb::StatusKind::Thinking as i32),
        "{first:?}"
    );
    c.input("second").await;
    match c.expect().await {
        Out::Error(e) => {
            assert!(!e.fatal);
            assert!(e.message.starts_with("OBEY-2011"), "{}", e.message);
        }
        other => panic!("expected a non-fatal OBEY-2011 error, got {other:?}"),
    }
    // The running turn goes on and ends as usual.
    let rest = c.turn().await;
    let td = done(&rest);
    assert_eq!(td.full_text, "Still at it\n\nSlow answer to first");
    assert_eq!((td.input_tokens, td.output_tokens), (14, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_attach_mid_turn_replays_the_turn() {
    let d = Daemon::start().await;
    let s = start_with_script(&d, "slow", slow_turn(1000));
    let (mut a, ra) = attach(&d, s.clone()).await;
    a.input("first").await;
    assert!(matches!(a.expect().await, Out::Status(_)));
    // A client attaching while the turn runs gets its message in the history and the whole
    // turn, from its start, as the first client does.
    let (mut b, rb) = attach(&d, s).await;
    assert!(rb.resumed);
    let history: Vec<(&str, &str)> = rb
        .history
        .iter()
        .map(|h| (h.role.as_str(), h.content.as_str()))
        .collect();
    assert_eq!(history, [("user", "first")]);
    let r = Redact::new(&d).session(&ra.session_id);
    let tb: Vec<Value> = b.turn().await.iter().map(|m| render(&r, m)).collect();
    let mut ta = vec![json!({"status": ["THINKING", "Working slowly"]})];
    ta.extend(a.turn().await.iter().map(|m| render(&r, m)));
    assert_eq!(ta, tb);
    assert_eq!(
        tb.last().unwrap()["done"],
        json!({"full_text": "Still at it\n\nSlow answer to first", "input_tokens": 14, "output_tokens": 4})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sunbeam_approvals_client_tools_and_questions() {
    let d = Daemon::start().await;
    let rel = d.dirs.script(
        "asks",
        &turns(json!([
            {"ask": "Bash", "input": {"command": "make"}, "allowed_result": "built"},
            {"client_tool": "run_tests", "input": {"filter": "unit"}},
            {"text": "The tests said: {answer}"},
            {"question": "Which colour?", "options": ["red", "blue"]},
            {"result": "Done: {answer}"}
        ])),
    );
    let tool = |name: &str| sb::ToolDef {
        name: name.into(),
        description: format!("{name}, run by the client"),
        schema_json: r#"{"type":"object"}"#.into(),
    };
    let s = sb::StartSession {
        config_toml: format!("permissions = \"ask\"\n[provider_config]\nscript = \"{rel}\"\n"),
        client_tools: vec![tool("run_tests")],
        ..start(&d)
    };
    let (mut c, ready) = attach(&d, s.clone()).await;
    let (mut watcher, _) = attach(&d, s.clone()).await;
    c.input("build and test").await;

    // A permission: ApprovalNeeded, answered with ToolApproval.
    let mut all = c.until(|m| matches!(m, Out::Approval(_))).await;
    let Some(Out::Approval(ap)) = all.last().cloned() else {
        unreachable!()
    };
    assert_eq!(
        (ap.name.as_str(), ap.summary.as_str()),
        ("Bash", "Bash: make")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&ap.args_json).unwrap(),
        json!({"command": "make"})
    );
    assert_eq!(
        status_name(d.get(&ready.session_id).await.status),
        "WAITING"
    );
    c.send(In::Approval(sb::ToolApproval {
        call_id: ap.call_id.clone(),
        approved: true,
    }))
    .await;

    // A client tool: a local ToolCall whose call_id the result names.
    let local = |m: &Out| matches!(m, Out::ToolCall(t) if t.is_local);
    all.extend(c.until(local).await);
    let Some(Out::ToolCall(tc)) = all.last().cloned() else {
        unreachable!()
    };
    assert_eq!(tc.name, "run_tests");
    assert_ne!(tc.call_id, ap.call_id);
    assert_eq!(
        serde_json::from_str::<Value>(&tc.args_json).unwrap(),
        json!({"filter": "unit"})
    );
    c.send(In::ToolResult(sb::ToolResult {
        call_id: tc.call_id.clone(),
        result: "3 passed".into(),
        is_error: false,
    }))
    .await;

    // A question: a local call of AskUserQuestion, answered with its result.
    all.extend(c.until(local).await);
    let Some(Out::ToolCall(q)) = all.last().cloned() else {
        unreachable!()
    };
    assert_eq!(q.name, "AskUserQuestion");
    assert!(q.args_json.contains("Which colour?"), "{}", q.args_json);
    c.send(In::ToolResult(sb::ToolResult {
        call_id: q.call_id.clone(),
        result: "blue".into(),
        is_error: false,
    }))
    .await;
    let rest = c.turn().await;
    let text = done(&rest).full_text.clone();
    all.extend(rest);
    assert_eq!(
        text,
        "The tests said: 3 passed\n\nDone: User answered: blue"
    );

    let r = Redact::new(&d).session(&ready.session_id);
    let shown: Vec<Value> = all.iter().map(|m| render(&r, m)).collect();
    let has = |v: Value| assert!(shown.contains(&v), "{v} not in {shown:#?}");
    has(json!({"status": ["TOOL_DONE", "Bash"]}));
    has(json!({"status": ["TOOL_DONE", "run_tests"]}));
    // How each request was settled: the core's notes, as notices.
    has(json!({"status": ["INFO", format!("{} approved (sunbeam)", ap.call_id)]}));
    has(json!({"status": ["INFO", format!("{} answered (sunbeam): 3 passed", tc.call_id)]}));
    has(json!({"status": ["INFO", format!("waiting for approval ({}): Bash: make", ap.call_id)]}));
    // The server-side call the policy leaves to a human says it waits for approval.
    let bash: Vec<&sb::ToolCall> = all
        .iter()
        .filter_map(|m| match m {
            Out::ToolCall(t) if t.name == "Bash" => Some(t),
            _ => None,
        })
        .collect();
    assert!(
        !bash.is_empty() && bash.iter().all(|t| t.needs_approval && !t.is_local),
        "{bash:?}"
    );
    // The client tool's call shows once: as the request to run it.
    let run_tests_calls = all
        .iter()
        .filter(|m| matches!(m, Out::ToolCall(t) if t.name == "run_tests"))
        .count();
    assert_eq!(run_tests_calls, 1);

    // The other client was asked the same, and saw the same turn.
    let w = watcher.turn().await;
    assert!(w
        .iter()
        .any(|m| matches!(m, Out::Approval(x) if x.call_id == ap.call_id)));
    assert_eq!(done(&w).full_text, text);

    // An answer to a request already settled is refused (OBEY-2041), and the stream goes on.
    c.send(In::Approval(sb::ToolApproval {
        call_id: ap.call_id.clone(),
        approved: false,
    }))
    .await;
    match c.expect().await {
        Out::Error(e) => assert!(
            !e.fatal && e.message.starts_with("OBEY-2041: approval"),
            "{e:?}"
        ),
        other => panic!("expected an Error, got {other:?}"),
    }

    // Attaching again with a tool the session was not made with: the client is told.
    drop(c);
    let (mut c2, again) = attach(
        &d,
        sb::StartSession {
            client_tools: vec![tool("run_tests"), tool("deploy")],
            ..s
        },
    )
    .await;
    assert!(again.resumed);
    match c2.expect().await {
        Out::Status(st) => {
            assert_eq!(st.kind, sb::StatusKind::Info as i32);
            assert!(
                st.message
                    .starts_with("client tool(s) not offered to the agent: deploy ("),
                "{}",
                st.message
            );
        }
        other => panic!("expected a Status INFO, got {other:?}"),
    }
}

/// AddCampaign without a name: "the campaign of this directory".
/// Every campaign the daemon has.
async fn campaigns(d: &Daemon) -> Vec<obey::Campaign> {
    d.client()
        .await
        .list_campaigns(obey::ListCampaignsRequest {})
        .await
        .unwrap()
        .into_inner()
        .campaigns
}

async fn campaign_of(d: &Daemon, root: String) -> obey::Campaign {
    d.client()
        .await
        .add_campaign(obey::AddCampaignRequest {
            name: String::new(),
            root_path: root,
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_has_one_campaign_for_every_client() {
    let d = Daemon::start().await;
    // `paddock session create --task` here asks the daemon for "the campaign of this directory"
    // (AddCampaign without a name); a sunbeam client for the same project gets the same one.
    let here = campaign_of(&d, d.dirs.root.display().to_string()).await;
    assert_eq!(here.name, "project");
    let (_c, ready) = attach(&d, start(&d)).await;
    assert_eq!(ready.room_id, here.id);
    let again = campaign_of(&d, format!("{}/./", d.dirs.root.display())).await;
    assert_eq!(again.id, here.id);
}
