//! The relay: how a session's agent and commands run in a `paddock runner` on another machine
//! (ssh, a qemu VM) or in a pod (kubernetes), supervised here like any agent.
//!
//! - Entering ([`enter`]): the launch becomes `paddock __ssh-run … -- <argv>`, a relay the
//!   local runner supervises like any agent. The relay reaches the runner there — through an
//!   ssh forward of its socket (`ssh -N -L`, streamlocal forwarding) to a private socket of the
//!   session's environment, or through exec streams into the pod ([`super::kube`]) — starts
//!   the run there (`RunCommand` with the argv, the working directory and the session's
//!   variables), copies its output to its own stdout and stderr and its own stdin to the
//!   run's, and forwards TERM, INT and HUP as the run's signals. The run's exit is the relay's.
//! - A dropped connection is not a dead agent: the remote runner keeps the run (and its
//!   output, up to its buffer bounds) while the relay reconnects with backoff and re-attaches
//!   after the last event it copied, so no output is lost or repeated. The relay says so
//!   between two of the agent's lines (it writes only whole lines, so a note can go at any
//!   time: `paddock_connection` lines): the session is marked disconnected until it is back,
//!   with a STATUS activity and a notice each way.
//! - A place that lost its runner (a host restarted, a pod's container restarted) is made
//!   ready again by the relay (the probe, the copy if the binary is gone, a runner started); a
//!   session's VM found stopped is started again from its saved command line, a pod deleted
//!   or ended is made again. The agent that ran there is gone then: the relay says so and
//!   exits, and the session fails with that reason.
//! - Stops: TERM (or INT) to the relay becomes `StopRun` there — TERM, then KILL after 10 s, by
//!   the runner there, whether or not the relay is still around. Run ids carry the session
//!   (`ssh:<session>:<role>:<ulid>`), so an agent of the session that a killed relay left there
//!   is stopped by the session's next start.
//!
//! Limits, said plainly: a line written to the agent's stdin while the connection drops is
//! sent again after the reconnection if its write was not confirmed (an agent may then read it
//! twice). A TERM that comes while the connection is down waits for it; if the relay is killed
//! first (the stop's grace ended), the agent there runs on until the session's next start
//! stops it, or its delete (which stops the session's runs there when the host answers).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use paddock_core::{SessionId, SshTarget};
use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::ssh::{provision, run_prefix, socket_path, ssh_options, ssh_program, stop_leftovers};
use super::{Host, Made};
use paddock_sys::proc::LaunchPlan;

/// How long one connection (ssh's handshake, the forward, the runner's first answer) may take.
const CONNECT_WAIT: Duration = Duration::from_secs(20);
/// The first wait before a reconnection, doubled after every failed attempt up to
/// [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Connections through a working forward refused in a row before the runner there is taken
/// as gone (50 ms apart).
const RUNNER_REFUSALS: u32 = 20;
/// How often the relay tells the remote runner what it has copied (the runner then drops it).
const ACK_EVERY: Duration = Duration::from_millis(200);

/// `plan` as it runs on session `id`'s host: the relay, with the plan's variables as its own
/// (passed on by name, never on a command line).
pub fn enter(
    host: &Host,
    id: &SessionId,
    place: &Place,
    made: &Made,
    plan: LaunchPlan,
    role: super::Role,
) -> super::Result<LaunchPlan> {
    let Some(remote) = &made.remote else {
        return Err(super::Error::Failed(
            "the environment was not made (no host recorded)".into(),
        ));
    };
    // paddock's own programs (the scripted agent, the bridges) are the copy on the host.
    let program = if plan.program == host.exe {
        remote.paddock.clone()
    } else {
        plan.program.display().to_string()
    };
    let mut args = vec!["__ssh-run".to_string()];
    match place {
        Place::Ssh(t) => {
            args.extend([
                format!("--host={}", t.host),
                format!("--port={}", t.port),
                format!("--user={}", t.user),
                format!("--key={}", t.key_file),
                format!("--known-hosts={}", t.known_hosts),
                format!("--paddock={}", t.paddock),
                format!("--remote-dir={}", t.remote_dir),
            ]);
            if t.accept_new_host_key {
                args.push("--accept-new-host-key".into());
            }
        }
        Place::Pod(p) => args.extend([
            format!("--pod={}/{}", p.namespace, p.name),
            format!("--container={}", p.container),
            format!("--kubeconfig={}", p.kubeconfig),
            format!("--kube-context={}", p.context),
        ]),
    }
    args.extend([
        format!("--remote-paddock={}", remote.paddock),
        format!("--remote-socket={}", remote.socket),
        format!("--dir={}", host.root(id).display()),
        format!("--cwd={}", made.workdir.display()),
    ]);
    if made.vm_port.is_some() {
        args.push("--vm".into());
    }
    if role == super::Role::Agent {
        args.push("--agent".into());
    }
    for (k, _) in &plan.env {
        args.push(format!("--env={k}"));
    }
    args.push("--".into());
    args.push(program);
    args.extend(plan.args);
    Ok(LaunchPlan {
        program: host.exe.clone(),
        args,
        env: plan.env,
        cwd: host.root(id),
    })
}

