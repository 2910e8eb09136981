//! What the daemon's servers and its clients (the CLI, the daemon's runner link) share about the
//! wire: the Unix-socket connector, the largest message, and how an OBEY code travels in a gRPC
//! status. Both `daemon` and `cli` depend on this module and it on neither.
//!
//! A refusal carries its code twice: in the message text (`OBEY-2011: …`, for people and for
//! clients that only read text) and as a structured `google.rpc.ErrorInfo` detail (reason
//! `OBEY-2011`, domain [`ERROR_DOMAIN`]), which is what programs match on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use paddock_core::ErrorCode;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_types::{ErrorDetails, StatusExt};

/// Largest gRPC message accepted or sent (a message to an agent, a batch of activities), by the
/// daemon's servers and by its clients alike.
pub const MESSAGE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Nothing answers on a Unix socket.
#[derive(Debug, thiserror::Error)]
#[error("nothing answers on {}: {source}", path.display())]
pub struct ConnectError {
    pub path: PathBuf,
    #[source]
    pub source: tonic::codegen::StdError,
}

/// A channel over the socket at `path` (the URI is a placeholder; the connector decides).
pub async fn channel(path: &Path) -> Result<Channel, ConnectError> {
    connect(Endpoint::from_static("http://localhost"), path).await
}

/// [`channel`] for streams of bulk data (the daemon's link to the runner: every agent's
/// output, in chunks of up to 64 KiB). With HTTP/2's defaults (frames of 16 KiB, a receive
/// window of 64 KiB) the runner wrote each chunk as four frames, a system call each, and
/// waited for a window update within it. What the runner may send ahead is bounded by the
/// connection's window, for all runs together.
pub async fn bulk_channel(path: &Path) -> Result<Channel, ConnectError> {
    let endpoint = Endpoint::from_static("http://localhost")
        .max_frame_size(BULK_FRAME)
        .initial_stream_window_size(BULK_STREAM_WINDOW)
        .initial_connection_window_size(BULK_CONNECTION_WINDOW);
    connect(endpoint, path).await
}

/// The largest HTTP/2 frame a [`bulk_channel`] takes: a chunk of output and its message's
/// framing in one.
pub const BULK_FRAME: u32 = 128 * 1024;
/// One stream's receive window on a [`bulk_channel`]: a few chunks.
pub const BULK_STREAM_WINDOW: u32 = 256 * 1024;
/// A [`bulk_channel`]'s receive window for all its streams: what the daemon may hold of the
/// runner's output unread, at most.
pub const BULK_CONNECTION_WINDOW: u32 = 2 * 1024 * 1024;

async fn connect(endpoint: Endpoint, path: &Path) -> Result<Channel, ConnectError> {
    let p = path.to_path_buf();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move {
                let stream = UnixStream::connect(&p).await?;
                server_is_trusted(&stream, &p)?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|source| ConnectError {
            path: path.to_path_buf(),
            source: source.into(),
        })
}

/// A client's connection to the daemon (the CLI's): one HTTP/2 connection on the socket, each
/// call sent on it at once. tonic's [`Channel`] adds a queue of requests served by a task of
/// its own and reconnects lazily, which a long-lived client of many servers wants; a command
/// makes one connection, a few calls on it, and exits. Without them `paddock session list`
/// runs less code, and less code first touched at its start (a page fault each):
/// `docs/performance.md`, P4.
///
/// Each call waits at most the limit it was made with ([`conn_within`]) for its answer (for a
/// streaming call, for the stream's start), and then fails as tonic's own timeout does
/// (`CANCELLED`, "Timeout expired").
#[derive(Clone, Debug)]
pub struct Conn {
    send: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
    limit: Option<std::time::Duration>,
}

/// A [`Conn`] on the socket at `path`, its calls unbounded in time.
pub async fn conn(path: &Path) -> Result<Conn, ConnectError> {
    open_conn(path, None).await
}

/// A [`Conn`] for a client that must never wait forever (the CLI): connecting, and each call
/// until its answer (a stream's first message for a streaming call), take at most `limit`.
pub async fn conn_within(path: &Path, limit: std::time::Duration) -> Result<Conn, ConnectError> {
    open_conn(path, Some(limit)).await
}

