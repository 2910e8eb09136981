//! `paddock runner --socket PATH`: a separate process that runs agents and commands for a
//! client (the daemon) and serves the centaurx `runner.v1.Runner` service on a Unix socket.
//!
//! Why a separate process: it owns the children. A client that restarts (a daemon upgrade)
//! loses nothing: the runs go on, their events stay numbered and buffered here, and the client
//! finds them again with `ListRuns` and resumes each stream with `AttachRun{after_seq}`.
//!
//! The seed's RPCs behave as the seed says:
//! - `Exec` / `ExecResume`: `$PADDOCK_CODEX_BIN` (default `codex`) `exec --json [--model M] --
//!   <prompt>` / `exec --json [--model M] resume -- <thread_id> <prompt>` in `working_dir`,
//!   stdin /dev/null, `SSH_AUTH_SOCK` set when given. (Flags go before `resume`, where every
//!   codex version accepts them; `--` keeps a prompt that starts with `-` a prompt.) Each
//!   stdout line becomes an `ExecEvent` ([`codex`]).
//! - `RunCommand`: `sh -lc <command>`. The seed's `use_shell` is "default true", and proto3
//!   cannot tell an unset bool from `false` (a seed client that never sets it sends `false`),
//!   so `command` always runs through the shell; paddock's `argv` extension runs an exact argv
//!   with no shell. stdout / stderr become `CommandOutput` chunks of at most 64 KiB.
//! - Every run's stream: `RunStatus{STARTED}`, its events, then `RunStatus{FINISHED,
//!   exit_code}` — or `FAILED` (exit code 128 + signal) when a signal ended it — and the stream
//!   closes. A process that cannot be started gives only `RunStatus{FAILED}` with the reason
//!   (exit code 127 not found, 126 not executable, -1 otherwise).
//! - Validation errors are `INVALID_ARGUMENT`; a `run_id` this runner still knows (live or
//!   among the last 1,000 finished) is `ALREADY_EXISTS`; more live runs than `--max-runs`
//!   (or the client's `SetLimits`) allow is `RESOURCE_EXHAUSTED`.
//! - `SignalSession`: the signal goes to the run's whole process group; `ok = false` with
//!   "not found" / "already exited" / "not started yet".
//!
//! paddock's extensions (marked `// paddock extension:` in the proto): `RunnerEvent.seq`,
//! `EventsTruncated`, `ListRuns`, `AttachRun`, `WriteStdin` (+ `RunCommandRequest.keep_stdin`),
//! `RunCommandRequest.stop_on_hangup` (the run is stopped as by `StopRun` when the stream of
//! the call that started it closes first: a daemon's tasks end with the daemon),
//! `StopRun` (TERM, then KILL after `grace_ms`, default 10 s: the core's
//! [`paddock_core::run`] machine decides), `AckRun` (the client stored a run's events up to a
//! seq: the runner stops keeping them) and `SetLimits` (a client's limits reach a runner it
//! did not start). The buffer behind them: [`registry`].
//!
//! On SIGTERM / SIGINT the runner stops every run (TERM, KILL after 10 s), waits for them,
//! and exits 0.
//!
//! A note for clients: the server is tonic, whose HTTP/2 layer (h2) rejects a request whose
//! `:authority` is not a valid URI authority. gRPC C-core clients (Python `grpcio` ≥ 1.57 and
//! others) send the percent-encoded socket path as the authority for a `unix:` target, which
//! is rejected (RST_STREAM, PROTOCOL_ERROR): such a client must set the channel option
//! `grpc.default_authority` to `localhost`.

