//! A fake OpenAI Responses API on 127.0.0.1, for codex: plain tokio TCP and a minimal
//! HTTP/1.1 parser, like `fake_anthropic.rs`.
//!
//! What codex-cli 0.169.0 does against it (with `model_provider` pointing here,
//! `wire_api="responses"`): it calls nothing but `POST /v1/responses` (no models list, no
//! other endpoint; anything else gets a 404 with the API's error JSON), one request per model
//! call, each on a new connection (as observed), `content-length` bodies without compression,
//! `"stream": true`, `authorization: Bearer <env_key's value>`, and headers naming the thread
//! (`session-id`, `thread-id`, and `x-codex-turn-metadata`, a JSON string with the thread id
//! and the turn's `sandbox_mode`). The server still reads chunked bodies and serves several
//! requests per connection, in case a later codex does.
//!
//! Each `/v1/responses` request takes the next [`Reply`] and streams it as the real API does:
//! `response.created`, per output item `response.output_item.added` (a message's text also as
//! `response.output_text.delta`) and `response.output_item.done`, then `response.completed`
//! with the usage (`input_tokens` with `input_tokens_details.cached_tokens` — a part of it —,
//! `output_tokens`). Output items: `message` (text), `reasoning` (a summary), `function_call`
//! `exec_command {"cmd": …}` (codex's shell tool), `custom_tool_call` `apply_patch` (its
//! patch tool, freeform), a `function_call` of an MCP server's tool (`namespace`
//! `mcp__<server>`, the tool's bare name: how codex 0.169 routes it, deferred behind its
//! `tool_search` or not). Or an HTTP error with the API's error JSON, or a `response.failed`,
//! or a response that starts and never ends. When the script is used up: a 500 whose message
//! says so.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::fake_http::{respond_json, Conn, Fake, Request};

/// One output item of a scripted response.
#[derive(Debug, Clone)]
pub enum Item {
    Text(String),
    Reasoning(String),
    /// `exec_command` with this command line, and how long codex waits for it (ms).
    Shell {
        cmd: String,
        yield_ms: Option<u64>,
    },
    /// `apply_patch` with this patch.
    Patch(String),
    /// A call of MCP server `server`'s tool `name`, as codex 0.169 routes it: a
    /// `function_call` with `namespace` `mcp__<server>` and the bare tool name.
    Mcp {
        server: String,
        name: String,
        args: Value,
    },
}

#[derive(Debug, Clone)]
pub enum Reply {
    Response {
        items: Vec<Item>,
        input_tokens: u64,
        cached_tokens: u64,
        output_tokens: u64,
    },
    /// An HTTP error with `{"error": {"message", "type"}}`.
    Error { status: u16, message: String },
    /// `response.created`, then `response.failed` with this message.
    Failed(String),
    /// `response.created`, then nothing until the client goes away (or two minutes pass).
    Hang,
}

impl Reply {
    fn response(items: Vec<Item>) -> Reply {
        Reply::Response {
            items,
            input_tokens: 100,
            cached_tokens: 0,
            output_tokens: 10,
        }
    }

    pub fn text(t: &str) -> Reply {
        Reply::response(vec![Item::Text(t.into())])
    }

    pub fn shell(cmd: &str) -> Reply {
        Reply::response(vec![Item::Shell {
            cmd: cmd.into(),
            yield_ms: None,
        }])
    }

    /// A command codex waits for up to `ms` before it answers the model.
    pub fn shell_waiting(cmd: &str, ms: u64) -> Reply {
        Reply::response(vec![Item::Shell {
            cmd: cmd.into(),
            yield_ms: Some(ms),
        }])
    }

    /// The model calls MCP server `server`'s tool `name` with `args`.
    pub fn mcp(server: &str, name: &str, args: Value) -> Reply {
        Reply::response(vec![Item::Mcp {
            server: server.into(),
            name: name.into(),
            args,
        }])
    }

    pub fn patch(p: &str) -> Reply {
        Reply::response(vec![Item::Patch(p.into())])
    }

    pub fn error(status: u16) -> Reply {
        Reply::Error {
            status,
            message: format!("fake {status} from the paddock test server"),
        }
    }

    /// Puts a reasoning item first.
    pub fn thinking(mut self, t: &str) -> Reply {
        if let Reply::Response { items, .. } = &mut self {
            items.insert(0, Item::Reasoning(t.into()));
        }
        self
    }

    /// Puts a message before the other items (after reasoning).
    pub fn saying(mut self, t: &str) -> Reply {
        if let Reply::Response { items, .. } = &mut self {
            let at = items
                .iter()
                .position(|i| !matches!(i, Item::Reasoning(_)))
                .unwrap_or(items.len());
            items.insert(at, Item::Text(t.into()));
        }
        self
    }

