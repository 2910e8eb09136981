//! The ACP bridge: any agent that speaks the Agent Client Protocol (JSON-RPC 2.0, one message
//! per line, on its stdio) — OpenClaw (`openclaw acp`), `gemini --acp`, the Claude and Codex
//! ACP adapters from npm.
//!
//! The bridge is the ACP *client*. It starts the agent (`provider_config.command`, split like a
//! shell would), then:
//!
//! 1. `initialize` (protocol version 1; no file-system or terminal capabilities: the agent
//!    uses its own tools, in its own working directory, which is the campaign root);
//! 2. `session/new` (`cwd` = the campaign root) — or, given `--resume <id>`, `session/resume`
//!    when the agent offers it, else `session/load` (whose replay of the old conversation is
//!    not reported again); the session id goes to the daemon as `system/init`;
//! 3. `provider_config.mode` → `session/set_mode`; the session's model → the agent's `model`
//!    session config option (`session/set_config_option`), or `session/set_model` for agents
//!    that still list `models` (refused with the agent's own list when it does not offer it);
//! 4. per user message, `session/prompt`, translating `session/update` notifications until its
//!    response ends the turn.
//!
//! | agent says | daemon sees |
//! |---|---|
//! | `agent_thought_chunk` (accumulated) | `THINKING` |
//! | `agent_message_chunk` (accumulated) | `STATUS` when a tool call or thought follows; the last one is the turn's `COMPLETION` |
//! | `tool_call` | `TOOL_CALL` (tool = `_meta.claudeCode.toolName`, else the `kind`, input = `rawInput`) |
//! | `tool_call_update` with status `completed` / `failed` | `TOOL_RESULT` (content text, success = not failed) |
//! | `plan` | `STATUS` (`Plan:` and a `[x]` / `[~]` / `[ ]` line per step, as for every agent) |
//! | `user_message_chunk`, `available_commands_update`, `current_mode_update`, `config_option_update`, `session_info_update`, `usage_update`, `_…` extensions | nothing |
//! | `session/request_permission` | a `can_use_tool` prompt to the daemon; its answer picks the agent's `allow_once` / `reject_once` option |
//! | `session/prompt` result: `end_turn` | `COMPLETION`, with the response's `usage` when the agent reports it |
//! | `session/prompt` result: `max_tokens`, `max_turn_requests`, `refusal`, `cancelled` | `ERROR` (`acp: stopped (max_tokens): …`) |
//! | `session/prompt` error | `ERROR` with the agent's message |
//! | any other line | passed through raw (stored and counted by the daemon) |
//!
//! Requests the bridge does not serve (`fs/*`, `terminal/*`: not advertised) are answered with
//! JSON-RPC's "method not found", so the agent never waits on us. When the agent exits, the
//! bridge dies the same way ([`super::die_like`]) once what the agent printed was handled (at
//! most [`paddock_sys::proc::DRAIN_AFTER_EXIT`] later, should something it left behind hold its
//! stdout): an ACP agent lives as long as its session. A line longer than
//! [`paddock_sys::proc::LINE_BYTES_MAX`] is not parsed: what fits is passed on as unrecognized.
//!
//! `PADDOCK_BRIDGE_TRACE=<file>` appends every line exchanged with the agent to that file
//! (`>` sent, `<` received): how a new agent's behaviour is recorded.
//!
//! Why not the official `agent-client-protocol` SDK (reviewed at 5.2 with its schema crate
//! 1.17): its connection layer is an async framework of its own (roles, proxies, MCP-over-ACP;
//! its API was rewritten between 0.10 and 5.x) where this client needs three blocking threads;
//! it reads lines without a bound, drops lines that are not JSON-RPC (kept here as raw output)
//! and has no trace; and its typed v1 schema lacks what agents send today (the Claude adapter's
//! `_meta.claudeCode.toolName`, the `models` list / `session/set_model` that older agents still
//! use, end-of-turn `usage` only behind an unstable feature), so a typed client would need the
//! same `Value` escape hatches. The JSON-RPC part here is ~100 lines: requests by id with a
//! timeout, answers routed back, unknown requests answered "method not found".