pub mod client;
pub mod codex;
pub mod process;
pub mod registry;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::run::{Input, Signal, DEFAULT_KILL_GRACE};
use paddock_core::Duration as CoreDuration;
use paddock_proto::runner::v1::runner_server::{Runner, RunnerServer};
use paddock_proto::runner::v1::{
    AckRunRequest, AckRunResponse, AttachRunRequest, ExecRequest, ExecResumeRequest,
    ListRunsRequest, ListRunsResponse, ProcessSignal, RunCommandRequest, RunKind, RunnerEvent,
    SetLimitsRequest, SetLimitsResponse, SignalRequest, SignalResponse, StopRunRequest,
    StopRunResponse, WriteStdinRequest, WriteStdinResponse,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use process::{Launch, OutputMode};
pub use registry::Limits;
use registry::{CreateError, Registry, Run, StdinMsg};

use paddock_sys::paths::Clock;

/// Largest request accepted (a prompt, a stdin write).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Largest event sent. Events stay under it by construction (an `ExecEvent` carries its line,
/// at most [`paddock_sys::proc::LINE_BYTES_MAX`], at most three times; chunks ≤ 64 KiB); this only
/// guards against a mistake.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;
/// Longest prompt / command: Linux takes at most 128 KiB (NUL included) in one argv string.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;
/// Longest run id.
pub const MAX_RUN_ID_BYTES: usize = 256;
/// Longest StopRun grace period.
pub const MAX_GRACE_MS: u32 = 3_600_000;
/// How long the runner waits for its runs to end when it is told to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(DEFAULT_KILL_GRACE.millis() + 2_000);

/// The program `Exec` runs.
pub fn codex_program() -> OsString {
    std::env::var_os("PADDOCK_CODEX_BIN")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| OsString::from("codex"))
}

/// The `Runner` service.
#[derive(Clone)]
pub struct RunnerService {
    reg: Arc<Registry>,
    codex: OsString,
    clock: Clock,
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<RunnerEvent, Status>> + Send>>;

impl RunnerService {
    pub fn new(reg: Arc<Registry>, codex: OsString) -> Self {
        RunnerService {
            reg,
            codex,
            clock: Clock::start(),
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.reg
    }

    /// Registers the run, attaches the caller's stream, starts the process. With
    /// `stop_on_hangup` the run is stopped when that stream is dropped before its end.
    async fn start(
        &self,
        run_id: &str,
        kind: RunKind,
        working_dir: &str,
        launch: Launch,
        mode: OutputMode,
        stop_on_hangup: bool,
    ) -> Result<Response<EventStream>, Status> {
        let run = self
            .reg
            .create(run_id, kind, working_dir)
            .map_err(|e| match e {
                CreateError::AlreadyExists => {
                    Status::already_exists(format!("run_id {run_id:?} is already known"))
                }
                CreateError::TooManyRuns(n) => {
                    Status::resource_exhausted(format!("{n} runs are live: that is the limit"))
                }
            })?;
        let reader = run.attach(0);
        // In a task of its own: a client that hangs up mid-call drops this handler, and must
        // not leave a spawned child unsupervised.
        let started = tokio::spawn(process::start(self.reg.clone(), run.clone(), launch, mode));
        if let Err(e) = started.await {
            return Err(Status::internal(format!("starting the run failed: {e}")));
        }
        let stream = reader.into_stream();
        if !stop_on_hangup {
            return Ok(Response::new(Box::pin(stream)));
        }
        let hangup = StopOnHangup {
            service: self.clone(),
            run,
        };
        // The guard lives as long as the stream: tonic drops both when the client goes away,
        // and a stream read to its end leaves a run the stop no longer applies to.
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            stream,
            move |ev| {
                let _ = &hangup;
                ev
            },
        ))))
    }

    /// Sends the run's machine `input`; arms the timer it asks for.
    fn apply(&self, run: &Arc<Run>, input: Input) -> Result<(), paddock_core::run::Refusal> {
        // Signal / Stop / Tick emit no statuses: only process events do.
        run.apply(input)?;
        self.arm_timer(run);
        Ok(())
    }

    /// Feeds `Tick` at the run's next deadline (a stop's KILL). A deadline that moved is
    /// harmless: an early tick does nothing, and the later one is armed by the input that
    /// moved it.
    fn arm_timer(&self, run: &Arc<Run>) {
        if let Some(at) = run.poll_timeout().and_then(|at| self.clock.deadline(at)) {
            let this = self.clone();
            let run = run.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                let now = this.clock.instant();
                if run.apply(Input::Tick { now }).is_ok() {
                    this.arm_timer(&run);
                }
            });
        }
    }

    /// Stops every live run (runner shutdown).
    pub fn stop_all(&self) {
        for run in self.reg.live() {
            let _ = self.apply(
                &run,
                Input::Stop {
                    now: self.clock.instant(),
                    grace: DEFAULT_KILL_GRACE,
                },
            );
        }
    }
}