/// Where a relayed run runs.
#[derive(Debug, Clone)]
pub enum Place {
    /// A host reached over ssh (the ssh driver's, a qemu VM's).
    Ssh(SshTarget),
    /// A pod reached through its cluster's API server (the kubernetes driver's).
    Pod(super::kube::PodRef),
}

impl Place {
    /// Where, for messages.
    pub fn destination(&self) -> String {
        match self {
            Place::Ssh(t) => t.destination(),
            Place::Pod(p) => p.destination(),
        }
    }
}

/// What `paddock __ssh-run` is told.
#[derive(Debug, Clone)]
pub struct RelayArgs {
    pub place: Place,
    /// The paddock binary there.
    pub remote_paddock: String,
    /// The remote runner's socket.
    pub remote_socket: String,
    /// The session's environment directory here (the forwarded socket lives in it).
    pub dir: PathBuf,
    /// The working directory on the host.
    pub cwd: String,
    /// Variables passed on to the run, by name (their values are the relay's own).
    pub env: Vec<String>,
    pub argv: Vec<String>,
    /// The host is the session's VM (its files in `dir`): started again if it is found gone.
    pub vm: bool,
    /// The run is the session's agent (else a command run in the session).
    pub agent: bool,
}

impl RelayArgs {
    /// This program (what a host that lost its copy gets again).
    fn exe(&self) -> PathBuf {
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"))
    }

    /// Makes the place ready again (its runner is gone), off the runtime: what a start
    /// would do there.
    async fn prepare_again(&self) -> Result<(), Heal> {
        let exe = self.exe();
        let (place, cwd) = (self.place.clone(), self.cwd.clone());
        if let Place::Pod(pod) = &place {
            // Only when the API server answers: a heal that cannot reach it is tried again.
            if let Err(e) = super::kube::running(pod).await {
                return Err(Heal::Retry(e.to_string()));
            }
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            let log = |line: &str| tell_line(format!("paddock: {line}"));
            match &place {
                Place::Ssh(t) => {
                    let t = SshTarget {
                        workdir: cwd,
                        ..t.clone()
                    };
                    provision(&exe, &t, &log)
                        .map(|_| ())
                        .map_err(|e| Heal::Fatal(e.to_string()))
                }
                Place::Pod(pod) => {
                    super::kube::prepare_again(&exe, pod, &cwd, &dir, &log).map_err(|e| match e {
                        super::kube::PrepareError::Retry(e) => Heal::Retry(e.to_string()),
                        super::kube::PrepareError::Fatal(e) => Heal::Fatal(e.to_string()),
                    })
                }
            }
        })
        .await
        .map_err(|e| Heal::Fatal(e.to_string()))?
    }
}

/// Why the relay could not (re)connect.
enum Connect {
    /// ssh reached the host, but no runner answers on the socket there (the host restarted).
    NoRunner(String),
    /// ssh did not get there (a dropped network, a host still booting, a refused login).
    Unreachable(String),
}

impl std::fmt::Display for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connect::NoRunner(e) | Connect::Unreachable(e) => f.write_str(e),
        }
    }
}

/// Why the relay could not make the host ready again.
enum Heal {
    /// Not now: try again later.
    Retry(String),
    /// Never: the run is lost.
    Fatal(String),
}

/// Where the relay's notes go besides its stderr (the session's `environment.log`, which
/// `session logs --environment` shows): set once the relay knows its session.
static RELAY_LOG: OnceLock<PathBuf> = OnceLock::new();

/// A note of the relay's: on its stderr (the tail the session keeps when the agent exits)
/// and in the session's environment log.
fn tell_line(line: String) {
    eprintln!("{line}");
    if let Some(dir) = RELAY_LOG.get() {
        super::log(dir, line.strip_prefix("paddock: ").unwrap_or(&line));
    }
}