use std::collections::HashMap;
use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::wire::{push_limited, Buf, Decision, In, Out, TurnEnd, Usage, TEXT_MAX};
use super::{Bridge, Error, TurnExit};
use crate::agent_command;

/// The ACP protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// Permission prompts of the agent's waiting for an answer at once, at most.
const MAX_OPEN_PROMPTS: usize = 32;
static OPEN_PROMPTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How long the agent may take to answer a set-up request (`initialize`, `session/new`, …).
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// A JSON-RPC error from the agent (or the bridge's own, code 0, when the agent is gone).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{} (JSON-RPC error {})", self.message, self.code)
        }
    }
}

impl std::error::Error for RpcError {}

type Reply = Result<Value, RpcError>;

/// The bridge's side of the JSON-RPC connection: requests out, answers routed back by id.
struct Rpc {
    stdin: Mutex<ChildStdin>,
    next_id: AtomicU64,
    pending: super::wire::Waiters<u64, Reply>,
    trace: Option<Mutex<std::fs::File>>,
}

impl Rpc {
    fn send(&self, msg: &Value) {
        let line = msg.to_string();
        self.trace(">", &line);
        let mut w = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        // A write error means the agent is gone; its exit is reported by the reader.
        let _ = w
            .write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .and_then(|_| w.flush());
    }

    fn trace(&self, dir: &str, line: &str) {
        if let Some(t) = &self.trace {
            let mut f = t.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(f, "{dir} {line}");
        }
    }

    /// Sends a request; the receiver gets its answer.
    fn request(&self, method: &str, params: Value) -> mpsc::Receiver<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.pending.wait_for(id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx
    }

