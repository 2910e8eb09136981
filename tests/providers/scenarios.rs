//! Scenarios every agent must pass, written once and run against each provider through its
//! [`Kit`]: how its world starts (the daemon and its fake model server), how its fake model is
//! told to call the agent's shell tool, how a session of it is made, and which of its processes
//! must go when it stops. Each provider's file has one `#[tokio::test]` per scenario that
//! names its kit (so a test keeps its name and its `#[ignore]`).

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;

use crate::harness::*;

/// One provider, as the scenarios drive it.
pub(crate) trait Kit: Sized {
    /// Starts the daemon and the provider's fake model server.
    async fn start() -> Self;

    fn world(&self) -> &World;

    fn world_mut(&mut self) -> &mut World;

    /// Scripts the fake model's next turn: a call of the agent's shell tool running `command`,
    /// then `text` as its answer; with `usage`, the (input, output) tokens the model reports
    /// with each of the two.
    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>);

    /// Scripts the fake model's next answer: none, ever (the request hangs).
    fn push_hang(&self);

    /// Scripts the fake model's next answer: `text`. By default the world's own fake, the
    /// Anthropic API.
    fn push_text(&self, text: &str) {
        self.world()
            .fake
            .push([crate::fake_anthropic::Reply::text(text)]);
    }

    /// The kinds of a turn the model answers with text.
    const ANSWERED: &'static [&'static str] = &["TEXT", "COMPLETION"];

    /// Waits until the fake model has received `n` requests.
    async fn wait_model_requests(&self, n: usize);

    /// The request that makes a session of this provider.
    fn request(&self) -> pb::CreateSessionRequest;

    /// A new session of this provider, RUNNING.
    async fn session(&self) -> pb::SessionInfo {
        self.world().create(self.request()).await
    }

    /// The process that is the agent itself (the CLI; for paddock's own loop, its bridge).
    async fn agent(&self, s: &pb::SessionInfo) -> u32;

    /// A word of the command line of the session's own process (its pid: the agent, or the
    /// bridge that runs it).
    const WORD: &'static str = "__bridge";

    /// The agent's processes that a stop must end, each with a word of its command line (a
    /// reused pid running something else counts as gone), as seen while a tool runs.
    async fn agent_processes(&self, s: &pb::SessionInfo) -> Vec<(u32, &'static str)> {
        vec![(s.pid as u32, Self::WORD)]
    }

    /// How long the tool's processes may outlive a forced stop.
    const TOOL_GONE_WITHIN: Duration = Duration::from_secs(5);

    /// What this provider also checks once the tool runs (its pid given).
    fn tool_started(&self, _s: &pb::SessionInfo, _tool: u32) {}

    /// What this provider also checks once the session ended and its processes are gone, its
    /// model having been asked `asked` times in the turn.
    async fn after_end(&self, _asked: usize) {}

    /// The kinds of the activities of a turn whose model's usage crosses the token budget
    /// ([`budget_crossed_by_real_usage`]): an agent that reports usage as it goes is cut
    /// mid-turn (an ERROR ends it), one that reports it with the turn's end completes first.
    const BUDGET_TURN: &'static [&'static str] = &["TOOL_CALL", "TOOL_RESULT", "TEXT", "ERROR"];

    /// The (input, output) tokens such a session counts: what the model reported (Claude Code
    /// counts one output token a call, from the stream's start).
    const BUDGET_TOKENS: (i64, i64) = (3100, 20);

    /// What this provider also checks of that turn's activities (which carry the tokens).
    fn budget_turn(&self, _acts: &[pb::SessionActivityEvent]) {}
}

/// For the agents that talk to the fake Anthropic API (Claude Code, Claude's ACP adapter): a
/// turn of one `Bash` call running `command`, then `text` (see [`Kit::push_shell_turn`]).
pub(crate) fn push_bash_turn(w: &World, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
    use crate::fake_anthropic::Reply;
    let call = Reply::tool(
        "Bash",
        serde_json::json!({"command": command, "description": "Run it"}),
    );
    w.fake
        .push(costing([call, Reply::text(text)], usage, |r, i, o| {
            r.usage(i, 0, o)
        }));
}

/// For the agents that talk to the fake Anthropic API: `status` as the next answer (after a 400
/// the CLI and the SDK try again without some betas: each of those gets it too).
pub(crate) fn push_anthropic_error(w: &World, status: u16) {
    let times = if status == 400 { 20 } else { 1 };
    w.fake
        .push([crate::fake_anthropic::Reply::error(status).times(times)]);
}

