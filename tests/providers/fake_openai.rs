//! A fake OpenAI Chat Completions API on 127.0.0.1: plain tokio TCP and a minimal HTTP/1.1
//! parser, like `fake_anthropic.rs` (every answer closes its connection).
//!
//! Each `POST /v1/chat/completions` takes the next [`Reply`] of the test's script. With
//! `"stream": true` it is answered as api.openai.com streams: `data: {chunk}` events of
//! `chat.completion.chunk` objects — a role chunk, the reasoning (`reasoning_content`, as
//! DeepSeek-style endpoints send it), the text in two pieces, each tool call as a first delta
//! with `id`, `type` and `function.name` and then its `arguments` in two pieces, a chunk with
//! `finish_reason` (`tool_calls` or `stop`), and when `stream_options.include_usage` is set a
//! last chunk with empty `choices` and the `usage` — then `data: [DONE]`. Without `stream`, one
//! `chat.completion` object. Or an HTTP error with the API's error JSON
//! (`{"error": {"message", "type", "code"}}`). Every request is recorded.
//!
//! A path this server does not know is a 404; when the script is used up, a request is
//! answered with a 500 whose message says so.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::fake_http::{respond_json, Conn, Fake, Request};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    Message(Message),
    /// An HTTP error with the API's error body.
    Error {
        status: u16,
        message: String,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Message {
    pub reasoning: String,
    pub text: String,
    /// (name, arguments object)
    pub tool_calls: Vec<(String, Value)>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Send the role chunk, then keep the response open until the client goes away.
    pub hang: bool,
}

impl Reply {
    fn message(m: Message) -> Reply {
        Reply::Message(Message {
            prompt_tokens: 100,
            completion_tokens: 10,
            ..m
        })
    }

    /// A final answer (`finish_reason: stop`).
    pub fn text(t: &str) -> Reply {
        Reply::message(Message {
            text: t.into(),
            ..Message::default()
        })
    }

    /// One tool call (`finish_reason: tool_calls`).
    pub fn tool(name: &str, arguments: Value) -> Reply {
        Reply::message(Message {
            tool_calls: vec![(name.into(), arguments)],
            ..Message::default()
        })
    }

    /// Another tool call in the same answer.
    pub fn and_tool(mut self, name: &str, arguments: Value) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.tool_calls.push((name.into(), arguments));
        }
        self
    }

    pub fn hang() -> Reply {
        Reply::message(Message {
            hang: true,
            ..Message::default()
        })
    }

    /// An HTTP error; OpenAI's error `type` for the status.
    pub fn error(status: u16) -> Reply {
        Reply::Error {
            status,
            message: format!("fake {status} from the paddock test server"),
        }
    }

    pub fn reasoning(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.reasoning = t.into();
        }
        self
    }

    /// Text before the tool calls.
    pub fn saying(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.text = t.into();
        }
        self
    }

    /// `prompt_tokens` (of which `cached` are cache reads) and `completion_tokens`.
    pub fn usage(mut self, prompt: u64, cached: u64, completion: u64) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.prompt_tokens = prompt;
            m.cached_tokens = cached;
            m.completion_tokens = completion;
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
    pub body: Value,
}

impl Recorded {
    /// The conversation sent, one string per message: `role: content`, and for an assistant's
    /// tool calls `assistant: tool_call NAME ARGS`.
    pub fn texts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in self.body["messages"].as_array().into_iter().flatten() {
            let role = m["role"].as_str().unwrap_or("?");
            if let Some(c) = m["content"].as_str() {
                out.push(format!("{role}: {c}"));
            }
            for tc in m["tool_calls"].as_array().into_iter().flatten() {
                out.push(format!(
                    "{role}: tool_call {} {}",
                    tc["function"]["name"].as_str().unwrap_or(""),
                    tc["function"]["arguments"].as_str().unwrap_or("")
                ));
            }
        }
        out
    }
}

#[derive(Default)]
pub struct State {
    script: Vec<Reply>,
    next: usize,
    requests: Vec<Recorded>,
}

crate::scripted!(State, "completion requests", |r| r.method == "POST"
    && r.path == "/v1/chat/completions");

/// The running server; it stops when dropped.
pub type FakeOpenAi = Fake<State>;