    /// A request whose answer is awaited for at most `timeout`.
    fn call(&self, method: &str, params: Value, timeout: Duration) -> Reply {
        match self.request(method, params).recv_timeout(timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(RpcError {
                code: 0,
                message: format!("the agent did not answer {method} within {timeout:?}"),
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }

    fn respond(&self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn respond_error(&self, id: &Value, code: i64, message: &str) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        );
    }

    /// The agent is gone: every waiting caller learns it.
    fn fail_all(&self) {
        self.pending.close();
    }
}

fn gone() -> RpcError {
    RpcError {
        code: 0,
        message: "the agent exited".into(),
    }
}

/// Runs the ACP bridge.
pub fn run(bridge: &Bridge) -> Result<(), Error> {
    let provider = if bridge.config.contains_key("command") {
        paddock_core::Provider::Acp
    } else {
        paddock_core::Provider::OpenClaw
    };
    let argv = agent_command(provider, &bridge.config)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // In the bridge's group, with the session's tag; this thread runs the bridge to its end,
    // and the agent lives no longer than it.
    paddock_sys::proc::die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| Error::StartAcp {
        program: argv[0].clone(),
        source,
    })?;
    let trace = std::env::var_os("PADDOCK_BRIDGE_TRACE").and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
            .map(Mutex::new)
    });
    let rpc = Arc::new(Rpc {
        stdin: Mutex::new(child.stdin.take().expect("piped")),
        next_id: AtomicU64::new(0),
        pending: Default::default(),
        trace,
    });
    let tail = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("piped");
    let keep = tail.clone();
    std::thread::spawn(move || super::pass_stderr(stderr, &keep));

    let translator = Arc::new(Mutex::new(Translator::default()));
    let replaying = Arc::new(AtomicBool::new(false));
    let stdout = child.stdout.take().expect("piped");
    {
        let waiter_rpc = rpc.clone();
        let (rpc, out, tr, replaying) = (
            rpc.clone(),
            bridge.out.clone(),
            translator.clone(),
            replaying.clone(),
        );
        let asker = bridge.input.clone();
        // The reader: every line in order; it ends at EOF (or when the agent's exit is known).
        let reader = std::thread::spawn(move || {
            for line in
                paddock_sys::proc::BlockingLines::new(stdout, paddock_sys::proc::LINE_BYTES_MAX)
            {
                let text = line.text();
                if line.cut_bytes > 0 {
                    // Not a message we could parse whole: kept (cut), never acted on.
                    out.raw(&text);
                    continue;
                }
                if text.trim().is_empty() {
                    continue;
                }
                rpc.trace("<", &text);
                on_agent_line(&text, &rpc, &out, &tr, &replaying, &asker);
            }
        });
        // The waiter: the agent lives as long as its session, so its exit — noticed even if
        // something it left behind holds its stdout — ends the bridge the same way, once the
        // reader has handled what the agent printed (at most DRAIN_AFTER_EXIT).
        std::thread::spawn(move || {
            let status = child.wait();
            let deadline = std::time::Instant::now() + paddock_sys::proc::DRAIN_AFTER_EXIT;
            while !reader.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            waiter_rpc.fail_all();
            use std::os::unix::process::ExitStatusExt;
            let exit = TurnExit {
                code: status.as_ref().ok().and_then(|s| s.code()),
                signal: status.as_ref().ok().and_then(|s| s.signal()),
                stderr_tail: tail.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            };
            super::die_like(&exit, "ACP agent");
        });
    }

    // 1. initialize
    let init = rpc
        .call(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false},
                "clientInfo": {"name": "paddock", "version": env!("CARGO_PKG_VERSION")},
            }),
            SETUP_TIMEOUT,
        )
        .map_err(|source| Error::Rpc {
            call: "initialize".into(),
            source,
        })?;
    let caps = &init["agentCapabilities"];
    let cwd = bridge.cwd.display().to_string();
    // The client's tools, from paddock's MCP server: a socket this bridge serves, given to the
    // agent as a stdio MCP server of the session (`paddock __mcp-relay`), as ACP clients offer
    // their own tools.
    let served = super::mcp_socket::serve_client_tools(bridge)?;
    let mcp_servers = match &served {
        Some(s) => json!([{
            "name": crate::mcp::SERVER,
            "command": s.exe.display().to_string(),
            "args": s.relay_args(),
            "env": [],
        }]),
        None => json!([]),
    };

    // 2. the session: continued or new
    let (session_id, setup) = match &bridge.resume {
        Some(id) => {
            let params = json!({"sessionId": id, "cwd": cwd, "mcpServers": mcp_servers});
            let r = if caps["sessionCapabilities"]["resume"].is_object() {
                rpc.call("session/resume", params, SETUP_TIMEOUT)
            } else if caps["loadSession"] == json!(true) {
                replaying.store(true, Ordering::SeqCst);
                let r = rpc.call("session/load", params, SETUP_TIMEOUT);
                replaying.store(false, Ordering::SeqCst);
                r
            } else {
                return Err(Error::NoResume { id: id.clone() });
            };
            let r = r.map_err(|source| Error::Resume {
                id: id.clone(),
                source,
            })?;
            (id.clone(), r)
        }
        None => {
            let r = rpc
                .call(
                    "session/new",
                    json!({"cwd": cwd, "mcpServers": mcp_servers}),
                    SETUP_TIMEOUT,
                )
                .map_err(|source| Error::Rpc {
                    call: "session/new".into(),
                    source,
                })?;
            let id = r["sessionId"]
                .as_str()
                .ok_or_else(|| Error::NoSessionId(r.clone()))?
                .to_string();
            (id, r)
        }
    };
    bridge.out.init(&session_id);

    // 3. mode and model
    if let Some(mode) = bridge.config("mode") {
        rpc.call(
            "session/set_mode",
            json!({"sessionId": session_id, "modeId": mode}),
            SETUP_TIMEOUT,
        )
        .map_err(|source| Error::Rpc {
            call: format!("session/set_mode {mode:?}"),
            source,
        })?;
    }
    if !bridge.model.is_empty() {
        set_model(&rpc, &session_id, &bridge.model, &setup)?;
    }

    // 4. turns
    while let Some(text) = bridge.input.next_user() {
        let rx = rpc.request(
            "session/prompt",
            json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}),
        );
        let reply = rx.recv().unwrap_or_else(|_| Err(gone()));
        if reply.as_ref().err() == Some(&gone()) {
            // The reader reports the agent's exit (and ends this process); wait for it.
            std::thread::sleep(Duration::from_secs(5));
        }
        let final_text = translator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .end_turn(&bridge.out);
        bridge.out.result(&turn_end(reply, final_text, &session_id));
    }
    Ok(())
}