macro_rules! tell {
    ($($t:tt)*) => { tell_line(format!($($t)*)) };
}

/// `paddock __ssh-run`: relays one run on the host (see the module's documentation). Returns
/// the process's exit code: the run's, 128 + its signal, or 255 when it could not be started.
pub fn relay(a: RelayArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tell!("paddock: cannot start a runtime: {e}");
            return 255;
        }
    };
    let _ = RELAY_LOG.set(a.dir.clone());
    let code = rt.block_on(Relay::new(a).run());
    // Not waited for: the thread blocked reading our stdin would hold the exit up forever.
    rt.shutdown_background();
    code
}

/// One `ssh -N -L` forward of the remote runner's socket, ended when dropped (none for a pod:
/// the channel owns its exec streams).
struct Forward {
    pid: Option<u32>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            paddock_sys::proc::signal_group(pid, paddock_core::Signal::Kill);
        }
    }
}

struct Relay {
    a: RelayArgs,
    run_id: String,
    local: PathBuf,
    out: tokio::io::Stdout,
    /// The newest run event copied (the re-attach point).
    last_seq: u64,
    /// The start of a line of the agent's not yet whole: only whole lines are written, so
    /// that a note can go out at any time.
    partial: Vec<u8>,
}

impl Relay {
    fn new(a: RelayArgs) -> Relay {
        let tag = ulid::Ulid::new().to_string().to_ascii_lowercase();
        let name = format!("ssh-{}.sock", &tag[20..]);
        let local = socket_path(&a.dir, &name);
        Relay {
            run_id: format!("{}{tag}", run_prefix(&a.dir, a.agent)),
            local,
            a,
            out: tokio::io::stdout(),
            last_seq: 0,
            partial: Vec::new(),
        }
    }

    /// Connects to the runner there.
    async fn connect(&self) -> Result<(Forward, RunnerClient<Channel>), Connect> {
        match &self.a.place {
            Place::Ssh(t) => self.connect_ssh(t).await,
            Place::Pod(p) => self.connect_pod(p).await,
        }
    }