impl FakeOpenAi {
    pub async fn start(script: Vec<Reply>) -> FakeOpenAi {
        let state = State {
            script,
            ..State::default()
        };
        Fake::serve(state, serve).await
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The `POST /v1/chat/completions` requests so far.
    pub fn completions(&self) -> Vec<Recorded> {
        self.calls()
    }
}

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
    let completions = method == "POST" && path == "/v1/chat/completions";
    let (reply, n) = {
        let mut st = state.lock().unwrap();
        st.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            headers,
            body: json_body.clone(),
        });
        let n = st.requests.len();
        if !completions {
            (None, n)
        } else {
            let r = st
                .script
                .get(st.next)
                .cloned()
                .unwrap_or_else(|| Reply::Error {
                    status: 500,
                    message: format!("paddock fake server: script exhausted at request {n}"),
                });
            st.next += 1;
            (Some(r), n)
        }
    };
    arrived.notify_waiters();
    let Some(reply) = reply else {
        return respond_json(
            &mut sock,
            404,
            &json!({"error": {"message": format!("the fake server has no {method} {path}"),
                              "type": "invalid_request_error", "code": "not_found"}}),
            true,
        )
        .await;
    };
    let model = json_body["model"]
        .as_str()
        .unwrap_or("gpt-fake")
        .to_string();
    match reply {
        Reply::Error { status, message } => {
            let kind = match status {
                400 | 404 => "invalid_request_error",
                401 => "authentication_error",
                429 => "rate_limit_exceeded",
                _ => "server_error",
            };
            respond_json(
                &mut sock,
                status,
                &json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
                true,
            )
            .await
        }
        Reply::Message(m) if json_body["stream"] == true => {
            let usage = json_body["stream_options"]["include_usage"] == true;
            stream(&mut sock, &m, &model, n, usage).await
        }
        Reply::Message(m) => respond_json(&mut sock, 200, &whole(&m, &model, n), true).await,
    }
}

fn usage(m: &Message) -> Value {
    json!({"prompt_tokens": m.prompt_tokens, "completion_tokens": m.completion_tokens,
           "total_tokens": m.prompt_tokens + m.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": m.cached_tokens, "audio_tokens": 0},
           "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                         "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}})
}

fn finish_reason(m: &Message) -> &'static str {
    if m.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn call_id(n: usize, k: usize) -> String {
    format!("call_paddock_{n}_{k}")
}

fn whole(m: &Message, model: &str, n: usize) -> Value {
    let mut message = json!({"role": "assistant", "content": m.text, "refusal": null});
    if !m.tool_calls.is_empty() {
        message["tool_calls"] = m
            .tool_calls
            .iter()
            .enumerate()
            .map(|(k, (name, args))| {
                json!({"id": call_id(n, k), "type": "function",
                       "function": {"name": name, "arguments": args.to_string()}})
            })
            .collect();
    }
    json!({"id": format!("chatcmpl-paddock-{n}"), "object": "chat.completion", "created": 1_700_000_000,
           "model": model, "choices": [{"index": 0, "message": message, "logprobs": null,
           "finish_reason": finish_reason(m)}], "usage": usage(m)})
}

/// Two pieces of `s` (on a char boundary), the way a stream splits tokens.
fn halves(s: &str) -> [&str; 2] {
    let mut mid = s.len() / 2;
    while !s.is_char_boundary(mid) {
        mid += 1;
    }
    [&s[..mid], &s[mid..]]
}

async fn stream(
    sock: &mut TcpStream,
    m: &Message,
    model: &str,
    n: usize,
    include_usage: bool,
) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\nx-request-id: req_paddock_fake\r\nconnection: close\r\n\r\n";
    sock.write_all(head.as_bytes()).await?;
    let chunk = |delta: Value, finish: Value| {
        let mut c = json!({"id": format!("chatcmpl-paddock-{n}"), "object": "chat.completion.chunk",
               "created": 1_700_000_000, "model": model, "system_fingerprint": "fp_paddock",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    if m.hang {
        send(sock, &chunks).await?;
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
    if !m.reasoning.is_empty() {
        chunks.push(chunk(
            json!({"reasoning_content": m.reasoning}),
            Value::Null,
        ));
    }
    if !m.text.is_empty() {
        for piece in halves(&m.text) {
            chunks.push(chunk(json!({"content": piece}), Value::Null));
        }
    }
    for (k, (name, args)) in m.tool_calls.iter().enumerate() {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": k, "id": call_id(n, k), "type": "function",
                                   "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        let args = args.to_string();
        for piece in halves(&args) {
            chunks.push(chunk(
                json!({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    chunks.push(chunk(json!({}), json!(finish_reason(m))));
    if include_usage {
        chunks.push(
            json!({"id": format!("chatcmpl-paddock-{n}"), "object": "chat.completion.chunk",
            "created": 1_700_000_000, "model": model, "system_fingerprint": "fp_paddock",
            "choices": [], "usage": usage(m)}),
        );
    }
    send(sock, &chunks).await?;
    sock.write_all(b"data: [DONE]\n\n").await?;
    sock.flush().await?;
    let _ = sock.shutdown().await;
    Ok(())
}

async fn send(sock: &mut TcpStream, chunks: &[Value]) -> std::io::Result<()> {
    for c in chunks {
        sock.write_all(format!("data: {c}\n\n").as_bytes()).await?;
    }
    sock.flush().await
}