/// The values a `select` session config option offers (its options, grouped or not).
fn select_values(option: &Value) -> Vec<&str> {
    option["options"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .flat_map(|o| match o["options"].as_array() {
            Some(group) => group.iter().collect::<Vec<_>>(),
            None => vec![o],
        })
        .filter_map(|o| o["value"].as_str())
        .collect()
}

/// Chooses the session's model the way the agent offers it: ACP's session config option of
/// category `model` (`session/set_config_option`, what current agents do), else the older
/// `models` list (`session/set_model`). A model the agent does not offer is refused with the
/// agent's own list.
fn set_model(rpc: &Rpc, session_id: &str, model: &str, setup: &Value) -> Result<(), Error> {
    let option = setup["configOptions"].as_array().and_then(|opts| {
        opts.iter()
            .find(|o| o["type"] == "select" && (o["category"] == "model" || o["id"] == "model"))
    });
    let (offered, method, params) = match option {
        Some(o) => (
            select_values(o),
            "session/set_config_option",
            json!({"sessionId": session_id, "configId": o["id"], "value": model}),
        ),
        None => (
            setup["models"]["availableModels"]
                .as_array()
                .map(|a| a.iter().filter_map(|m| m["modelId"].as_str()).collect())
                .unwrap_or_default(),
            "session/set_model",
            json!({"sessionId": session_id, "modelId": model}),
        ),
    };
    if offered.is_empty() {
        // The agent lists no models: nothing to choose with.
        eprintln!("paddock bridge: the ACP agent lists no models; model {model:?} is not applied");
        return Ok(());
    }
    if !offered.contains(&model) {
        return Err(Error::ModelNotOffered {
            model: model.to_string(),
            offered: offered.iter().map(|m| m.to_string()).collect(),
        });
    }
    rpc.call(method, params, SETUP_TIMEOUT)
        .map(|_| ())
        .map_err(|source| Error::Rpc {
            call: format!("{method} {model:?}"),
            source,
        })
}

/// How a `session/prompt` answer ends the turn.
fn turn_end(reply: Reply, final_text: String, session_id: &str) -> TurnEnd {
    let mut end = TurnEnd {
        session_id: Some(session_id.to_string()),
        ..Default::default()
    };
    match reply {
        Ok(r) => {
            end.usage = usage_of(&r["usage"]);
            let stop = r["stopReason"].as_str().unwrap_or("end_turn");
            if stop == "end_turn" {
                end.text = final_text;
            } else {
                end.is_error = true;
                end.text = if final_text.is_empty() {
                    format!("stopped ({stop})")
                } else {
                    format!("stopped ({stop}): {final_text}")
                };
            }
        }
        Err(e) => {
            end.is_error = true;
            end.api_error_status = api_status_in(&e.message);
            end.text = e.message;
        }
    }
    end
}

/// ACP has no field for a model API's HTTP status; agents put it in their error text
/// (Claude's adapter: `Internal error: API Error: 500 …`).
fn api_status_in(message: &str) -> Option<u16> {
    let at = message.find("API Error: ")? + "API Error: ".len();
    let digits = message.get(at..at + 3)?;
    digits.parse().ok().filter(|s| (400..600).contains(s))
}

/// ACP's (draft) end-of-turn usage: `inputTokens`, `outputTokens`, `cachedReadTokens`, …
fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    Usage {
        input_tokens: n("inputTokens") + n("cachedWriteTokens"),
        cache_read_input_tokens: n("cachedReadTokens"),
        output_tokens: n("outputTokens"),
        ..Usage::default()
    }
}

