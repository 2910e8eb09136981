//! A fake Gemini API (generativelanguage `v1beta`) on 127.0.0.1: plain tokio TCP and a minimal
//! HTTP/1.1 parser, like `fake_anthropic.rs` (every answer closes its connection).
//!
//! gemini-cli 0.61.0, pointed here by `GOOGLE_GEMINI_BASE_URL` with API-key auth, calls only
//! `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` (one per model call of a turn;
//! no `countTokens`, no `generateContent` for routing or next-speaker checks when `-m` names a
//! model). Each such request takes the next [`Reply`] of the test's script and is answered as
//! the real API streams: server-sent events, each `data: <GenerateContentResponse JSON>`, one
//! per part (`text`, `text` + `thought: true`, or `functionCall`), the last with
//! `finishReason: STOP` and the call's whole `usageMetadata` (`promptTokenCount`,
//! `cachedContentTokenCount`, `candidatesTokenCount`, `thoughtsTokenCount`,
//! `totalTokenCount`); the earlier ones carry the prompt count only, as the real API does. An
//! error is an HTTP status with Google's error JSON (`{"error":{"code":…,"message":…,"status":…}}`).
//!
//! Every request is recorded (method, path, headers, JSON body) so tests can check what the
//! CLI sent, e.g. the whole earlier conversation in `contents` after a `--resume`. Any other
//! path is a 404 with Google's error JSON; when the script is used up, a request is answered
//! with a 500 saying so.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::fake_http::{respond_json, Conn, Fake, Request};

/// One part of a scripted answer.
#[derive(Debug, Clone)]
pub enum Part {
    Thought(String),
    Text(String),
    Call { name: String, args: Value },
}

/// What the server answers to one `streamGenerateContent` request.
#[derive(Debug, Clone)]
pub enum Reply {
    Message(Message),
    /// An HTTP error with Google's error body.
    Error {
        status: u16,
        message: String,
    },
    /// The response head, then nothing until the client goes away: the model "thinks".
    Hang,
}

#[derive(Debug, Clone)]
pub struct Message {
    pub parts: Vec<Part>,
    pub prompt: u64,
    pub cached: u64,
    pub output: u64,
    pub thoughts: u64,
}

impl Reply {
    fn message(parts: Vec<Part>) -> Reply {
        Reply::Message(Message {
            parts,
            prompt: 100,
            cached: 0,
            output: 10,
            thoughts: 0,
        })
    }

    /// A final text answer.
    pub fn text(t: &str) -> Reply {
        Reply::message(vec![Part::Text(t.into())])
    }

    /// A function call (gemini's tool names: `run_shell_command`, `write_file`, …).
    pub fn call(name: &str, args: Value) -> Reply {
        Reply::message(vec![Part::Call {
            name: name.into(),
            args,
        }])
    }

    pub fn hang() -> Reply {
        Reply::Hang
    }

    /// An HTTP error: 400 `INVALID_ARGUMENT`, 429 `RESOURCE_EXHAUSTED`, 500 `INTERNAL`, …
    pub fn error(status: u16) -> Reply {
        Reply::Error {
            status,
            message: format!("fake {status} from the paddock test server"),
        }
    }

    /// Puts a thought first.
    pub fn thinking(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.parts.insert(0, Part::Thought(t.into()));
        }
        self
    }

    /// Puts a text part before the call.
    pub fn saying(mut self, t: &str) -> Reply {
        if let Reply::Message(m) = &mut self {
            let at = m
                .parts
                .iter()
                .position(|p| !matches!(p, Part::Thought(_)))
                .unwrap_or(m.parts.len());
            m.parts.insert(at, Part::Text(t.into()));
        }
        self
    }

    /// `promptTokenCount` (cached included), `cachedContentTokenCount`, `candidatesTokenCount`.
    pub fn usage(mut self, prompt: u64, cached: u64, output: u64) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.prompt = prompt;
            m.cached = cached;
            m.output = output;
        }
        self
    }

    /// `thoughtsTokenCount`.
    pub fn thoughts(mut self, n: u64) -> Reply {
        if let Reply::Message(m) = &mut self {
            m.thoughts = n;
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
    /// Every part of `contents` as text, in order: texts, `call NAME ARGS` for a function call,
    /// `response NAME RESPONSE` for a function response.
    pub fn texts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.body["contents"].as_array().into_iter().flatten() {
            for p in c["parts"].as_array().into_iter().flatten() {
                if let Some(t) = p["text"].as_str() {
                    out.push(t.to_string());
                } else if let Some(f) = p.get("functionCall") {
                    out.push(format!(
                        "call {} {}",
                        f["name"].as_str().unwrap_or(""),
                        f["args"]
                    ));
                } else if let Some(f) = p.get("functionResponse") {
                    out.push(format!(
                        "response {} {}",
                        f["name"].as_str().unwrap_or(""),
                        f["response"]
                    ));
                }
            }
        }
        out
    }

    /// The model named in the path (`/v1beta/models/<model>:…`).
    pub fn model(&self) -> &str {
        self.path
            .split("/models/")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .unwrap_or("")
    }
}

