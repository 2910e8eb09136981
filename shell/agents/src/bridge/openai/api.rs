//! One call of an OpenAI-compatible chat completions endpoint: `POST {base_url}/chat/completions`,
//! streamed, folded into one [`Completion`].
//!
//! HTTP with `ureq` (blocking: the bridge is one thread working one turn at a time). Statuses are
//! not errors to ureq here (`http_status_as_error(false)`): a 4xx/5xx body is read (at most
//! [`ERROR_BODY_MAX`] bytes) for the API's own message, which the turn's ERROR shows.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use super::sse::{self, Accumulator, Completion, Event, SseReader};

/// An error body is read up to this size: enough for any API's message.
pub const ERROR_BODY_MAX: u64 = 64 * 1024;
/// One server-sent event line at most (a chunk carries a few tokens; 1 MiB is generous).
pub const SSE_LINE_MAX: usize = 1 << 20;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The endpoint answered with an HTTP error status.
    Status { status: u16, message: String },
    /// No answer, or a broken one (connection refused, a stream cut off or too big).
    Transport(String),
    /// `request_timeout_secs` passed. Not tried again: a model that took that long once
    /// would most likely do it again, and the turn would hang for a multiple of it.
    TimedOut(String),
}

impl CallError {
    /// Worth another try: rate limits, server errors, and failures to reach the endpoint.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Status { status, .. } => *status == 429 || *status >= 500,
            CallError::Transport(_) => true,
            CallError::TimedOut(_) => false,
        }
    }
}

/// What a call also saw besides the answer: payloads that were not JSON, kept for the log.
pub type Garbage = Vec<String>;

/// The endpoint.
pub struct Api {
    agent: ureq::Agent,
    url: String,
    key: Option<String>,
    max_response_bytes: u64,
}

impl Api {
    /// `base_url` like `https://api.openai.com/v1` (a trailing `/` is fine).
    pub fn new(
        base_url: &str,
        key: Option<String>,
        timeout: Duration,
        max_response_bytes: u64,
    ) -> Api {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .timeout_connect(Some(Duration::from_secs(10).min(timeout)))
            .build();
        Api {
            agent: ureq::Agent::new_with_config(config),
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            key,
            max_response_bytes,
        }
    }

    #[cfg(test)]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One call with the request `body`.
    pub fn complete(&self, body: &Value) -> Result<(Completion, Garbage), CallError> {
        let mut req = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        if let Some(k) = &self.key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let resp = req.send(body.to_string()).map_err(|e| match e {
            ureq::Error::Timeout(_) => CallError::TimedOut(format!("{}: {e}", self.url)),
            e => CallError::Transport(format!("{}: {e}", self.url)),
        })?;
        let status = resp.status().as_u16();
        let is_json = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("json"));
        let body = resp.into_body().into_reader();
        if !(200..300).contains(&status) {
            return Err(CallError::Status {
                status,
                message: error_text(body, status),
            });
        }
        if is_json {
            return self.whole(body);
        }
        self.stream(body)
    }

    fn stream(&self, body: impl Read) -> Result<(Completion, Garbage), CallError> {
        let mut events = SseReader::new(body, self.max_response_bytes, SSE_LINE_MAX);
        let mut acc = Accumulator::default();
        let mut garbage = Vec::new();
        loop {
            match events.next_event() {
                Ok(Some(Event::Chunk(v))) => acc.chunk(&v).map_err(|m| {
                    CallError::Transport(format!("the stream reported an error: {m}"))
                })?,
                Ok(Some(Event::Done)) => break,
                // An end without `[DONE]`: fine once the answer said it was finished; a stream
                // cut by the size limit or by the connection is not an answer (its usage, sent
                // last, would be lost with it).
                Ok(None) if events.exhausted() => {
                    return Err(CallError::Transport(format!(
                        "the answer exceeds max_response_bytes ({} bytes)",
                        self.max_response_bytes
                    )))
                }
                Ok(None) if !acc.finished() => {
                    return Err(CallError::Transport(
                        "the stream ended before the answer did".into(),
                    ))
                }
                Ok(None) => break,
                Ok(Some(Event::Garbage(g))) => garbage.push(g),
                Err(e) if is_timeout(&e) => {
                    return Err(CallError::TimedOut(format!("reading the stream: {e}")))
                }
                Err(e) => return Err(CallError::Transport(format!("reading the stream: {e}"))),
            }
        }
        Ok((acc.finish(), garbage))
    }

    fn whole(&self, body: impl Read) -> Result<(Completion, Garbage), CallError> {
        let mut buf = Vec::new();
        body.take(self.max_response_bytes)
            .read_to_end(&mut buf)
            .map_err(|e| CallError::Transport(format!("reading the answer: {e}")))?;
        let v: Value = serde_json::from_slice(&buf)
            .map_err(|e| CallError::Transport(format!("the answer is not JSON: {e}")))?;
        Accumulator::whole(&v)
            .map(|c| (c, Vec::new()))
            .map_err(|m| CallError::Transport(format!("the answer reported an error: {m}")))
    }
}

/// ureq reports a timeout while reading a body as an `io::Error` wrapping its own.
fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
}

/// The API's message from an error body, else its first bytes, else the status's reason.
fn error_text(body: impl Read, status: u16) -> String {
    let mut buf = Vec::new();
    let _ = body.take(ERROR_BODY_MAX).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    if let Some(m) = serde_json::from_str::<Value>(&text)
        .ok()
        .as_ref()
        .and_then(sse::error_message)
    {
        return m;
    }
    let t = text.trim();
    if t.is_empty() {
        return format!("HTTP {status}");
    }
    paddock_sys::text::prefix(t, 500).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts() {
        assert_eq!(
            error_text(
                &br#"{"error":{"message":"Invalid API key","type":"invalid_request_error"}}"#[..],
                401
            ),
            "Invalid API key"
        );
        assert_eq!(
            error_text(&b"<html>bad gateway</html>"[..], 502),
            "<html>bad gateway</html>"
        );
        assert_eq!(error_text(&b""[..], 503), "HTTP 503");
        assert!(CallError::Status {
            status: 429,
            message: String::new()
        }
        .retryable());
        assert!(CallError::Status {
            status: 503,
            message: String::new()
        }
        .retryable());
        assert!(!CallError::Status {
            status: 400,
            message: String::new()
        }
        .retryable());
    }

    #[test]
    fn a_slow_endpoint_times_out_and_is_not_retried() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Accepts, reads the request, answers the head and then nothing.
        let server = std::thread::spawn(move || {
            use std::io::Write;
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n");
            std::thread::sleep(Duration::from_millis(1500));
        });
        let api = Api::new(
            &format!("http://127.0.0.1:{port}/v1"),
            None,
            Duration::from_millis(500),
            1 << 20,
        );
        let t0 = std::time::Instant::now();
        let e = api.complete(&serde_json::json!({})).unwrap_err();
        assert!(matches!(e, CallError::TimedOut(_)), "{e:?}");
        assert!(!e.retryable());
        assert!(t0.elapsed() < Duration::from_millis(1400));
        server.join().unwrap();
    }

    #[test]
    fn an_unreachable_endpoint_is_a_transport_error() {
        // A port nothing listens on: bind one, note it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let api = Api::new(
            &format!("http://127.0.0.1:{port}/v1/"),
            None,
            Duration::from_secs(5),
            1 << 20,
        );
        assert_eq!(
            api.url(),
            format!("http://127.0.0.1:{port}/v1/chat/completions")
        );
        let e = api.complete(&serde_json::json!({})).unwrap_err();
        assert!(matches!(e, CallError::Transport(_)), "{e:?}");
    }
}