/// One line from the agent.
fn on_agent_line(
    line: &str,
    rpc: &Arc<Rpc>,
    out: &Out,
    tr: &Mutex<Translator>,
    replaying: &AtomicBool,
    asker: &Arc<In>,
) {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        out.raw(line);
        return;
    };
    let method = v["method"].as_str();
    let id = v.get("id").filter(|i| !i.is_null());
    match (method, id) {
        // An answer to one of our requests.
        (None, Some(id)) => {
            if let Some(n) = id.as_u64() {
                let reply = match v.get("error") {
                    Some(e) => Err(RpcError {
                        code: e["code"].as_i64().unwrap_or(0),
                        message: e["message"].as_str().unwrap_or("error").to_string(),
                    }),
                    None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                };
                rpc.pending.answer(&n, reply);
            }
        }
        // A notification.
        (Some("session/update"), None) => {
            if replaying.load(Ordering::SeqCst) {
                return;
            }
            let handled = tr
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_update(&v["params"]["update"], out);
            if !handled {
                out.raw(line);
            }
        }
        (Some(m), None) if m.starts_with('_') => {} // extensions: nothing for us
        (Some(_), None) => out.raw(line),
        // A request from the agent.
        (Some("session/request_permission"), Some(id)) => {
            let (rpc, id, params, asker) =
                (rpc.clone(), id.clone(), v["params"].clone(), asker.clone());
            // What the agent said before it asked, and the call itself, go to the daemon first.
            let (tool, input) = tr
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .before_permission(&v["params"]["toolCall"], out);
            // Answered on a thread of its own: the answer may take a while (a human, later),
            // and the agent's other messages must keep flowing meanwhile. At most
            // MAX_OPEN_PROMPTS at once: beyond, the agent is refused at once.
            if OPEN_PROMPTS.fetch_add(1, Ordering::SeqCst) >= MAX_OPEN_PROMPTS {
                OPEN_PROMPTS.fetch_sub(1, Ordering::SeqCst);
                let refused = Decision::Deny("too many permission prompts at once".into());
                rpc.respond(&id, permission_outcome(&params["options"], &refused));
                return;
            }
            std::thread::spawn(move || {
                let decision = asker.ask(&tool, &input);
                rpc.respond(&id, permission_outcome(&params["options"], &decision));
                OPEN_PROMPTS.fetch_sub(1, Ordering::SeqCst);
            });
        }
        (Some(m), Some(id)) => {
            rpc.respond_error(id, -32601, &format!("paddock does not serve {m}"));
        }
        (None, None) => out.raw(line),
    }
}

/// The option that carries out `decision`: `allow_once` (else `allow_always`) to allow,
/// `reject_once` (else `reject_always`) to deny; without one, the prompt is cancelled.
fn permission_outcome(options: &Value, decision: &Decision) -> Value {
    let kinds: &[&str] = match decision {
        Decision::Allow(_) | Decision::Result { .. } => &["allow_once", "allow_always"],
        Decision::Deny(_) => &["reject_once", "reject_always"],
    };
    let options = options.as_array().map(Vec::as_slice).unwrap_or(&[]);
    for k in kinds {
        if let Some(o) = options.iter().find(|o| o["kind"] == *k) {
            if let Some(id) = o["optionId"].as_str() {
                return json!({"outcome": {"outcome": "selected", "optionId": id}});
            }
        }
    }
    json!({"outcome": {"outcome": "cancelled"}})
}