/// Stops its run when dropped: held by the stream of a call with `stop_on_hangup`.
struct StopOnHangup {
    service: RunnerService,
    run: Arc<Run>,
}

impl Drop for StopOnHangup {
    fn drop(&mut self) {
        // The stop arms its KILL on the runtime; a runtime that is shutting down stops every
        // run itself.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let stop = Input::Stop {
            now: self.service.clock.instant(),
            grace: DEFAULT_KILL_GRACE,
        };
        // Refused for a run that already ended: nothing to stop.
        if self.service.apply(&self.run, stop).is_ok() {
            tracing::info!(run = %self.run.id, "the client that started the run hung up: stopping it");
        }
    }
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg.into())
}

fn check_run_id(run_id: &str) -> Result<(), Status> {
    if run_id.is_empty() {
        return Err(invalid("run_id is required"));
    }
    if run_id.len() > MAX_RUN_ID_BYTES {
        return Err(invalid(format!(
            "run_id is {} bytes; at most {MAX_RUN_ID_BYTES}",
            run_id.len()
        )));
    }
    Ok(())
}

fn check_working_dir(dir: &str) -> Result<PathBuf, Status> {
    if dir.is_empty() {
        return Err(invalid("working_dir is required"));
    }
    let path = PathBuf::from(dir);
    if !path.is_dir() {
        return Err(invalid(format!(
            "working_dir {dir:?} is not an existing directory"
        )));
    }
    Ok(path)
}

/// A string that becomes one argv element.
fn check_arg(what: &str, value: &str, required: bool) -> Result<(), Status> {
    if required && value.trim().is_empty() {
        return Err(invalid(format!("{what} is required")));
    }
    if value.len() > MAX_ARG_BYTES {
        return Err(invalid(format!(
            "{what} is {} bytes; at most {MAX_ARG_BYTES} (one argument of a process)",
            value.len()
        )));
    }
    if value.contains('\0') {
        return Err(invalid(format!("{what} contains a NUL byte")));
    }
    Ok(())
}

fn ssh_auth_sock(s: &str) -> Result<Option<String>, Status> {
    check_arg("ssh_auth_sock", s, false)?;
    Ok((!s.is_empty()).then(|| s.to_string()))
}

fn check_json(json: bool) -> Result<(), Status> {
    if json {
        Ok(())
    } else {
        Err(invalid(
            "json must be true: the runner streams codex's JSONL events",
        ))
    }
}

fn codex_args(model: &str, tail: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["exec".into(), "--json".into()];
    if !model.is_empty() {
        args.push("--model".into());
        args.push(model.into());
    }
    args.extend(tail.iter().map(OsString::from));
    args
}

/// What an `Exec` and an `ExecResume` share: a codex run of `codex exec --json`.
struct Codex<'a> {
    run_id: &'a str,
    working_dir: &'a str,
    /// The run's own arguments that must be given, checked in this order.
    required: &'a [(&'static str, &'a str)],
    model: &'a str,
    ssh_auth_sock: &'a str,
    json: bool,
}

impl RunnerService {
    /// Checks what every codex run is given and starts `codex exec … TAIL` as run `kind`.
    async fn start_codex(
        &self,
        c: Codex<'_>,
        kind: RunKind,
        tail: &[&str],
    ) -> Result<Response<EventStream>, Status> {
        check_run_id(c.run_id)?;
        let cwd = check_working_dir(c.working_dir)?;
        for (name, value) in c.required {
            check_arg(name, value, true)?;
        }
        check_arg("model", c.model, false)?;
        check_json(c.json)?;
        let launch = Launch {
            program: self.codex.clone(),
            args: codex_args(c.model, tail),
            cwd,
            ssh_auth_sock: ssh_auth_sock(c.ssh_auth_sock)?,
            stdin_piped: false,
            env: Vec::new(),
        };
        self.start(
            c.run_id,
            kind,
            c.working_dir,
            launch,
            OutputMode::Jsonl,
            false,
        )
        .await
    }
}