/// A turn's two replies, each with its (input, output) tokens when `usage` is given (`cost`
/// sets them on a fake's reply).
pub(crate) fn costing<R>(
    [call, answer]: [R; 2],
    usage: Option<[(u64, u64); 2]>,
    cost: impl Fn(R, u64, u64) -> R,
) -> [R; 2] {
    match usage {
        None => [call, answer],
        Some([(i1, o1), (i2, o2)]) => [cost(call, i1, o1), cost(answer, i2, o2)],
    }
}

/// A word no other process has on its command line.
pub(crate) fn nonce() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        % 100_000;
    format!("{}{n}", std::process::id())
}

/// A forced stop while the agent's shell tool runs a long command: the turn's stream ends with
/// an ERROR, the session is STOPPED, and the tool's processes and the agent's go with it, long
/// before the command would have ended (the file it writes after its sleep is never written).
pub(crate) async fn stop_during_a_tool_call<K: Kit>() {
    let k = K::start().await;
    let w = k.world();
    // A sleep no other process has on its command line. (A bare `sleep 30` is refused by
    // Claude Code's Bash tool: "Blocked: standalone sleep".)
    let nap = format!("sleep 30.{}", nonce());
    k.push_shell_turn(
        &format!("echo napping > nap.txt && {nap} && echo woke >> nap.txt"),
        "Woke up.",
        None,
    );
    let s = k.session().await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let mut stream = w.send_stream(&s.id, "Take a nap.").await;
    let first = next(&mut stream).await.expect("the tool call");
    assert_eq!(kind(&first), "TOOL_CALL", "{first:?}");
    wait_file_content(&w.root.join("nap.txt"), "napping\n", WAIT).await;
    let deadline = Instant::now() + WAIT;
    while processes_with(&nap).is_empty() {
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    k.tool_started(&s, processes_with(&nap)[0]);
    let agent = k.agent_processes(&s).await;

    let t0 = Instant::now();
    let stopped = w.stop(&s.id, false).await.expect("forced stop");
    assert_eq!(stopped.status, S::Stopped as i32, "{stopped:?}");
    let mut rest = vec![first];
    rest.extend(collect(stream).await);
    assert_eq!(kind(rest.last().unwrap()), "ERROR", "{rest:#?}");
    wait_no_process(&nap, K::TOOL_GONE_WITHIN).await;
    assert!(
        t0.elapsed() < K::TOOL_GONE_WITHIN + Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    for (pid, word) in agent {
        wait_gone_with(pid, word).await;
    }
    k.after_end(1).await;
    assert_eq!(
        std::fs::read_to_string(w.root.join("nap.txt")).unwrap(),
        "napping\n"
    );
}

/// The agent is killed (SIGKILL) while its turn waits for the model: the turn ends with an
/// ERROR saying OBEY-2031 and the signal, the session is FAILED with OBEY-2031 and no pid, and
/// nothing of the agent is left.
pub(crate) async fn killed_mid_turn<K: Kit>() {
    let k = K::start().await;
    let w = k.world();
    k.push_hang();
    let s = k.session().await;
    let stream = w.send_stream(&s.id, "Think hard.").await;
    k.wait_model_requests(1).await;
    let agent = k.agent(&s).await;
    let processes = k.agent_processes(&s).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let acts = collect(stream).await;
    let last = acts.last().expect("an activity");
    assert_eq!(kind(last), "ERROR", "{acts:#?}");
    assert!(last.content.starts_with("OBEY-2031"), "{}", last.content);
    assert!(
        last.content.contains("killed by signal 9"),
        "{}",
        last.content
    );
    let info = w.wait_status(&s.id, S::Failed).await;
    assert_eq!(info.error_code, "OBEY-2031");
    assert_eq!(info.pid, 0);
    for (pid, word) in processes {
        wait_gone_with(pid, word).await;
    }
    k.after_end(1).await;
}

/// A session with a token budget of 2,000 whose model reports 1,500 input tokens for its tool
/// call and 1,600 for its answer: the real usage crosses the budget within the turn. The
/// session is FAILED with OBEY-2013 and counts what the model reported, the tool did its work,
/// a next message is refused with OBEY-2013, and the agent is gone.
pub(crate) async fn budget_crossed_by_real_usage<K: Kit>() {
    let k = K::start().await;
    let w = k.world();
    k.push_shell_turn(
        "echo a > a.txt",
        "This answer crosses the budget.",
        Some([(1500, 10), (1600, 10)]),
    );
    let mut req = k.request();
    req.max_tokens = 2000;
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Write a.txt, then answer.").await;
    assert_eq!(kinds(&acts), K::BUDGET_TURN, "{acts:#?}");
    if kind(acts.last().unwrap()) == "ERROR" {
        let e = &acts.last().unwrap().content;
        assert!(e.starts_with("OBEY-2013"), "{e}");
    }
    k.budget_turn(&acts);
    let info = w.wait_status(&s.id, S::Failed).await;
    assert_eq!(info.error_code, "OBEY-2013", "{info:?}");
    let (input, output) = K::BUDGET_TOKENS;
    assert_eq!((info.tokens_input, info.tokens_output), (input, output));
    assert!(
        info.error_message
            .contains(&format!("{} of 2000", input + output)),
        "{}",
        info.error_message
    );
    assert_eq!(
        std::fs::read_to_string(w.root.join("a.txt")).unwrap(),
        "a\n"
    );
    let e = within(w.client().await.send_message(pb::SendMessageRequest {
        session_id: s.id.clone(),
        message: "More?".into(),
    }))
    .await
    .expect_err("the budget is spent");
    assert!(e.message().contains("OBEY-2013"), "{}", e.message());
    wait_gone_with(s.pid as u32, K::WORD).await;
    k.after_end(2).await;
}

/// A provider whose agent turns a model API error into its turn's ERROR, as
/// [`model_api_errors`] drives it.
pub(crate) trait ApiErrors: Kit {
    /// The name of the turns' snapshot.
    const SNAPSHOT: &'static str;

    /// The turns, in order: the API status the fake model answers with, or `None` for a turn
    /// it answers ("Recovered.").
    const TURNS: &'static [Option<u16>];

    /// How the ERROR of a turn answered with status S starts: this, then
    /// `: API error status S`.
    const AGENT: &'static str;

    /// Scripts the fake model's next answer: `status` (as often as the agent asks again). By
    /// default the world's own fake, the Anthropic API.
    fn push_error(&self, status: u16) {
        push_anthropic_error(self.world(), status);
    }

    /// What this provider also checks of the words of the ERROR that ended a turn answered
    /// with `status`.
    fn error_words(&self, _status: u16, _content: &str) {}

    /// A turn's activities as the snapshot has them.
    fn render(&self, acts: &[pb::SessionActivityEvent]) -> serde_json::Value {
        self.world().render(acts)
    }

    /// What this provider also checks once every turn was sent.
    fn after_turns(&self) {}
}

/// Model API errors (5xx, 429, 4xx): each ends its turn with one ERROR carrying the status and
/// the server's words, never retried away into a hang, and the session lives on — RUNNING,
/// the same process — for the next message, which the model answers.
pub(crate) async fn model_api_errors<K: ApiErrors>() {
    const MESSAGES: [&str; 5] = ["one", "two", "three", "four", "five"];
    assert!(K::TURNS.len() <= MESSAGES.len());
    let k = K::start().await;
    let w = k.world();
    for turn in K::TURNS {
        match turn {
            Some(status) => k.push_error(*status),
            None => k.push_text("Recovered."),
        }
    }
    let s = k.session().await;
    let mut turns = Vec::new();
    for (turn, msg) in K::TURNS.iter().zip(MESSAGES) {
        let acts = w.send(&s.id, msg).await;
        match turn {
            None => assert_eq!(kinds(&acts), K::ANSWERED, "{acts:#?}"),
            Some(status) => {
                assert_eq!(kinds(&acts), ["ERROR"], "{acts:#?}");
                let e = &acts[0].content;
                let said = format!("{}: API error status {status}", K::AGENT);
                assert!(e.starts_with(&said), "{e}");
                assert!(e.contains("fake"), "{e}");
                k.error_words(*status, e);
            }
        }
        let info = w.get(&s.id).await;
        assert_eq!(info.status, S::Running as i32, "{info:?}");
        assert_eq!(info.pid, s.pid);
        turns.push(serde_json::json!({ "message": msg, "activities": k.render(&acts) }));
    }
    k.after_turns();
    insta::assert_yaml_snapshot!(K::SNAPSHOT, serde_json::Value::Array(turns));
    w.stop(&s.id, true).await.expect("stop");
}

/// A provider whose agent keeps its conversation across turns, a session restart (a new
/// process told to resume it) and a crash of the daemon (the agent lives on in the runner), as
/// [`conversation_survives_restarts`] drives it.
pub(crate) trait Conversation: Kit {
    /// The id of the conversation the agent keeps, once it answered a turn: what a restarted
    /// process is told to resume (`--resume ID`). By default the one its first request names.
    fn conversation(&self) -> String {
        self.sent()[0]
            .conversation
            .clone()
            .expect("the agent's requests name their conversation")
    }

    /// Every request the fake model received, in order. By default the world's own fake's
    /// (the Anthropic API: the CLI names its conversation in a header).
    fn sent(&self) -> Vec<Sent> {
        self.world()
            .fake
            .message_requests()
            .iter()
            .map(|r| Sent {
                texts: r.texts(),
                conversation: r.headers.get("x-claude-code-session-id").cloned(),
            })
            .collect()
    }

    /// What the request after the daemon's crash carries at least, in order.
    const AFTER_CRASH: &'static [&'static str] = &[
        "Remember the word swordfish.",
        "What was the word?",
        "And now?",
        "Still swordfish after a session restart.",
        "And after the crash?",
    ];

    /// Whether the daemon's crash is part of it.
    const CRASH: bool = true;

    /// The (input, output) tokens a session counts for each answer, when checked.
    const TOKENS_PER_ANSWER: Option<(i64, i64)> = Some((100, 10));

    /// What this provider also checks once the session was stopped.
    async fn after_conversation(&self, _s: &pb::SessionInfo) {}
}

/// A request the fake model received: its texts, and the conversation it names (if its agent
/// sends one).
pub(crate) struct Sent {
    pub texts: Vec<String>,
    pub conversation: Option<String>,
}

/// Turns keep the conversation; a session restart starts a new process told to resume it (and
/// the model sees the whole conversation); the daemon dies (SIGKILL) and the next one takes the
/// same process back, whose next turn still has it.
pub(crate) async fn conversation_survives_restarts<K: Conversation>() {
    const TURNS: [(&str, &str); 4] = [
        ("Remember the word swordfish.", "Noted: swordfish."),
        ("What was the word?", "You said swordfish."),
        ("And now?", "Still swordfish after a session restart."),
        (
            "And after the crash?",
            "Still swordfish after a daemon restart.",
        ),
    ];
    let mut k = K::start().await;
    let turns = if K::CRASH { 4 } else { 3 };
    for (_, answer) in &TURNS[..turns] {
        k.push_text(answer);
    }
    let s = k.session().await;
    turn(&k, &s.id, TURNS[0]).await;
    turn(&k, &s.id, TURNS[1]).await;
    let (m, a) = (TURNS.map(|t| t.0), TURNS.map(|t| t.1));
    assert_in_order(&k.sent()[1].texts, &[m[0], a[0], m[1]]);
    let conv = k.conversation();

    // A session restart: a new process, told to resume the conversation.
    let r = k.world().restart(&s.id).await;
    assert_eq!(r.restart_count, 1);
    assert_ne!(r.pid, s.pid);
    let args = cmdline(r.pid as u32);
    assert!(
        args.contains(&format!("--resume {conv}")),
        "the restarted process was not resumed: {args}"
    );
    turn(&k, &s.id, TURNS[2]).await;
    assert_in_order(&k.sent()[2].texts, &[m[0], a[0], m[1], a[1], m[2]]);

    if K::CRASH {
        // The daemon dies; the agent lives on in the runner and the next daemon takes it
        // back: the same process, the same conversation.
        let before = k.world().get(&s.id).await;
        k.world_mut().kill9();
        k.world_mut().launch().await;
        let f = k.world().get(&s.id).await;
        assert_eq!(f.status, S::Running as i32, "{}", f.error_message);
        assert_eq!(f.pid, before.pid);
        assert_eq!(f.restart_count, 1);
        turn(&k, &s.id, TURNS[3]).await;
        assert_in_order(&k.sent()[3].texts, K::AFTER_CRASH);
    }
    let sent = k.sent();
    assert_eq!(sent.len(), turns);
    // Every request that names its conversation names the one resumed.
    for r in &sent {
        if let Some(c) = &r.conversation {
            assert_eq!(*c, conv);
        }
    }
    if let Some((input, output)) = K::TOKENS_PER_ANSWER {
        let info = k.world().get(&s.id).await;
        let n = turns as i64;
        assert_eq!(
            (info.tokens_input, info.tokens_output),
            (n * input, n * output)
        );
    }
    k.world().stop(&s.id, true).await.expect("stop");
    k.after_conversation(&s).await;
}

/// Sends `message` and checks the turn was answered with `answer`.
async fn turn<K: Kit>(k: &K, id: &str, (message, answer): (&str, &str)) {
    let acts = k.world().send(id, message).await;
    assert_eq!(kinds(&acts), K::ANSWERED, "{acts:#?}");
    assert!(acts.iter().any(|a| a.content == answer), "{acts:#?}");
}