async fn open_conn(path: &Path, limit: Option<std::time::Duration>) -> Result<Conn, ConnectError> {
    let failed = |source: tonic::codegen::StdError| ConnectError {
        path: path.to_path_buf(),
        source,
    };
    let open = async {
        let stream = UnixStream::connect(path).await?;
        server_is_trusted(&stream, path)?;
        let (send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        .map_err(std::io::Error::other)?;
        // Drives the connection until both ends are done with it (or the process exits).
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection to the daemon: {e}");
            }
        });
        Ok::<_, std::io::Error>(Conn { send, limit })
    };
    within(limit, open).await.map_err(failed)
}

/// `work`, given at most `limit`: past it, the error tonic's own timeout gives
/// ([`tonic::TimeoutExpired`], a `CANCELLED` status).
async fn within<T, E: Into<tonic::codegen::StdError>>(
    limit: Option<std::time::Duration>,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, tonic::codegen::StdError> {
    match limit {
        None => work.await.map_err(Into::into),
        Some(limit) => match tokio::time::timeout(limit, work).await {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(tonic::TimeoutExpired(()).into()),
        },
    }
}

impl tower::Service<tonic::codegen::http::Request<tonic::body::Body>> for Conn {
    // tonic's body (not hyper's) because an interceptor's refusal needs an empty one.
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = tonic::codegen::StdError;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.send.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        // A generated client sends its method's path alone; HTTP/2 asks for a scheme and an
        // authority too (the socket is the server: the authority is a placeholder).
        let mut uri = std::mem::take(req.uri_mut()).into_parts();
        uri.scheme = Some(tonic::codegen::http::uri::Scheme::HTTP);
        uri.authority = Some(tonic::codegen::http::uri::Authority::from_static(
            "localhost",
        ));
        match Uri::from_parts(uri) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(e) => return Box::pin(std::future::ready(Err(e.into()))),
        }
        let answer = within(self.limit, self.send.send_request(req));
        Box::pin(async move {
            let answer = answer.await?;
            Ok(answer.map(tonic::body::Body::new))
        })
    }
}

/// A client talks only to a server run by itself or by root: a socket another user put in the
/// daemon's place (see [`crate::socket`]) never receives a request, nor the secrets in it.
fn server_is_trusted(stream: &UnixStream, path: &Path) -> std::io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let me = nix::unistd::geteuid().as_raw();
    if uid == me || uid == 0 {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "refusing to talk to {}: its server runs as uid {uid}, not as you (uid {me})",
                path.display()
            ),
        ))
    }
}

/// The `ErrorInfo.domain` of every status paddock attaches a reason to.
pub const ERROR_DOMAIN: &str = "paddock";

/// The longest message a status carries: it travels in an HTTP/2 header (clients refuse
/// headers past 16 KiB), and an error must never echo megabytes of a request back.
pub const STATUS_MESSAGE_BYTES_MAX: usize = 2048;

/// A status message cut to [`STATUS_MESSAGE_BYTES_MAX`] (with the marker saying how much).
pub fn status_message(message: impl Into<String>) -> String {
    let m = message.into();
    match crate::text::truncate(&m, STATUS_MESSAGE_BYTES_MAX) {
        std::borrow::Cow::Borrowed(_) => m,
        std::borrow::Cow::Owned(cut) => cut,
    }
}

/// A status with an `ErrorInfo` detail whose reason names the failure (an OBEY code, or a
/// protocol's own reason such as Aria's `DAEMON_UNAVAILABLE`).
pub fn error_status(code: tonic::Code, reason: &str, message: impl Into<String>) -> tonic::Status {
    let meta = HashMap::from([("service".to_string(), ERROR_DOMAIN.to_string())]);
    tonic::Status::with_error_details(
        code,
        status_message(message),
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, meta),
    )
}

/// A core error as a gRPC status, for every protocol and for the CLI's own refusals (made as
/// the daemon would make them): the message starts with the code (`OBEY-2001: …`) and an
/// `ErrorInfo` detail carries it (reason `OBEY-2001`, domain `paddock`), which is what clients
/// match ([`obey_code`]).
pub fn core_status(e: &paddock_core::Error) -> tonic::Status {
    use paddock_core::ErrorKind as K;
    let code = match e.code.kind() {
        K::NotFound => tonic::Code::NotFound,
        K::InvalidArgument => tonic::Code::InvalidArgument,
        K::FailedPrecondition => tonic::Code::FailedPrecondition,
        K::ResourceExhausted => tonic::Code::ResourceExhausted,
        K::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        K::Unavailable => tonic::Code::Unavailable,
        K::Internal => tonic::Code::Internal,
    };
    error_status(code, &e.code.to_string(), e.to_string())
}