#[tonic::async_trait]
impl Runner for RunnerService {
    type ExecStream = EventStream;
    type ExecResumeStream = EventStream;
    type RunCommandStream = EventStream;
    type AttachRunStream = EventStream;

    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<EventStream>, Status> {
        let r = req.into_inner();
        let codex = Codex {
            run_id: &r.run_id,
            working_dir: &r.working_dir,
            required: &[("prompt", &r.prompt)],
            model: &r.model,
            ssh_auth_sock: &r.ssh_auth_sock,
            json: r.json,
        };
        self.start_codex(codex, RunKind::Exec, &["--", &r.prompt])
            .await
    }

    async fn exec_resume(
        &self,
        req: Request<ExecResumeRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = req.into_inner();
        let codex = Codex {
            run_id: &r.run_id,
            working_dir: &r.working_dir,
            required: &[
                ("prompt", &r.prompt),
                ("resume_session_id", &r.resume_session_id),
            ],
            model: &r.model,
            ssh_auth_sock: &r.ssh_auth_sock,
            json: r.json,
        };
        let tail = ["resume", "--", &r.resume_session_id, &r.prompt];
        self.start_codex(codex, RunKind::ExecResume, &tail).await
    }

    async fn run_command(
        &self,
        req: Request<RunCommandRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        let cwd = check_working_dir(&r.working_dir)?;
        if r.argv.is_empty() {
            check_arg("command", &r.command, true)?;
        }
        for a in &r.argv {
            check_arg("argv", a, false)?;
        }
        let (program, args) = if let Some((program, rest)) = r.argv.split_first() {
            if program.is_empty() {
                return Err(invalid("argv[0] must name a program"));
            }
            (
                OsString::from(program),
                rest.iter().map(OsString::from).collect(),
            )
        } else {
            // The seed's `use_shell` is "default true"; proto3 cannot tell an unset bool from
            // false, so `command` always runs as `sh -lc <command>` (a client that wants no
            // shell gives `argv`). Said once per run, for a client that meant "no shell".
            if !r.use_shell {
                tracing::warn!(
                    run = %r.run_id,
                    "RunCommand without argv runs `command` through sh -lc (use_shell=false cannot \
                     be told from unset); send argv to run without a shell"
                );
            }
            (
                OsString::from("sh"),
                vec![OsString::from("-lc"), OsString::from(&r.command)],
            )
        };
        let launch = Launch {
            program,
            args,
            cwd,
            ssh_auth_sock: ssh_auth_sock(&r.ssh_auth_sock)?,
            stdin_piped: r.keep_stdin,
            env: r.environment.into_iter().collect(),
        };
        self.start(
            &r.run_id,
            RunKind::Command,
            &r.working_dir,
            launch,
            OutputMode::Chunks,
            r.stop_on_hangup,
        )
        .await
    }