    /// The usage the response reports: all input tokens (cached included), the cached part,
    /// output.
    pub fn usage(mut self, input: u64, cached: u64, output: u64) -> Reply {
        if let Reply::Response {
            input_tokens,
            cached_tokens,
            output_tokens,
            ..
        } = &mut self
        {
            *input_tokens = input;
            *cached_tokens = cached;
            *output_tokens = output;
        }
        self
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Which connection it came on (numbered from 1).
    pub connection: u64,
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (`Null` if none or not JSON).
    pub body: Value,
}

impl Recorded {
    /// The texts of `input`, in order: messages' text parts, tool outputs, and tool calls as
    /// `call <name> <arguments or input>`.
    pub fn texts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for i in self.body["input"].as_array().into_iter().flatten() {
            match i["type"].as_str() {
                Some("message") => {
                    for c in i["content"].as_array().into_iter().flatten() {
                        if let Some(t) = c["text"].as_str() {
                            out.push(t.to_string());
                        }
                    }
                }
                Some("function_call_output") | Some("custom_tool_call_output") => {
                    match &i["output"] {
                        Value::String(s) => out.push(s.clone()),
                        other => out.push(other.to_string()),
                    }
                }
                Some("function_call") => out.push(format!(
                    "call {} {}",
                    i["name"].as_str().unwrap_or(""),
                    i["arguments"].as_str().unwrap_or("")
                )),
                Some("custom_tool_call") => out.push(format!(
                    "call {} {}",
                    i["name"].as_str().unwrap_or(""),
                    i["input"].as_str().unwrap_or("")
                )),
                _ => {}
            }
        }
        out
    }

    /// The texts of the user's own messages (not codex's environment context).
    pub fn user_texts(&self) -> Vec<String> {
        self.body["input"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["type"] == "message" && i["role"] == "user")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|c| c["text"].as_str().map(String::from))
            .filter(|t| !t.starts_with('<'))
            .collect()
    }

    /// `x-codex-turn-metadata`, parsed.
    pub fn turn_metadata(&self) -> Value {
        self.headers
            .get("x-codex-turn-metadata")
            .and_then(|m| serde_json::from_str(m).ok())
            .unwrap_or(Value::Null)
    }
}

#[derive(Default)]
pub struct State {
    script: Vec<Reply>,
    next: usize,
    requests: Vec<Recorded>,
    responses: u64,
    connections: u64,
}

crate::scripted!(State, "Responses requests", |r| r.method == "POST"
    && is_responses(&r.path));

/// The running server; it stops when dropped.
pub type FakeResponses = Fake<State>;

impl FakeResponses {
    pub async fn start(script: Vec<Reply>) -> FakeResponses {
        let state = State {
            script,
            ..State::default()
        };
        // Connections are numbered as they are accepted.
        Fake::serve(state, |sock, st, ar| {
            let conn = {
                let mut s = st.lock().unwrap();
                s.connections += 1;
                s.connections
            };
            serve(sock, conn, st, ar)
        })
        .await
    }

    /// `http://127.0.0.1:PORT/v1`, a model provider's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The `POST /v1/responses` requests so far.
    pub fn response_requests(&self) -> Vec<Recorded> {
        self.calls()
    }
}

fn is_responses(path: &str) -> bool {
    path.split('?').next() == Some("/v1/responses")
}

