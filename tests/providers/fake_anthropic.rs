//! A fake Anthropic Messages API on 127.0.0.1: plain tokio TCP and a minimal HTTP/1.1 parser
//! (the CLI sends one `Content-Length` request per connection at a time; every answer closes
//! its connection, so no keep-alive bookkeeping is needed). No HTTP framework: the server is a
//! hundred lines, and a dependency would only add build time to a 2-core CI.
//!
//! Each `POST /v1/messages` (Claude Code 2.1 sends `POST /v1/messages?beta=true` with
//! `"stream": true`) takes the next [`Reply`] of the test's script and answers it as the real
//! API streams: `message_start`, then per block `content_block_start` / `content_block_delta` /
//! `content_block_stop` (thinking with `thinking_delta` + `signature_delta`, text with
//! `text_delta`, tool use with `input_json_delta`), `message_delta` (stop reason, output
//! tokens), `message_stop` — or with an HTTP error and the API's error JSON. Every request is
//! recorded (method, path, headers, JSON body) so tests can check what the CLI sent, e.g. the
//! whole prior conversation in `messages` after a `--resume`.
//!
//! Anything else (a path this server does not know) is a 404 with the API's error JSON; with
//! `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` the CLI 2.1.330 calls nothing but
//! `/v1/messages`. When the script is used up, a request is answered with a 500 whose message
//! says so, so a test that scripted too few replies fails with a readable ERROR.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::fake_http::{respond_json, Conn, Fake, Request};

/// One content block of a scripted answer.
#[derive(Debug, Clone)]
pub enum Block {
    Thinking(String),
    Text(String),
    ToolUse { name: String, input: Value },
}

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A streamed message.
    Message(Message),
    /// An HTTP error with the API's error body, for `repeat` requests (the CLI may try a
    /// request again: after a 400 it retries without some betas, whatever its retry setting).
    Error {
        status: u16,
        kind: String,
        message: String,
        repeat: usize,
    },
}

#[derive(Debug, Clone)]
pub struct Message {
    pub blocks: Vec<Block>,
    /// `input_tokens` of `message_start`.
    pub input_tokens: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
    /// `output_tokens` of `message_delta` (`message_start` says 1, as the real API does).
    pub output_tokens: u64,
    /// After `message_start`, keep the response open without finishing it until the client
    /// goes away (or two minutes pass): the model is "still thinking".
    pub hang: bool,
}

impl Reply {
    fn message(blocks: Vec<Block>) -> Reply {
        Reply::Message(Message {
            blocks,
            input_tokens: 100,
            cache_read: 0,
            cache_creation: 0,
            output_tokens: 10,
            hang: false,
        })
    }

    /// A final text answer (`stop_reason: end_turn`).
    pub fn text(t: &str) -> Reply {
        Reply::message(vec![Block::Text(t.into())])
    }

    /// A tool call (`stop_reason: tool_use`).
    pub fn tool(name: &str, input: Value) -> Reply {
        Reply::message(vec![Block::ToolUse {
            name: name.into(),
            input,
        }])
    }

    /// A response that starts and never finishes.
    pub fn hang() -> Reply {
        let mut r = Reply::message(vec![]);
        if let Reply::Message(m) = &mut r {
            m.hang = true;
        }
        r
    }

    /// An HTTP error answered once: 400 → `invalid_request_error`, 401 → `authentication_error`,
    /// 429 → `rate_limit_error`, 529 → `overloaded_error`, else `api_error`.
    pub fn error(status: u16) -> Reply {
        let kind = match status {
            400 => "invalid_request_error",
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            _ => "api_error",
        };
        Reply::Error {
            status,
            kind: kind.into(),
            message: format!("fake {status} from the paddock test server"),
            repeat: 1,
        }
    }

    /// Answers this many requests (errors only).
    pub fn times(mut self, n: usize) -> Reply {
        if let Reply::Error { repeat, .. } = &mut self {
            *repeat = n;
        }
        self
    }

    /// Puts a thinking block first.
    pub fn thinking(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.blocks.insert(0, Block::Thinking(t.into()));
        }
        self
    }

    /// Puts a text block before the others.
    pub fn saying(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            let at = m
                .blocks
                .iter()
                .position(|b| !matches!(b, Block::Thinking(_)))
                .unwrap_or(m.blocks.len());
            m.blocks.insert(at, Block::Text(t.into()));
        }
        self
    }

    /// Sets the usage the message reports: input (+ cache reads) and final output tokens.
    pub fn usage(mut self, input: u64, cache_read: u64, output: u64) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.input_tokens = input;
            m.cache_read = cache_read;
            m.output_tokens = output;
        }
        self
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (`Null` if none or not JSON).
    pub body: Value,
}

