//! What every fake model server shares: the running server ([`Server`]: a listener on a free
//! port of 127.0.0.1, the state its connections share, a signal per request, stopped when
//! dropped) and the HTTP/1.1 it speaks (requests read from a connection, `Content-Length` or
//! chunked bodies one after another on a kept-alive connection, and JSON answers). Plain tokio:
//! a fake server is a small thing, and a framework would only add build time to a 2-core CI.
//! Each fake (`fake_anthropic`, `fake_responses`, `fake_gemini`, `fake_openai`) adds its API's
//! routes, script and streaming format.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A fake server, running: each connection it accepts is served by `serve` on a task of its
/// own, with the state every connection shares and the signal `serve` gives for each request
/// that arrived. It stops when dropped.
pub struct Server<S> {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<S>>,
    arrived: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl<S> Drop for Server<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S: Send + 'static> Server<S> {
    /// Starts on a free port of 127.0.0.1. `serve` is called as each connection is accepted,
    /// in order (what it does before its future starts is numbered in accept order).
    pub async fn start<F, Fut>(state: S, serve: F) -> Server<S>
    where
        F: Fn(TcpStream, Arc<Mutex<S>>, Arc<Notify>) -> Fut + Send + 'static,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(state));
        let arrived = Arc::new(Notify::new());
        let (st, ar) = (state.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let served = serve(sock, st.clone(), ar.clone());
                tokio::spawn(async move {
                    let _ = served.await;
                });
            }
        });
        Server {
            addr,
            state,
            arrived,
            task,
        }
    }

    /// Waits until `count()` is at least `n`, looking again at each request that arrives;
    /// after `limit`, fails the test naming `what` it counts.
    pub async fn wait_until(
        &self,
        n: usize,
        limit: Duration,
        what: &str,
        count: impl Fn() -> usize,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.arrived.notified();
            if count() >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "the fake server got {} {what}, not {n}, within {limit:?}",
                    count()
                );
            }
        }
    }
}

/// What a fake's state holds for [`Fake`]: the script of replies it serves and the requests it
/// recorded, and which of those are the API's model calls (a turn's requests, as opposed to
/// side requests a client makes: a session title, a model list).
pub trait Scripted: Send + 'static {
    type Reply;
    type Recorded: Clone;
    /// What the model calls are called, for a wait that fails.
    const CALLS: &'static str;
    fn script(&mut self) -> &mut Vec<Self::Reply>;
    fn recorded(&self) -> &[Self::Recorded];
    fn is_call(r: &Self::Recorded) -> bool;
}

/// `impl Scripted for $state` whose script and requests are its fields `script` and
/// `requests` (of its module's `Reply` and `Recorded`), its model calls named `$calls` and told
/// apart by `$is_call`.
#[macro_export]
macro_rules! scripted {
    ($state:ty, $calls:literal, $is_call:expr) => {
        impl $crate::fake_http::Scripted for $state {
            type Reply = Reply;
            type Recorded = Recorded;
            const CALLS: &'static str = $calls;
            fn script(&mut self) -> &mut Vec<Reply> {
                &mut self.script
            }
            fn recorded(&self) -> &[Recorded] {
                &self.requests
            }
            fn is_call(r: &Recorded) -> bool {
                let is_call: fn(&Recorded) -> bool = $is_call;
                is_call(r)
            }
        }
    };
}

/// A fake model server, running: the part every fake's API shares. Each fake is a
/// `Fake<its State>` with its own `start` (its routes) and its address as its clients want it.
/// It stops when dropped.
pub struct Fake<S: Scripted> {
    pub addr: SocketAddr,
    server: Server<S>,
}

impl<S: Scripted> Fake<S> {
    /// Starts on a free port of 127.0.0.1 (see [`Server::start`]).
    pub async fn serve<F, Fut>(state: S, serve: F) -> Fake<S>
    where
        F: Fn(TcpStream, Arc<Mutex<S>>, Arc<Notify>) -> Fut + Send + 'static,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let server = Server::start(state, serve).await;
        Fake {
            addr: server.addr,
            server,
        }
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = S::Reply>) {
        self.server.state.lock().unwrap().script().extend(replies);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<S::Recorded> {
        self.server.state.lock().unwrap().recorded().to_vec()
    }

    /// The model calls so far.
    pub fn calls(&self) -> Vec<S::Recorded> {
        let state = self.server.state.lock().unwrap();
        state
            .recorded()
            .iter()
            .filter(|r| S::is_call(r))
            .cloned()
            .collect()
    }

    /// Waits until at least `n` model calls arrived (at most `limit`).
    pub async fn wait_requests(&self, n: usize, limit: Duration) {
        self.server
            .wait_until(n, limit, S::CALLS, || self.calls().len())
            .await;
    }
}

/// A request head bigger than this ends the connection.
const HEAD_MAX: usize = 1 << 20;

/// One request.
pub struct Request {
    pub method: String,
    /// With its query string.
    pub path: String,
    /// Names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    /// The body as JSON (`Null` if it is not JSON, or compressed).
    pub fn json(&self) -> Value {
        let compressed = self
            .headers
            .get("content-encoding")
            .is_some_and(|e| !e.eq_ignore_ascii_case("identity"));
        if compressed {
            return Value::Null;
        }
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A client's connection: requests are read from it one after another.
pub struct Conn {
    pub sock: TcpStream,
    /// Read but not yet used (the start of the next request).
    buf: Vec<u8>,
}

impl Conn {
    pub fn new(sock: TcpStream) -> Conn {
        Conn {
            sock,
            buf: Vec::with_capacity(64 * 1024),
        }
    }

    /// The next request; `None` when the client closed the connection (or sent garbage).
    pub async fn next_request(&mut self) -> std::io::Result<Option<Request>> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.buf.len() > HEAD_MAX || !self.fill().await? {
                return Ok(None);
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_string();
        self.buf.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let mut parts = lines.next().unwrap_or("").split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let headers: BTreeMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let body = if chunked {
            match self.chunked_body().await? {
                Some(b) => b,
                None => return Ok(None),
            }
        } else {
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while self.buf.len() < len {
                if !self.fill().await? {
                    return Ok(None);
                }
            }
            self.buf.drain(..len).collect()
        };
        Ok(Some(Request {
            method,
            path,
            headers,
            body,
        }))
    }

    /// Reads more into the buffer; `false` at the end of the connection.
    async fn fill(&mut self) -> std::io::Result<bool> {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.sock.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    async fn chunked_body(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        loop {
            let i = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                if !self.fill().await? {
                    return Ok(None);
                }
            };
            let size_line = String::from_utf8_lossy(&self.buf[..i]).to_string();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or(0);
            while self.buf.len() < i + 2 + size + 2 {
                if !self.fill().await? {
                    return Ok(None);
                }
            }
            out.extend_from_slice(&self.buf[i + 2..i + 2 + size]);
            self.buf.drain(..i + 2 + size + 2);
            if size == 0 {
                return Ok(Some(out));
            }
        }
    }
}

/// Answers with a JSON body; `close` ends the connection after it.
pub async fn respond_json(
    sock: &mut TcpStream,
    status: u16,
    body: &Value,
    close: bool,
) -> std::io::Result<()> {
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-request-id: req_paddock_fake\r\n{}\r\n",
        reason(status),
        body.len(),
        if close { "connection: close\r\n" } else { "" }
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.flush().await?;
    if close {
        let _ = sock.shutdown().await;
    }
    Ok(())
}

/// The reason phrase of a status line.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Error",
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