    /// Opens exec streams to the runner in the pod: the pod must run (the API server says),
    /// then the runner must answer through them.
    async fn connect_pod(
        &self,
        pod: &super::kube::PodRef,
    ) -> Result<(Forward, RunnerClient<Channel>), Connect> {
        match super::kube::running(pod).await {
            Err(e) => return Err(Connect::Unreachable(e.to_string())),
            Ok(false) => {
                return Err(Connect::NoRunner(format!(
                    "{} is not running",
                    pod.destination()
                )))
            }
            Ok(true) => {}
        }
        let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
        // The pipe there exits at once when no runner answers on its socket.
        let mut refused = 0;
        loop {
            let why = match super::kube::runner_channel(
                pod,
                &self.a.remote_paddock,
                &self.a.remote_socket,
            )
            .await
            {
                Ok(ch) => {
                    let mut client = RunnerClient::new(ch);
                    match client.list_runs(rpb::ListRunsRequest {}).await {
                        Ok(_) => return Ok((Forward { pid: None }, client)),
                        Err(e) => e.message().to_string(),
                    }
                }
                Err(super::kube::ChannelError::NoAnswer(e)) => e,
                // Not the runner's doing: the way in is down for now.
                Err(super::kube::ChannelError::Unreachable(e)) => {
                    return Err(Connect::Unreachable(e))
                }
            };
            refused += 1;
            if refused >= RUNNER_REFUSALS {
                return Err(Connect::NoRunner(format!(
                    "{} runs, but no runner answers on {} there ({why})",
                    pod.destination(),
                    self.a.remote_socket
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Connect::Unreachable(format!(
                    "no runner answered in {} within {}s ({why})",
                    pod.destination(),
                    CONNECT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Forwards the remote runner's socket and connects to it through the forward.
    async fn connect_ssh(
        &self,
        t: &SshTarget,
    ) -> Result<(Forward, RunnerClient<Channel>), Connect> {
        let _ = std::fs::remove_file(&self.local);
        let ssh = ssh_program().map_err(|e| Connect::Unreachable(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(ssh);
        cmd.args(ssh_options(t))
            .args(["-N", "-o", "ExitOnForwardFailure=yes"])
            .args([
                "-o",
                "StreamLocalBindUnlink=yes",
                "-o",
                "StreamLocalBindMask=0177",
            ])
            .arg("-L")
            .arg(format!("{}:{}", self.local.display(), self.a.remote_socket))
            .arg("--")
            .arg(&t.host);
        // Its own group, dying with us: a TERM meant for the relay does not cut the line the
        // relay forwards it on.
        let (process, pipes) =
            paddock_sys::proc::spawn(cmd, false, paddock_sys::contain::new_tag())
                .map_err(|e| Connect::Unreachable(format!("cannot run ssh: {e}")))?;
        let forward = Forward {
            pid: Some(process.pid),
        };
        let stderr = tokio::spawn(paddock_sys::proc::StderrTail::read(pipes.stderr));
        let exited = tokio::spawn(process.wait());
        let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
        // Connections through the forward that the host closed at once: its runner's socket
        // is not there.
        let mut refused = 0;
        loop {
            if exited.is_finished() {
                let why = stderr.await.unwrap_or_default();
                return Err(Connect::Unreachable(format!(
                    "ssh to {} ended: {}",
                    t.destination(),
                    if why.is_empty() {
                        "no reason given"
                    } else {
                        why.trim()
                    }
                )));
            }
            // The socket is there once ssh logged in and set the forward up.
            if self.local.exists() {
                if let Ok(ch) = paddock_sys::transport::channel(&self.local).await {
                    let mut client = RunnerClient::new(ch);
                    if client.list_runs(rpb::ListRunsRequest {}).await.is_ok() {
                        return Ok((forward, client));
                    }
                }
                refused += 1;
                if refused >= RUNNER_REFUSALS {
                    return Err(Connect::NoRunner(format!(
                        "ssh reaches {}, but no runner answers on {} there",
                        t.destination(),
                        self.a.remote_socket
                    )));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Connect::Unreachable(format!(
                    "no runner answered through ssh to {} within {}s",
                    t.destination(),
                    CONNECT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Connects, making the host ready again first if it is not: a VM found stopped is
    /// started again, a runner found gone (the host restarted) is provisioned again.
    async fn connect_healing(&self) -> Result<(Forward, RunnerClient<Channel>), Heal> {
        if self.a.vm && !super::qemu::running(&self.a.dir) {
            let dir = self.a.dir.clone();
            tokio::task::spawn_blocking(move || super::qemu::restart(&dir))
                .await
                .map_err(|e| Heal::Fatal(e.to_string()))?
                .map_err(|e| Heal::Fatal(e.to_string()))?;
        }
        match self.connect().await {
            Ok(c) => Ok(c),
            Err(Connect::NoRunner(e)) => {
                tell!("paddock: {e}; making it ready again");
                self.a.prepare_again().await?;
                self.connect().await.map_err(|e| Heal::Retry(e.to_string()))
            }
            Err(Connect::Unreachable(e)) => Err(Heal::Retry(e)),
        }
    }

    async fn run(mut self) -> i32 {
        let dest = self.a.place.destination();
        let (mut forward, mut client) = match self.connect_healing().await {
            Ok(c) => c,
            Err(Heal::Retry(e) | Heal::Fatal(e)) => {
                tell!("paddock: {e}");
                return 255;
            }
        };
        if self.a.agent {
            stop_leftovers(&mut client, &run_prefix(&self.a.dir, true)).await;
        }
        let environment = self
            .a
            .env
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
            .collect();
        let req = rpb::RunCommandRequest {
            run_id: self.run_id.clone(),
            working_dir: self.a.cwd.clone(),
            command: String::new(),
            use_shell: false,
            ssh_auth_sock: String::new(),
            keep_stdin: true,
            argv: self.a.argv.clone(),
            environment,
            // A dropped connection is not a dead agent: the relay reconnects and re-attaches.
            stop_on_hangup: false,
        };
        let mut stream = match client.run_command(req).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                tell!(
                    "paddock: the runner on {dest} refused the run: {}",
                    e.message()
                );
                return 255;
            }
        };
        let (clients, current) = watch::channel(Some(client));
        let (acked, acks) = watch::channel(0u64);
        tokio::spawn(pump_stdin(self.run_id.clone(), current.clone()));
        tokio::spawn(pump_signals(self.run_id.clone(), current.clone()));
        tokio::spawn(pump_acks(self.run_id.clone(), current, acks));
        loop {
            match stream.message().await {
                Ok(Some(ev)) => {
                    if let Some(code) = self.event(ev).await {
                        let _ = self.out.flush().await;
                        drop(forward);
                        return code;
                    }
                    let _ = acked.send(self.last_seq);
                }
                Ok(None) | Err(_) => {
                    let _ = clients.send(None);
                    drop(forward);
                    tell!("paddock: the connection to {dest} was lost; reconnecting");
                    self.say(Note::Connection(
                        false,
                        format!(
                            "the connection to {dest} was lost; the agent runs on there, \
                             reconnecting"
                        ),
                    ))
                    .await;
                    let mut delay = BACKOFF_FIRST;
                    let mut attempt = 0u32;
                    loop {
                        tokio::time::sleep(delay).await;
                        attempt += 1;
                        match self.connect_healing().await {
                            Ok((f, mut c)) => {
                                let req = rpb::AttachRunRequest {
                                    run_id: self.run_id.clone(),
                                    after_seq: self.last_seq,
                                };
                                match c.attach_run(req).await {
                                    Ok(s) => {
                                        forward = f;
                                        stream = s.into_inner();
                                        let _ = clients.send(Some(c));
                                        self.say(Note::Connection(
                                            true,
                                            format!("reconnected to {dest} (attempt {attempt})"),
                                        ))
                                        .await;
                                        break;
                                    }
                                    Err(e) if e.code() == tonic::Code::NotFound => {
                                        tell!(
                                            "paddock: the agent's run is gone on {dest} (was \
                                             the host or its runner restarted?)"
                                        );
                                        return 255;
                                    }
                                    Err(e) => tell!(
                                        "paddock: re-attaching on {dest} (attempt {attempt}): {}",
                                        e.message()
                                    ),
                                }
                            }
                            Err(Heal::Fatal(e)) => {
                                tell!("paddock: {dest} cannot be made ready again: {e}");
                                return 255;
                            }
                            Err(Heal::Retry(e)) => {
                                tell!("paddock: reconnecting to {dest} (attempt {attempt}): {e}")
                            }
                        }
                        delay = (delay * 2).min(BACKOFF_MAX);
                    }
                }
            }
        }
    }

    /// Copies one run event; the exit code once the run ended.
    async fn event(&mut self, ev: rpb::RunnerEvent) -> Option<i32> {
        use rpb::runner_event::Payload;
        if ev.seq != 0 && ev.seq <= self.last_seq {
            return None; // copied before the connection dropped
        }
        match ev.payload {
            Some(Payload::CommandOutput(o)) if o.stream == rpb::StreamKind::Stderr as i32 => {
                let mut err = tokio::io::stderr();
                let _ = err.write_all(o.text.as_bytes()).await;
            }
            Some(Payload::CommandOutput(o)) => {
                self.partial.extend_from_slice(o.text.as_bytes());
                if let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') {
                    let whole: Vec<u8> = self.partial.drain(..=end).collect();
                    if self.out.write_all(&whole).await.is_err() {
                        // Nobody reads us any more: the supervisor is gone.
                        return Some(141);
                    }
                    let _ = self.out.flush().await;
                }
            }
            Some(Payload::Status(st)) => {
                let state = rpb::RunState::try_from(st.state).unwrap_or_default();
                if matches!(state, rpb::RunState::Finished | rpb::RunState::Failed) {
                    if state == rpb::RunState::Failed && !st.message.is_empty() {
                        tell!("paddock: on {}: {}", self.a.place.destination(), st.message);
                    }
                    // The last line, if the agent did not end it.
                    if !self.partial.is_empty() {
                        let rest = std::mem::take(&mut self.partial);
                        let _ = self.out.write_all(&rest).await;
                    }
                    // A run that could not be started (-1) is not a success.
                    return Some(if st.exit_code < 0 {
                        255
                    } else {
                        st.exit_code.min(255)
                    });
                }
            }
            Some(Payload::Truncated(t)) => {
                // What was kept of a line before the gap does not join what comes after it.
                self.partial.clear();
                self.say(Note::Status(format!(
                    "{} events of the agent's output on {} were lost (more than the runner there \
                     keeps came while paddock was away)",
                    t.dropped,
                    self.a.place.destination()
                )))
                .await;
            }
            Some(Payload::Exec(_)) | None => {}
        }
        if ev.seq > 0 {
            self.last_seq = ev.seq;
        }
        None
    }

    /// A note for the session, between two of the agent's lines (only whole lines are
    /// written, so it can go at once).
    async fn say(&mut self, note: Note) {
        self.write_note(&note).await;
    }

    async fn write_note(&mut self, note: &Note) {
        use paddock_agents::stream_json::{connection_line, status_line};
        let mut line = match note {
            Note::Status(text) => status_line(text),
            Note::Connection(connected, text) => connection_line(*connected, text),
        };
        line.push('\n');
        let _ = self.out.write_all(line.as_bytes()).await;
        let _ = self.out.flush().await;
    }
}

/// What the relay tells the session between the agent's lines.
#[derive(Debug)]
enum Note {
    /// A STATUS note (output lost there).
    Status(String),
    /// The connection dropped (`false`) or is back (`true`).
    Connection(bool, String),
}

/// The connected client, waiting for one while the relay reconnects (`None` once the relay
/// is gone).
async fn connected(
    current: &mut watch::Receiver<Option<RunnerClient<Channel>>>,
) -> Option<RunnerClient<Channel>> {
    loop {
        if let Some(c) = current.borrow_and_update().clone() {
            return Some(c);
        }
        current.changed().await.ok()?;
    }
}

/// Whether a call failed because the connection did (worth sending again on the next one),
/// not because the runner refused it.
fn dropped(e: &tonic::Status) -> bool {
    matches!(
        e.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

/// The relay's stdin, line by line, to the run's; its end closes the run's. A line is sent
/// again on the next connection when the connection dropped under its write.
async fn pump_stdin(run_id: String, mut current: watch::Receiver<Option<RunnerClient<Channel>>>) {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    loop {
        let mut line = Vec::new();
        let close = matches!(stdin.read_until(b'\n', &mut line).await, Ok(0) | Err(_));
        loop {
            let Some(mut c) = connected(&mut current).await else {
                return;
            };
            let req = rpb::WriteStdinRequest {
                run_id: run_id.clone(),
                data: line.clone(),
                close,
            };
            match c.write_stdin(req).await {
                Ok(r) if r.get_ref().ok => break,
                Ok(r) => {
                    // The run ended, or its stdin is closed: nothing will read this any more.
                    tell!("paddock: the agent's stdin: {}", r.get_ref().message);
                    return;
                }
                Err(e) if dropped(&e) => {
                    if current.changed().await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // Refused as it is (too long a line): said, and dropped.
                    tell!("paddock: a line for the agent was refused: {}", e.message());
                    break;
                }
            }
        }
        if close {
            return;
        }
    }
}

/// TERM and INT sent to the relay stop the run there (`StopRun`: TERM, then KILL after the
/// grace, by the runner there even if the relay is gone by then); HUP is passed on.
async fn pump_signals(run_id: String, mut current: watch::Receiver<Option<RunnerClient<Channel>>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    loop {
        let stop = tokio::select! {
            _ = term.recv() => true,
            _ = int.recv() => true,
            _ = hup.recv() => false,
        };
        loop {
            let Some(mut c) = connected(&mut current).await else {
                return;
            };
            let sent = if stop {
                c.stop_run(rpb::StopRunRequest {
                    run_id: run_id.clone(),
                    grace_ms: super::ssh::STOP_GRACE_MS,
                })
                .await
                .map(|_| ())
            } else {
                c.signal_session(rpb::SignalRequest {
                    run_id: run_id.clone(),
                    signal: rpb::ProcessSignal::Hup as i32,
                })
                .await
                .map(|_| ())
            };
            match sent {
                Ok(()) => break,
                Err(e) if dropped(&e) => {
                    if current.changed().await.is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
    }
}

/// Tells the remote runner, every [`ACK_EVERY`], what the relay has copied: it keeps only the
/// rest.
async fn pump_acks(
    run_id: String,
    current: watch::Receiver<Option<RunnerClient<Channel>>>,
    mut copied: watch::Receiver<u64>,
) {
    let mut sent = 0;
    loop {
        tokio::time::sleep(ACK_EVERY).await;
        if copied.has_changed().is_err() {
            return;
        }
        let seq = *copied.borrow_and_update();
        if seq <= sent {
            continue;
        }
        let Some(mut c) = current.borrow().clone() else {
            continue;
        };
        let req = rpb::AckRunRequest {
            run_id: run_id.clone(),
            seq,
        };
        if c.ack_run(req).await.is_ok() {
            sent = seq;
        }
    }
}