/// The OBEY code a status carries in its `ErrorInfo`; `None` for a status paddock did not
/// refuse with a registry code (a transport failure, a plain `InvalidArgument`, …).
pub fn obey_code(s: &tonic::Status) -> Option<ErrorCode> {
    let info = s.get_details_error_info()?;
    if info.domain != ERROR_DOMAIN {
        return None;
    }
    ErrorCode::ALL
        .into_iter()
        .find(|c| c.to_string() == info.reason)
}

/// A request the server could not decode (garbage bytes, invalid UTF-8 in a string field) is
/// the client's fault: `INVALID_ARGUMENT`, not tonic's `INTERNAL` (which reads as a bug in the
/// daemon). A response map for every server's `layer`: tonic answers such a request with a
/// trailers-only response, so its status is in the headers.
pub fn undecodable_is_invalid_argument<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    // The start of prost's DecodeError text as tonic percent-encodes it in `grpc-message`.
    const DECODE_ERROR: &str = "failed%20to%20decode%20Protobuf%20message";
    let headers = response.headers_mut();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"13");
    let undecodable = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|m| m.starts_with(DECODE_ERROR));
    if internal && undecodable {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("3"),
        );
    }
    response
}

/// The layer every server of ours is built with: [`undecodable_is_invalid_argument`].
pub type ServerLayer = tower::layer::util::Stack<
    tower::util::MapResponseLayer<
        fn(
            tonic::codegen::http::Response<tonic::body::Body>,
        ) -> tonic::codegen::http::Response<tonic::body::Body>,
    >,
    tower::layer::util::Identity,
>;

/// A server that says what it serves: [`server`] with server reflection (v1, and v1alpha for
/// older clients such as grpcio-reflection) and `grpc.health.v1.Health`, both naming exactly
/// `services` (the socket's own; reflection and health are listed too), every one SERVING.
pub async fn introspected_server(
    services: &[&'static str],
) -> tonic::transport::server::Router<ServerLayer> {
    use tonic_reflection::server::Builder;
    let names = || services.iter().copied().chain(["grpc.health.v1.Health"]);
    let builder = || {
        names().fold(
            Builder::configure()
                .register_encoded_file_descriptor_set(paddock_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |b, name| b.with_service_name(name),
        )
    };
    let v1 = builder()
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .expect("the descriptor sets compiled by build.rs and tonic-health are valid");
    let v1alpha = builder()
        .with_service_name("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()
        .expect("the descriptor sets compiled by build.rs and tonic-health are valid");
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in services {
        reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    server()
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(health)
}

/// A server builder with [`ServerLayer`].
pub fn server() -> tonic::transport::Server<ServerLayer> {
    tonic::transport::Server::builder().layer(tower::util::MapResponseLayer::new(
        undecodable_is_invalid_argument as fn(_) -> _,
    ))
}

/// The request metadata key by which a client says which of paddock's additions to the seeds
/// it understands (see the daemon's `api::extensions`).
pub const EXTENSIONS_KEY: &str = "paddock-extensions";

/// paddock's own clients: every request says it understands everything paddock adds.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnderstandAll;

impl tonic::service::Interceptor for UnderstandAll {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert(
            EXTENSIONS_KEY,
            tonic::metadata::MetadataValue::from_static("all"),
        );
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_bounded() {
        let huge = "x".repeat(3_500_000);
        let s = error_status(
            tonic::Code::NotFound,
            "OBEY-2010",
            format!("session {huge}"),
        );
        assert!(s.message().len() < STATUS_MESSAGE_BYTES_MAX + 64);
        assert!(s.message().contains("[truncated"));
        assert_eq!(status_message("short"), "short");
    }

    #[test]
    fn codes_round_trip_through_error_info() {
        for code in ErrorCode::ALL {
            let s = error_status(tonic::Code::FailedPrecondition, &code.to_string(), "x");
            assert_eq!(obey_code(&s), Some(code));
        }
        let other = error_status(tonic::Code::Unavailable, "DAEMON_UNAVAILABLE", "x");
        assert_eq!(obey_code(&other), None);
        assert_eq!(
            obey_code(&tonic::Status::internal("OBEY-2011: text only")),
            None
        );
    }
}