    async fn signal_session(
        &self,
        req: Request<SignalRequest>,
    ) -> Result<Response<SignalResponse>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        let signal = match ProcessSignal::try_from(r.signal) {
            Ok(ProcessSignal::Hup) => Signal::Hup,
            Ok(ProcessSignal::Term) => Signal::Term,
            Ok(ProcessSignal::Kill) => Signal::Kill,
            Ok(ProcessSignal::Unspecified) | Err(_) => {
                return Err(invalid("signal must be HUP, TERM or KILL"))
            }
        };
        let reply = |ok: bool, message: String| Ok(Response::new(SignalResponse { ok, message }));
        let Some(run) = self.reg.get(&r.run_id) else {
            return reply(false, "not found".into());
        };
        match self.apply(&run, Input::Signal { signal }) {
            Ok(()) => reply(
                true,
                format!("sent {} to process group {}", signal.name(), run.info().pid),
            ),
            Err(refusal) => reply(false, refusal.message().into()),
        }
    }

    async fn list_runs(
        &self,
        _req: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        Ok(Response::new(ListRunsResponse {
            runs: self.reg.list(),
        }))
    }

    async fn attach_run(
        &self,
        req: Request<AttachRunRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        let run = self
            .reg
            .get(&r.run_id)
            .ok_or_else(|| Status::not_found(format!("run {:?} is not known", r.run_id)))?;
        Ok(Response::new(Box::pin(
            run.attach(r.after_seq).into_stream(),
        )))
    }

    async fn write_stdin(
        &self,
        req: Request<WriteStdinRequest>,
    ) -> Result<Response<WriteStdinResponse>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        let reply =
            |ok: bool, message: String| Ok(Response::new(WriteStdinResponse { ok, message }));
        let Some(run) = self.reg.get(&r.run_id) else {
            return reply(false, "not found".into());
        };
        let tx = match run.stdin_for_write(r.close) {
            Ok(tx) => tx,
            Err(why) => return reply(false, why.into()),
        };
        let (ack, done) = oneshot::channel();
        let len = r.data.len();
        let msg = StdinMsg {
            data: r.data,
            close: r.close,
            ack,
        };
        if tx.send(msg).await.is_err() {
            return reply(false, "stdin is closed".into());
        }
        match done.await {
            Ok(Ok(())) if r.close => reply(true, format!("wrote {len} bytes; stdin closed")),
            Ok(Ok(())) => reply(true, format!("wrote {len} bytes")),
            Ok(Err(e)) => reply(false, format!("stdin write failed: {e}")),
            Err(_) => reply(false, "stdin is closed".into()),
        }
    }

    async fn stop_run(
        &self,
        req: Request<StopRunRequest>,
    ) -> Result<Response<StopRunResponse>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        if r.grace_ms > MAX_GRACE_MS {
            return Err(invalid(format!(
                "grace_ms is {}; at most {MAX_GRACE_MS}",
                r.grace_ms
            )));
        }
        let grace = match r.grace_ms {
            0 => DEFAULT_KILL_GRACE,
            g => CoreDuration::from_millis(u64::from(g)),
        };
        let reply = |ok: bool, message: String| Ok(Response::new(StopRunResponse { ok, message }));
        let Some(run) = self.reg.get(&r.run_id) else {
            return reply(false, "not found".into());
        };
        let input = Input::Stop {
            now: self.clock.instant(),
            grace,
        };
        match self.apply(&run, input) {
            Ok(()) => reply(
                true,
                format!(
                    "sent SIGTERM; SIGKILL follows in {} ms if it is still running",
                    grace.millis()
                ),
            ),
            Err(refusal) => reply(false, refusal.message().into()),
        }
    }

    async fn ack_run(
        &self,
        req: Request<AckRunRequest>,
    ) -> Result<Response<AckRunResponse>, Status> {
        let r = req.into_inner();
        check_run_id(&r.run_id)?;
        let Some(run) = self.reg.get(&r.run_id) else {
            return Ok(Response::new(AckRunResponse {
                ok: false,
                message: "not found".into(),
                first_seq: 0,
            }));
        };
        let first_seq = run.ack(r.seq);
        Ok(Response::new(AckRunResponse {
            ok: true,
            message: String::new(),
            first_seq,
        }))
    }

    async fn set_limits(
        &self,
        req: Request<SetLimitsRequest>,
    ) -> Result<Response<SetLimitsResponse>, Status> {
        let r = req.into_inner();
        let now = self.reg.set_limits(
            limit(r.max_runs.into()),
            limit(r.buffer_events.into()),
            limit(r.buffer_bytes),
        );
        tracing::info!(
            max_runs = now.live_runs,
            buffer_events = now.events_per_run,
            buffer_bytes = now.bytes_per_run,
            "runner limits set by the client"
        );
        let clamp = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(SetLimitsResponse {
            max_runs: clamp(now.live_runs),
            buffer_events: clamp(now.events_per_run),
            buffer_bytes: now.bytes_per_run as u64,
        }))
    }
}