/// Serves requests on one connection until the client closes it.
async fn serve(
    sock: TcpStream,
    conn: u64,
    state: Arc<Mutex<State>>,
    arrived: Arc<Notify>,
) -> std::io::Result<()> {
    let mut http = Conn::new(sock);
    loop {
        let Some(req) = http.next_request().await? else {
            return Ok(());
        };
        let sock = &mut http.sock;
        // A compressed body is recorded as Null (codex 0.169 sends none to a custom provider).
        let json_body = req.json();
        let Request {
            method,
            path,
            headers,
            ..
        } = req;
        let model = json_body["model"]
            .as_str()
            .unwrap_or("gpt-fake")
            .to_string();
        let call = method == "POST" && is_responses(&path);
        let (reply, no) = {
            let mut st = state.lock().unwrap();
            st.requests.push(Recorded {
                connection: conn,
                method: method.clone(),
                path: path.clone(),
                headers,
                body: json_body,
            });
            if call {
                st.responses += 1;
                let r = st.script.get(st.next).cloned();
                st.next += 1;
                let n = st.responses;
                (
                    Some(r.unwrap_or(Reply::Error {
                        status: 500,
                        message: format!("paddock fake server: script exhausted at request {n}"),
                    })),
                    n,
                )
            } else {
                (None, 0)
            }
        };
        arrived.notify_waiters();
        let keep = match reply {
            None => {
                let e = json!({"error": {"message": format!("the fake server has no {method} {path}"),
                    "type": "invalid_request_error", "code": "not_found"}});
                respond_json(sock, 404, &e, false).await?;
                true
            }
            Some(Reply::Error { status, message }) => {
                let kind = if status < 500 {
                    "invalid_request_error"
                } else {
                    "server_error"
                };
                let e = json!({"error": {"message": message, "type": kind}});
                respond_json(sock, status, &e, false).await?;
                true
            }
            Some(Reply::Hang) => {
                start_stream(sock).await?;
                send(sock, &created(no, &model)).await?;
                let mut b = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(120), async {
                    loop {
                        match sock.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                })
                .await;
                false
            }
            Some(Reply::Failed(message)) => {
                start_stream(sock).await?;
                send(sock, &created(no, &model)).await?;
                send(
                    sock,
                    &json!({"type": "response.failed", "response": {
                        "id": format!("resp_{no}"), "object": "response", "status": "failed",
                        "error": {"code": "server_error", "message": message}}}),
                )
                .await?;
                end_stream(sock).await?;
                true
            }
            Some(Reply::Response {
                items,
                input_tokens,
                cached_tokens,
                output_tokens,
            }) => {
                start_stream(sock).await?;
                send(sock, &created(no, &model)).await?;
                let mut output = Vec::new();
                for (k, item) in items.iter().enumerate() {
                    let done = output_item(item, no, k);
                    let mut added = done.clone();
                    if added["type"] == "message" {
                        added["content"] = json!([]);
                        added["status"] = json!("in_progress");
                    }
                    send(
                        sock,
                        &json!({"type": "response.output_item.added", "output_index": k, "item": added}),
                    )
                    .await?;
                    if let Item::Text(t) = item {
                        send(
                            sock,
                            &json!({"type": "response.output_text.delta", "item_id": done["id"],
                                "output_index": k, "content_index": 0, "delta": t}),
                        )
                        .await?;
                    }
                    send(
                        sock,
                        &json!({"type": "response.output_item.done", "output_index": k, "item": done}),
                    )
                    .await?;
                    output.push(done);
                }
                send(
                    sock,
                    &json!({"type": "response.completed", "response": {
                    "id": format!("resp_{no}"), "object": "response", "status": "completed",
                    "model": model, "output": output,
                    "usage": {
                        "input_tokens": input_tokens,
                        "input_tokens_details": {"cached_tokens": cached_tokens},
                        "output_tokens": output_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": input_tokens + output_tokens,
                    }}}),
                )
                .await?;
                end_stream(sock).await?;
                true
            }
        };
        if !keep {
            return Ok(());
        }
    }
}

fn created(no: u64, model: &str) -> Value {
    json!({"type": "response.created", "response": {"id": format!("resp_{no}"),
        "object": "response", "status": "in_progress", "model": model, "output": []}})
}

fn output_item(item: &Item, no: u64, k: usize) -> Value {
    match item {
        Item::Text(t) => json!({"type": "message", "id": format!("msg_{no}_{k}"),
            "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}]}),
        Item::Reasoning(t) => json!({"type": "reasoning", "id": format!("rs_{no}_{k}"),
            "summary": [{"type": "summary_text", "text": t}]}),
        Item::Shell { cmd, yield_ms } => {
            let mut args = json!({"cmd": cmd});
            if let Some(ms) = yield_ms {
                args["yield_time_ms"] = json!(ms);
            }
            json!({"type": "function_call", "id": format!("fc_{no}_{k}"),
                "call_id": format!("call_{no}_{k}"), "name": "exec_command",
                "arguments": args.to_string(), "status": "completed"})
        }
        Item::Mcp { server, name, args } => json!({"type": "function_call",
            "id": format!("fc_{no}_{k}"), "call_id": format!("call_{no}_{k}"),
            "namespace": format!("mcp__{server}"), "name": name,
            "arguments": args.to_string(), "status": "completed"}),
        Item::Patch(p) => json!({"type": "custom_tool_call", "id": format!("ctc_{no}_{k}"),
            "call_id": format!("call_{no}_{k}"), "name": "apply_patch", "input": p,
            "status": "completed"}),
    }
}

/// An SSE response with a chunked body (so the connection can serve another request).
async fn start_stream(sock: &mut TcpStream) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nx-request-id: req_paddock_fake\r\ntransfer-encoding: chunked\r\n\r\n";
    sock.write_all(head.as_bytes()).await
}

async fn send(sock: &mut TcpStream, event: &Value) -> std::io::Result<()> {
    let frame = format!(
        "event: {}\ndata: {}\n\n",
        event["type"].as_str().unwrap_or("message"),
        event
    );
    sock.write_all(format!("{:x}\r\n", frame.len()).as_bytes())
        .await?;
    sock.write_all(frame.as_bytes()).await?;
    sock.write_all(b"\r\n").await?;
    sock.flush().await
}

async fn end_stream(sock: &mut TcpStream) -> std::io::Result<()> {
    sock.write_all(b"0\r\n\r\n").await?;
    sock.flush().await
}