/// A tool call's name and input: Claude's adapter names the tool in `_meta`; otherwise the
/// ACP `kind` (read, edit, execute, …) is the best name there is.
fn tool_of(call: &Value) -> (String, Value) {
    let name = call["_meta"]["claudeCode"]["toolName"]
        .as_str()
        .or_else(|| call["name"].as_str())
        .or_else(|| call["kind"].as_str())
        .unwrap_or("tool");
    // A client tool (paddock's MCP server) is named as the client named it.
    let name = name
        .strip_prefix(crate::mcp::TOOL_PREFIX)
        .unwrap_or(name)
        .to_string();
    let input = match call.get("rawInput") {
        Some(v) if has_input(v) => v.clone(),
        _ => match call["title"].as_str() {
            Some(t) => json!({ "title": t }),
            None => json!({}),
        },
    };
    (name, input)
}

/// `session/update` → wire lines, with message and thought chunks gathered into whole texts.
#[derive(Default)]
pub struct Translator {
    text: String,
    thought: String,
    /// Tool calls reported and not yet finished, by id.
    open_tools: HashMap<String, OpenTool>,
    /// Tool calls finished this turn: late updates about them are ignored.
    finished: std::collections::HashSet<String>,
}

/// A tool call between its `tool_call` and its end. Agents announce a call before they know
/// its input (Claude's adapter: `rawInput: {}`, "Preparing file…") and fill it in with an
/// update, so the `TOOL_CALL` is reported when the call is about to run: when its status
/// becomes `in_progress`, `completed` or `failed`, or when the agent asks permission for it.
struct OpenTool {
    name: String,
    input: Value,
    reported: bool,
}

fn has_input(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Object(m) => !m.is_empty(),
        _ => true,
    }
}