impl Recorded {
    /// Every text of the conversation sent (`messages[*].content`, text and tool_result
    /// blocks, and plain string contents), in order.
    pub fn texts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in self.body["messages"].as_array().into_iter().flatten() {
            match &m["content"] {
                Value::String(s) => out.push(s.clone()),
                Value::Array(blocks) => {
                    for b in blocks {
                        match b["type"].as_str() {
                            Some("text") => out.push(b["text"].as_str().unwrap_or("").into()),
                            Some("tool_result") => match &b["content"] {
                                Value::String(s) => out.push(s.clone()),
                                Value::Array(inner) => out.extend(
                                    inner
                                        .iter()
                                        .filter_map(|x| x["text"].as_str().map(String::from)),
                                ),
                                _ => {}
                            },
                            Some("tool_use") => out.push(format!(
                                "tool_use {} {}",
                                b["name"].as_str().unwrap_or(""),
                                b["input"]
                            )),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The roles of `messages`, in order.
    pub fn roles(&self) -> Vec<String> {
        self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["role"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

#[derive(Default)]
pub struct State {
    script: Vec<Reply>,
    /// Index of the reply being served and how many requests it has answered.
    next: usize,
    served: usize,
    requests: Vec<Recorded>,
    /// Message ids handed out (for unique `msg_…` / `toolu_…` ids).
    messages: u64,
}

// A `POST /v1/messages` that is not a title request is a model call.
crate::scripted!(State, "message requests", |r| r.method == "POST"
    && is_messages(&r.path)
    && !is_title_request(&r.body));

/// The running server; it stops when dropped.
pub type FakeAnthropic = Fake<State>;

impl FakeAnthropic {
    /// Starts on 127.0.0.1 (a free port) with `script`.
    pub async fn start(script: Vec<Reply>) -> FakeAnthropic {
        let state = State {
            script,
            ..State::default()
        };
        Fake::serve(state, serve).await
    }

    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `POST /v1/messages` requests so far.
    pub fn message_requests(&self) -> Vec<Recorded> {
        self.calls()
    }
}

/// A side request for a session title (the Claude Agent SDK, and so Claude's ACP adapter, asks
/// for one at a session's first prompt, with a JSON schema of `{title}`): answered with a fixed
/// title, outside the test's script, and left out of [`FakeAnthropic::message_requests`].
fn is_title_request(body: &Value) -> bool {
    body["output_config"]["format"]["schema"]["properties"]["title"].is_object()
}

fn is_messages(path: &str) -> bool {
    let p = path.split('?').next().unwrap_or("");
    p == "/v1/messages"
}

/// Serves requests on one connection until it closes (each answer closes it).
async fn serve(
    sock: TcpStream,
    state: Arc<Mutex<State>>,
    arrived: Arc<Notify>,
) -> std::io::Result<()> {
    let mut conn = Conn::new(sock);
    let Some(req) = conn.next_request().await? else {
        return Ok(());
    };
    let mut sock = conn.sock;
    let json_body = req.json();
    let Request {
        method,
        path,
        headers,
        ..
    } = req;
    let stream = json_body["stream"].as_bool().unwrap_or(false);
    let model = json_body["model"]
        .as_str()
        .unwrap_or("claude-fake")
        .to_string();
    let messages_call = method == "POST" && is_messages(&path);

    // Record, pick the reply, then answer outside the lock.
    let (reply, msg_no) = {
        let mut st = state.lock().unwrap();
        st.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            headers,
            body: json_body,
        });
        if !messages_call {
            (None, 0)
        } else if is_title_request(&st.requests.last().unwrap().body) {
            let title = Reply::text(r#"{"title":"Paddock test session"}"#).usage(1, 0, 1);
            (Some(title), 0)
        } else {
            let reply = next_reply(&mut st);
            st.messages += 1;
            (Some(reply), st.messages)
        }
    };
    arrived.notify_waiters();

    let Some(reply) = reply else {
        return respond_json(&mut sock,
            404,
            &json!({"type":"error","error":{"type":"not_found_error","message":format!("the fake server has no {method} {path}")}}), true).await;
    };
    match reply {
        Reply::Error {
            status,
            kind,
            message,
            ..
        } => {
            respond_json(
                &mut sock,
                status,
                &json!({"type":"error","error":{"type":kind,"message":message}}),
                true,
            )
            .await
        }
        Reply::Message(m) if stream => stream_message(&mut sock, &m, &model, msg_no).await,
        Reply::Message(m) => {
            let resp = whole_message(&m, &model, msg_no);
            respond_json(&mut sock, 200, &resp, true).await
        }
    }
}

fn next_reply(st: &mut State) -> Reply {
    loop {
        let Some(r) = st.script.get(st.next).cloned() else {
            let n = st.requests.len();
            return Reply::Error {
                status: 500,
                kind: "api_error".into(),
                message: format!("paddock fake server: script exhausted at request {n}"),
                repeat: 1,
            };
        };
        let repeat = match &r {
            Reply::Error { repeat, .. } => (*repeat).max(1),
            Reply::Message(_) => 1,
        };
        if st.served < repeat {
            st.served += 1;
            if st.served == repeat {
                st.next += 1;
                st.served = 0;
            }
            return r;
        }
        st.next += 1;
        st.served = 0;
    }
}

fn usage_start(m: &Message) -> Value {
    json!({
        "input_tokens": m.input_tokens,
        "cache_creation_input_tokens": m.cache_creation,
        "cache_read_input_tokens": m.cache_read,
        "output_tokens": 1
    })
}

fn stop_reason(m: &Message) -> &'static str {
    if m.blocks.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
        "tool_use"
    } else {
        "end_turn"
    }
}

fn tool_id(msg_no: u64, k: usize) -> String {
    format!("toolu_paddock_{msg_no}_{k}")
}

/// The non-streaming form (the CLI does not use it for turns; answered for completeness).
fn whole_message(m: &Message, model: &str, msg_no: u64) -> Value {
    let content: Vec<Value> = m
        .blocks
        .iter()
        .enumerate()
        .map(|(k, b)| match b {
            Block::Thinking(t) => json!({"type":"thinking","thinking":t,"signature":"sig_paddock"}),
            Block::Text(t) => json!({"type":"text","text":t}),
            Block::ToolUse { name, input } => {
                json!({"type":"tool_use","id":tool_id(msg_no, k),"name":name,"input":input})
            }
        })
        .collect();
    let mut usage = usage_start(m);
    usage["output_tokens"] = json!(m.output_tokens);
    json!({
        "id": format!("msg_paddock_{msg_no}"), "type": "message", "role": "assistant",
        "model": model, "content": content, "stop_reason": stop_reason(m),
        "stop_sequence": null, "usage": usage
    })
}

async fn stream_message(
    sock: &mut TcpStream,
    m: &Message,
    model: &str,
    msg_no: u64,
) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nrequest-id: req_paddock_fake\r\nconnection: close\r\n\r\n";
    sock.write_all(head.as_bytes()).await?;
    let mut events: Vec<(&str, Value)> = vec![(
        "message_start",
        json!({"type":"message_start","message":{
            "id": format!("msg_paddock_{msg_no}"), "type":"message", "role":"assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage_start(m)}}),
    )];
    if m.hang {
        send_events(sock, &events).await?;
        // Hold the response open until the client goes away.
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
        return Ok(());
    }
    for (k, b) in m.blocks.iter().enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match b {
            Block::Thinking(t) => (
                json!({"type":"thinking","thinking":"","signature":""}),
                vec![
                    json!({"type":"thinking_delta","thinking":t}),
                    json!({"type":"signature_delta","signature":"sig_paddock"}),
                ],
            ),
            Block::Text(t) => (
                json!({"type":"text","text":""}),
                vec![json!({"type":"text_delta","text":t})],
            ),
            Block::ToolUse { name, input } => (
                json!({"type":"tool_use","id":tool_id(msg_no, k),"name":name,"input":{}}),
                vec![json!({"type":"input_json_delta","partial_json":input.to_string()})],
            ),
        };
        events.push((
            "content_block_start",
            json!({"type":"content_block_start","index":k,"content_block":start}),
        ));
        for d in deltas {
            events.push((
                "content_block_delta",
                json!({"type":"content_block_delta","index":k,"delta":d}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type":"content_block_stop","index":k}),
        ));
    }
    events.push((
        "message_delta",
        json!({"type":"message_delta","delta":{"stop_reason":stop_reason(m),"stop_sequence":null},
               "usage":{"output_tokens":m.output_tokens}}),
    ));
    events.push(("message_stop", json!({"type":"message_stop"})));
    send_events(sock, &events).await?;
    let _ = sock.shutdown().await;
    Ok(())
}

async fn send_events(sock: &mut TcpStream, events: &[(&str, Value)]) -> std::io::Result<()> {
    for (name, data) in events {
        let frame = format!("event: {name}\ndata: {data}\n\n");
        sock.write_all(frame.as_bytes()).await?;
    }
    sock.flush().await
}