/// `Some(n)` for a limit a `SetLimits` request sets (0 keeps it).
fn limit(n: u64) -> Option<usize> {
    (n > 0).then(|| usize::try_from(n).unwrap_or(usize::MAX))
}

/// The service with its limits, ready to add to a tonic server.
pub fn service(reg: Arc<Registry>) -> (RunnerService, RunnerServer<RunnerService>) {
    let svc = RunnerService::new(reg, codex_program());
    let server = RunnerServer::new(svc.clone())
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_EVENT_BYTES);
    (svc, server)
}

/// Serves the runner on `socket` until SIGTERM / SIGINT.
/// The file a runner writes its pid to: `<socket>.pid`.
pub fn pid_file(socket: &Path) -> std::path::PathBuf {
    let mut name = socket.as_os_str().to_owned();
    name.push(".pid");
    std::path::PathBuf::from(name)
}

/// Why the runner could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Socket(#[from] paddock_sys::socket::BindError),
    #[error("server error: {0}")]
    Serve(#[from] tonic::transport::Error),
}

pub async fn serve(socket: &Path, limits: Limits) -> Result<(), ServeError> {
    let listener = paddock_sys::socket::bind(socket, "paddock runner")?;
    // A runner starts only where none runs (the socket was free): whatever a previous runner
    // of this data dir left running (the descendants of its agents, after a SIGKILL) is ended
    // before anything new starts.
    let data_dir = socket.parent().unwrap_or(Path::new(".")).to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        paddock_sys::contain::set_owner(&data_dir, paddock_sys::contain::Role::Runner);
        paddock_sys::contain::reap_orphans(&[paddock_sys::contain::Role::Runner])
    })
    .await;
    // Who owns the socket, for a daemon that needs to stop its runner (or a test that must
    // clean up): `<socket>.pid`, removed on a clean exit.
    let pid_file = pid_file(socket);
    let _ = std::fs::write(&pid_file, std::process::id().to_string());
    tracing::info!(
        max_runs = limits.live_runs,
        buffer_events = limits.events_per_run,
        buffer_bytes = limits.bytes_per_run,
        "runner limits"
    );
    let reg = Arc::new(Registry::new(limits));
    let (svc, server) = service(reg.clone());

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        paddock_sys::proc::stop_signal().await;
        tracing::info!("signal received: stopping every run");
        svc.stop_all();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
        while reg.live_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = stop_tx.send(true);
    });

    tracing::info!(socket = %socket.display(), codex = ?codex_program(), "paddock runner listening");
    // The runner is the daemon's private helper: only its own user may talk to it.
    let incoming = paddock_sys::socket::incoming(
        listener,
        paddock_sys::socket::Peers::owner_only(),
        "paddock runner",
    );
    let shutdown = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let name = <RunnerServer<RunnerService> as tonic::server::NamedService>::NAME;
    let server = paddock_sys::transport::introspected_server(&[name])
        .await
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, shutdown);
    tokio::pin!(server);
    // Once told to stop, give open streams a moment to finish, then go.
    let result = tokio::select! {
        r = &mut server => r.map_err(ServeError::from),
        _ = async {
            let _ = stop_rx.wait_for(|s| *s).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        } => Ok(()),
    };
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(&pid_file);
    paddock_sys::contain::release();
    result
}

/// `paddock runner --socket PATH`: the runner in the foreground; the process exit code.
pub fn run(socket: PathBuf, log: &paddock_sys::paths::LogArgs, limits: Limits) -> i32 {
    log.init();
    let rt = match paddock_sys::service_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("paddock runner: tokio runtime: {e}");
            return 1;
        }
    };
    match rt.block_on(serve(&socket, limits)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("paddock runner: {e}");
            1
        }
    }
}