#[derive(Default)]
pub struct State {
    script: Vec<Reply>,
    next: usize,
    requests: Vec<Recorded>,
    calls: u64,
}

crate::scripted!(State, "streamGenerateContent requests", |r| r.method
    == "POST"
    && is_stream(&r.path));

/// The running server; it stops when dropped.
pub type FakeGemini = Fake<State>;

impl FakeGemini {
    pub async fn start(script: Vec<Reply>) -> FakeGemini {
        let state = State {
            script,
            ..State::default()
        };
        Fake::serve(state, serve).await
    }

    /// `http://127.0.0.1:PORT`, for `GOOGLE_GEMINI_BASE_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `streamGenerateContent` requests so far.
    pub fn stream_requests(&self) -> Vec<Recorded> {
        self.calls()
    }
}

fn is_stream(path: &str) -> bool {
    let p = path.split('?').next().unwrap_or("");
    p.starts_with("/v1beta/models/") && p.ends_with(":streamGenerateContent")
}

async fn serve(
    sock: TcpStream,
    state: Arc<Mutex<State>>,
    arrived: Arc<Notify>,
) -> std::io::Result<()> {
    let mut conn = Conn::new(sock);
    let Some(Request {
        method,
        path,
        headers,
        body,
    }) = conn.next_request().await?
    else {
        return Ok(());
    };
    let mut sock = conn.sock;
    let stream_call = method == "POST" && is_stream(&path);
    let (reply, call_no) = {
        let mut st = state.lock().unwrap();
        st.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        if stream_call {
            st.calls += 1;
            let reply = st
                .script
                .get(st.next)
                .cloned()
                .unwrap_or_else(|| Reply::Error {
                    status: 500,
                    message: format!("paddock fake server: script exhausted at call {}", st.calls),
                });
            st.next += 1;
            (Some(reply), st.calls)
        } else {
            (None, 0)
        }
    };
    arrived.notify_waiters();
    match reply {
        None => {
            respond_json(
                &mut sock,
                404,
                &google_error(404, &format!("the fake server has no {method} {path}")),
                true,
            )
            .await
        }
        Some(Reply::Error { status, message }) => {
            respond_json(&mut sock, status, &google_error(status, &message), true).await
        }
        Some(Reply::Hang) => {
            sock.write_all(SSE_HEAD.as_bytes()).await?;
            sock.flush().await?;
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
            Ok(())
        }
        Some(Reply::Message(m)) => {
            sock.write_all(SSE_HEAD.as_bytes()).await?;
            for event in events(&m, call_no) {
                sock.write_all(format!("data: {event}\r\n\r\n").as_bytes())
                    .await?;
            }
            sock.flush().await?;
            let _ = sock.shutdown().await;
            Ok(())
        }
    }
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

/// The SSE events of one answer: a `GenerateContentResponse` per part.
fn events(m: &Message, call_no: u64) -> Vec<Value> {
    let n = m.parts.len().max(1);
    let total = m.prompt + m.output + m.thoughts;
    (0..n)
        .map(|k| {
            let parts: Vec<Value> = match m.parts.get(k) {
                Some(Part::Thought(t)) => vec![json!({"text": t, "thought": true})],
                Some(Part::Text(t)) => vec![json!({"text": t})],
                Some(Part::Call { name, args }) => {
                    vec![json!({"functionCall": {"name": name, "args": args}})]
                }
                None => vec![json!({"text": ""})],
            };
            let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
            let usage = if k + 1 == n {
                candidate["finishReason"] = json!("STOP");
                json!({
                    "promptTokenCount": m.prompt,
                    "cachedContentTokenCount": m.cached,
                    "candidatesTokenCount": m.output,
                    "thoughtsTokenCount": m.thoughts,
                    "totalTokenCount": total,
                })
            } else {
                json!({"promptTokenCount": m.prompt, "totalTokenCount": m.prompt})
            };
            json!({
                "candidates": [candidate],
                "usageMetadata": usage,
                "modelVersion": "gemini-paddock-fake",
                "responseId": format!("paddock-{call_no}"),
            })
        })
        .collect()
}

fn google_error(status: u16, message: &str) -> Value {
    let name = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    json!({"error": {"code": status, "message": message, "status": name}})
}