impl Translator {
    /// `false` for an update this client does not know.
    pub fn on_update(&mut self, u: &Value, out: &Out) -> bool {
        let Some(kind) = u["sessionUpdate"].as_str() else {
            return false;
        };
        match kind {
            "agent_message_chunk" => {
                self.flush_thought(out);
                push_limited(&mut self.text, &chunk_text(&u["content"]), TEXT_MAX);
            }
            "agent_thought_chunk" => {
                self.flush_text(out);
                push_limited(&mut self.thought, &chunk_text(&u["content"]), TEXT_MAX);
            }
            "tool_call" | "tool_call_update" => {
                if kind == "tool_call" {
                    self.flush_text(out);
                    self.flush_thought(out);
                }
                self.on_tool(u, out);
            }
            "plan" => {
                self.flush_text(out);
                use super::wire::Step;
                let steps = u["entries"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .map(|e| {
                        let step = match e["status"].as_str() {
                            Some("completed") => Step::Done,
                            Some("in_progress") => Step::InProgress,
                            _ => Step::Pending,
                        };
                        (step, e["content"].as_str().unwrap_or(""))
                    });
                out.text(&super::wire::plan_text(steps));
            }
            "user_message_chunk"
            | "available_commands_update"
            | "current_mode_update"
            | "config_option_update"
            | "session_info_update"
            | "usage_update" => {}
            _ => return false,
        }
        true
    }

    /// A `tool_call` or `tool_call_update`: learn its name and input, report it when it is
    /// about to run, and its result once when it ends.
    fn on_tool(&mut self, u: &Value, out: &Out) {
        let Some(id) = u["toolCallId"].as_str() else {
            return;
        };
        if self.finished.contains(id) {
            return;
        }
        let tool = self.open_tools.entry(id.to_string()).or_insert(OpenTool {
            name: String::new(),
            input: Value::Null,
            reported: false,
        });
        // The adapter's own tool name wins over ACP's `kind`; a real input over a title.
        let (name, input) = tool_of(u);
        if u["_meta"]["claudeCode"]["toolName"].is_string()
            || u["name"].is_string()
            || (tool.name.is_empty() && u["kind"].is_string())
        {
            tool.name = name;
        }
        if has_input(&u["rawInput"]) || (tool.input.is_null() && u["title"].is_string()) {
            tool.input = input;
        }
        let status = u["status"].as_str().unwrap_or("");
        if matches!(status, "in_progress" | "completed" | "failed") {
            self.report_tool(id, out);
        }
        if matches!(status, "completed" | "failed") {
            self.open_tools.remove(id);
            self.finished.insert(id.to_string());
            let mut text = tool_content_text(&u["content"]);
            if text.is_empty() {
                if let Some(raw) = u.get("rawOutput").filter(|r| !r.is_null()) {
                    text = match raw.as_str() {
                        Some(s) => s.to_string(),
                        None => raw.to_string(),
                    };
                }
            }
            out.tool_result(id, &text, status == "failed");
        }
    }

    /// Reports tool call `id` (once), with what is known of it by now.
    pub fn report_tool(&mut self, id: &str, out: &Out) {
        if let Some(t) = self.open_tools.get_mut(id) {
            if !t.reported {
                t.reported = true;
                let name = if t.name.is_empty() { "tool" } else { &t.name };
                out.tool_use(id, name, &t.input);
            }
        }
    }

    /// A permission prompt carries the call's latest name and input: the call is reported
    /// before asking, and its name and input, as this translator knows them, are what is asked.
    pub fn before_permission(&mut self, call: &Value, out: &Out) -> (String, Value) {
        self.flush_text(out);
        self.flush_thought(out);
        let mut u = call.clone();
        u["status"] = Value::Null;
        self.on_tool(&u, out);
        let Some(id) = call["toolCallId"].as_str() else {
            return tool_of(call);
        };
        self.report_tool(id, out);
        match self.open_tools.get(id) {
            Some(t) => (t.name.clone(), t.input.clone()),
            None => tool_of(call),
        }
    }

    /// What the agent said since its last tool call or thought, as narration.
    pub fn flush_text(&mut self, out: &Out) {
        if !self.text.trim().is_empty() {
            out.text(self.text.trim());
        }
        self.text.clear();
    }

    fn flush_thought(&mut self, out: &Out) {
        if !self.thought.trim().is_empty() {
            out.thinking(self.thought.trim());
        }
        self.thought.clear();
    }

    /// The turn is over: its last words are the answer (returned, not printed).
    pub fn end_turn(&mut self, out: &Out) -> String {
        self.flush_thought(out);
        self.open_tools.clear();
        self.finished.clear();
        std::mem::take(&mut self.text).trim().to_string()
    }
}

/// Runs recorded `session/update`s through a [`Translator`] and what it prints through the
/// daemon's reader: one line per activity (`KIND [tool] content`). For snapshot tests of
/// recorded agent output.
#[doc(hidden)]
pub fn translate_for_test(updates: &[Value]) -> String {
    let buf = Buf::default();
    let out = Out::to_writer("acp", Box::new(buf.clone()));
    let mut t = Translator::default();
    let mut unknown = 0;
    for u in updates {
        if !t.on_update(u, &out) {
            unknown += 1;
        }
    }
    let answer = t.end_turn(&out);
    let text = buf.text();
    let mut p = crate::claude_stream::ClaudeStreamParser::new();
    let mut lines: Vec<String> = text
        .lines()
        .flat_map(|l| p.parse_line(l))
        .filter_map(|x| match x {
            crate::claude_stream::Parsed::Event(paddock_core::ProviderEvent::Activity(a)) => Some(
                format!("{} [{}] {}", a.kind().name(), a.tool_name, a.content),
            ),
            _ => None,
        })
        .collect();
    lines.push(format!("answer: {answer}"));
    lines.push(format!("unknown updates: {unknown}"));
    lines.join("\n")
}

fn chunk_text(c: &Value) -> String {
    match c["type"].as_str() {
        Some("text") => c["text"].as_str().unwrap_or("").to_string(),
        Some("image") => "[image]".into(),
        Some("resource_link") => format!("[{}]", c["uri"].as_str().unwrap_or("link")),
        _ => String::new(),
    }
}

/// A tool call's `content`: text blocks, diffs (`edited <path>`), terminals.
fn tool_content_text(c: &Value) -> String {
    let Some(items) = c.as_array() else {
        return String::new();
    };
    items
        .iter()
        .map(|item| match item["type"].as_str() {
            Some("content") => chunk_text(&item["content"]),
            Some("diff") => format!("edited {}", item["path"].as_str().unwrap_or("a file")),
            Some("terminal") => format!("[terminal {}]", item["terminalId"].as_str().unwrap_or("")),
            _ => String::new(),
        })
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claude_stream::{self, ClaudeStreamParser};
    use paddock_core::ProviderEvent;

    fn activities(buf: &Buf) -> Vec<String> {
        let text = buf.text();
        let mut p = ClaudeStreamParser::new();
        text.lines()
            .flat_map(|l| p.parse_line(l))
            .map(|x| match x {
                claude_stream::Parsed::Event(ProviderEvent::Activity(a)) => {
                    format!("{} {} {}", a.kind().name(), a.tool_name, a.content)
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn updates_become_whole_texts_tool_calls_and_results() {
        let buf = Buf::default();
        let out = Out::to_writer("acp", Box::new(buf.clone()));
        let mut t = Translator::default();
        let updates = [
            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "Let me "}}),
            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "look."}}),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Listing."}}),
            json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "ls", "kind": "execute", "status": "pending", "rawInput": {"command": "ls"}, "_meta": {"claudeCode": {"toolName": "Bash"}}}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "README.md"}}]}),
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
            json!({"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "Write x", "kind": "edit", "status": "failed", "rawInput": {"file_path": "/x"}, "rawOutput": "denied"}),
            json!({"sessionUpdate": "plan", "entries": [{"content": "a", "status": "completed"}, {"content": "b", "status": "pending"}]}),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "All "}}),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "done."}}),
            json!({"sessionUpdate": "usage_update", "used": 10, "size": 100}),
        ];
        for u in &updates {
            assert!(t.on_update(u, &out), "{u}");
        }
        assert!(!t.on_update(&json!({"sessionUpdate": "brand_new"}), &out));
        assert_eq!(t.end_turn(&out), "All done.");
        assert_eq!(
            activities(&buf),
            [
                "THINKING  Let me look.",
                "TEXT  Listing.",
                "TOOL_CALL Bash ls",
                "TOOL_RESULT Bash README.md",
                "TOOL_CALL edit /x",
                "TOOL_RESULT edit denied",
                "TEXT  Plan:\n[x] a\n[ ] b",
            ]
        );
    }

    #[test]
    fn permission_answers_pick_the_agents_own_options() {
        let options = json!([
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "always", "name": "Always", "kind": "allow_always"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        ]);
        assert_eq!(
            permission_outcome(&options, &Decision::Allow(json!({})))["outcome"]["optionId"],
            "yes"
        );
        assert_eq!(
            permission_outcome(&options, &Decision::Deny("x".into()))["outcome"]["optionId"],
            "no"
        );
        let only_allow = json!([{"optionId": "ok", "kind": "allow_always"}]);
        assert_eq!(
            permission_outcome(&only_allow, &Decision::Deny("x".into()))["outcome"]["outcome"],
            "cancelled"
        );
    }

    #[test]
    fn prompt_answers_end_turns() {
        let e = turn_end(
            Ok(
                json!({"stopReason": "end_turn", "usage": {"inputTokens": 10, "outputTokens": 5, "cachedReadTokens": 100}}),
            ),
            "hi".into(),
            "s",
        );
        assert!(!e.is_error);
        assert_eq!(e.text, "hi");
        assert_eq!(
            e.usage,
            Usage {
                input_tokens: 10,
                cache_read_input_tokens: 100,
                output_tokens: 5,
                ..Usage::default()
            }
        );
        let e = turn_end(Ok(json!({"stopReason": "max_tokens"})), "".into(), "s");
        assert!(e.is_error);
        assert_eq!(e.text, "stopped (max_tokens)");
        let e = turn_end(
            Err(RpcError {
                code: -32603,
                message: "Internal error: API Error: 500".into(),
            }),
            "".into(),
            "s",
        );
        assert!(e.is_error);
        assert_eq!(e.text, "Internal error: API Error: 500");
    }
}
