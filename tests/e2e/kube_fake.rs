//! A fake Kubernetes API server for the kubernetes driver's tests: core/v1 Pods only, with the
//! real API's JSON shapes, status codes, `Status` errors, watch streams and exec websockets, on
//! plain HTTP at 127.0.0.1 with a bearer token (a kubeconfig for it is written at start).
//!
//! The "pods" are not containers. A pod is a directory on this machine,
//! `<dir>/pods/<namespace>/<name>/` (its `home/` is HOME), and its containers' processes and
//! every exec are local processes of the test's user:
//!
//! - argv is the container's `command` + `args` (an exec's `command` parameters), never through
//!   a shell; the **image is ignored**, and so a container without `command` runs nothing (there
//!   is no image entrypoint): it counts as running from start to deletion, and its `args` are
//!   ignored;
//! - cwd is the container's `workingDir` when that is an absolute path to an existing
//!   directory, else the pod's home;
//! - the environment is cleared, then `PATH` (the test process's), `HOME=<pod dir>/home`,
//!   `HOSTNAME=<pod name>`, the container's `env` (`value`, and `valueFrom.fieldRef` for
//!   metadata.name / namespace / uid, spec.nodeName / serviceAccountName, status.podIP /
//!   hostIP), and two markers: `PADDOCK_FAKE_KUBE_POD=<pod uid>` and
//!   `PADDOCK_FAKE_KUBE_CONTAINER=<container name>`. Every process of a pod, detached daemons
//!   (setsid) included, is found by scanning `/proc/*/environ` for them; a process that clears
//!   its environment (`env -i`) escapes the fake;
//! - a container's stdout and stderr go to its log file, one per start as the kubelet keeps
//!   them: `<dir>/logs/<namespace>_<name>_<uid>/<container>/<restart>.log` (kept after the pod
//!   is deleted, for a failing test to read; the pod directory itself is removed).
//!
//! Lifecycle: a created pod is `Pending`; ~100 ms later it is "scheduled" (`spec.nodeName`) and
//! its containers start, and it is `Running` (Ready). When a container's process exits, the rest
//! of that container's processes are killed (a container's PID namespace ends with its init),
//! and `restartPolicy` applies: `Never` leaves it terminated (the pod ends `Succeeded` or
//! `Failed` when all are), `OnFailure` / `Always` (the default) restart it after a flat 1 s
//! back-off (a kubelet's starts at 10 s and doubles) with `CrashLoopBackOff` meanwhile and
//! `restartCount` + 1. A deletion marks the pod (`deletionTimestamp`), TERMs its processes,
//! KILLs those left after the grace period — **capped at 2 s** in the fake — and then removes it.
//!
//! Exec (websocket, `v5.channel.k8s.io` preferred, else `v4.channel.k8s.io`): the command runs
//! in a process group of its own; its output goes out as it comes, through bounded queues (a
//! client that does not read slows the process down); the session ends when the process has
//! exited *and* its stdout / stderr are closed — a background child that still holds them keeps
//! the session open, as with a kubelet — then the status goes on channel 3 and a close frame
//! follows. A client that goes away (or closes the websocket) gets the process group killed.
//! Two kube-rs 5 behaviours to know when driving it: dropping `AttachedProcess::stdin()`'s writer
//! does not close stdin (call `shutdown()` on it: only then does kube-rs send v5's `[255, 0]`),
//! and when a connection drops (see [`FakeKube::drop_execs`]) kube-rs ends the status future
//! (`None`) and `join()` (an error) but never ends stdout / stderr for their readers.
//!
//! What a real API server does that the fake does not: any resource but pods (a namespace can
//! be read, not created; service accounts exist only by name); PUT / PATCH / eviction / attach /
//! port-forward / binding; admission beyond namespace and service-account existence; field
//! validation beyond names, containers, images and restartPolicy; images, volumes, probes, init
//! containers, resources, a pod network (podIP is 127.0.0.1); the v1–v3 and base64 exec
//! subprotocols and SPDY (only `v5.channel.k8s.io` and `v4.channel.k8s.io`); a tty (`tty=true`
//! only merges stderr into stdout, there is no terminal and resize is ignored); periodic watch
//! bookmarks; consistent list snapshots across `continue` pages; log `timestamps`,
//! `sinceSeconds` and `sinceTime` (ignored); a watch from a resourceVersion newer than the
//! server's waits for it instead of failing; exponential restart back-off; HTTP/2 and TLS.

// The fake's API is for the kubernetes driver's tests; not every part is used by every build.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::convert::Infallible;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// The environment variable naming a process's pod (its uid).
pub const POD_MARKER: &str = "PADDOCK_FAKE_KUBE_POD";
/// The environment variable naming a process's container.
pub const CONTAINER_MARKER: &str = "PADDOCK_FAKE_KUBE_CONTAINER";
/// Watch events kept for watches that resume from a resourceVersion (older ones get 410 Gone).
const HISTORY: usize = 1000;
/// The longest a deletion waits after TERM before KILL, whatever the grace period asked.
const MAX_GRACE: Duration = Duration::from_secs(2);
/// From create to the containers' start ("scheduling").
const START_DELAY: Duration = Duration::from_millis(100);
/// Before a container that exited is started again.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The node every pod is "scheduled" on.
const NODE: &str = "paddock-fake-node";
/// Largest request body (a real API server's limit is 3 MiB too).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// Largest websocket frame accepted from a client.
const MAX_FRAME: u64 = 64 * 1024 * 1024;

type Body = UnsyncBoxBody<Bytes, Infallible>;
type Key = (String, String);

/// A fake Kubernetes API server on 127.0.0.1, with its own tokio runtime on a thread of its own
/// (usable from plain `#[test]` functions). Dropping it kills every process of every pod it
/// started and stops the server.
pub struct FakeKube {
    shared: Arc<Shared>,
    kubeconfig: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKube {
    /// Starts the server on 127.0.0.1:<free port>, state under `dir`, with the given namespaces
    /// (plus "default") and extra service accounts (plus "default", in every namespace); writes
    /// a kubeconfig file at dir/kubeconfig (cluster server http://127.0.0.1:PORT, a user with
    /// the bearer token, a context "fake" set as current-context, namespace default).
    pub fn start(dir: &Path, namespaces: &[&str], service_accounts: &[&str]) -> FakeKube {
        std::fs::create_dir_all(dir.join("pods")).unwrap();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let dir = dir.canonicalize().unwrap();
        let mut ns: BTreeSet<String> = namespaces.iter().map(|s| s.to_string()).collect();
        ns.insert("default".into());
        let mut sas: BTreeSet<String> = service_accounts.iter().map(|s| s.to_string()).collect();
        sas.insert("default".into());
        let token = hex(&random_bytes(24));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let state_dir = dir.clone();
        let thread = std::thread::Builder::new()
            .name("fake-kube".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fake-kube-rt")
                    .enable_all()
                    .build()
                    .expect("the fake API server's runtime");
                rt.block_on(async move {
                    let listener = bind(0).await.expect("bind 127.0.0.1:0");
                    let port = listener.local_addr().unwrap().port();
                    let shared = Arc::new(Shared {
                        dir: state_dir,
                        token,
                        port,
                        namespaces: ns,
                        service_accounts: sas,
                        started: rfc3339(SystemTime::now()),
                        state: Mutex::new(State::default()),
                        rv_tx: watch::channel(0).0,
                        down_tx: watch::channel(false).0,
                        drop_execs_tx: watch::channel(0).0,
                        execs: AtomicUsize::new(0),
                        v4_only: std::sync::atomic::AtomicBool::new(false),
                    });
                    ready_tx.send(shared.clone()).unwrap();
                    let server = tokio::spawn(serve(shared.clone(), listener));
                    let _ = stop_rx.await;
                    server.abort();
                    // Every process of every pod ever created (deleted ones too, in case
                    // something outlived its deletion), while the runtime still reaps children.
                    let uids = shared.lock().uids.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        kill_and_release(|uid, _| uids.contains(uid));
                    })
                    .await;
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .unwrap();
        let shared = ready_rx.recv().expect("the fake API server started");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    \
                 server: http://127.0.0.1:{}\nusers:\n- name: fake\n  user:\n    token: {}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    \
                 namespace: default\ncurrent-context: fake\npreferences: {{}}\n",
                shared.port, shared.token
            ),
        )
        .unwrap();
        FakeKube {
            shared,
            kubeconfig,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.shared.port)
    }

    /// The kubeconfig written at start (dir/kubeconfig).
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    /// The bearer token the server accepts.
    pub fn token(&self) -> String {
        self.shared.token.clone()
    }

    /// A pod's directory (its "filesystem"; HOME is `home/` in it), whether or not it exists.
    pub fn pod_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.shared.dir.join("pods").join(namespace).join(name)
    }

    /// The stored pods (as JSON), for assertions.
    pub fn pods(&self) -> Vec<Value> {
        self.shared
            .lock()
            .pods
            .values()
            .map(|p| p.object.clone())
            .collect()
    }

    /// Ends every open exec websocket abruptly (a dropped connection), without killing the
    /// processes the pods' runners started with setsid (only the exec'd process group itself
    /// is killed, like a kubelet).
    pub fn drop_execs(&self) {
        self.shared.drop_execs_tx.send_modify(|g| *g += 1);
    }

    /// While true, new connections are refused (the server's listener closed / 503) — an API
    /// server that is down. Requests on connections already open get 503 and the connection
    /// closes; open watches and log follows end. Open exec websockets are left alone (end them
    /// with [`FakeKube::drop_execs`]).
    pub fn set_down(&self, down: bool) {
        self.shared.down_tx.send_replace(down);
        // Returns once the listener is closed (or open again), so that the caller's next
        // connection sees it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", self.shared.port)).is_ok() == down
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills every process of a pod without deleting it (as a node restart would), leaving the
    /// pod object; its containers then restart as their restartPolicy says.
    pub fn kill_pod_processes(&self, namespace: &str, name: &str) {
        let uid = self
            .shared
            .lock()
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| p.uid.clone());
        if let Some(uid) = uid {
            kill_sync(|u, _| u == uid);
        }
    }

    /// Speaks only `v4.channel.k8s.io` for exec (no stdin close), as API servers before 1.30 do.
    pub fn speak_only_v4(&self, yes: bool) {
        self.shared.v4_only.store(yes, Ordering::SeqCst);
    }

    /// How many exec sessions were opened so far (websocket upgrades answered 101).
    pub fn exec_count(&self) -> usize {
        self.shared.execs.load(Ordering::SeqCst)
    }

    /// Forgets the watch history up to now, as etcd's compaction does: a watch from an older
    /// resourceVersion gets a 410 Gone (`Expired`) ERROR event.
    pub fn compact(&self) {
        let mut st = self.shared.lock();
        st.compacted = st.rv;
        st.history.clear();
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The pids of live processes whose pod / container markers satisfy `select(uid, container)`.
pub fn marked_pids(select: impl Fn(&str, Option<&str>) -> bool) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        // A zombie's environ reads empty: it is gone already.
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let mut uid = None;
        let mut container = None;
        for var in env.split(|b| *b == 0) {
            let var = String::from_utf8_lossy(var);
            if let Some(v) = var
                .strip_prefix(POD_MARKER)
                .and_then(|v| v.strip_prefix('='))
            {
                uid = Some(v.to_string());
            } else if let Some(v) = var
                .strip_prefix(CONTAINER_MARKER)
                .and_then(|v| v.strip_prefix('='))
            {
                container = Some(v.to_string());
            }
        }
        if let Some(uid) = uid {
            if select(&uid, container.as_deref()) {
                found.push(pid);
            }
        }
    }
    found
}

/// [`kill_sync`], then removes the control groups of the runners among those processes (a
/// pod's runner keeps its data dir beside its socket, `… runner --socket DIR/runner.sock`):
/// SIGKILLed, they could not remove them themselves, and the machine's cgroup tree would keep
/// an empty group per pod.
fn kill_and_release(select: impl Fn(&str, Option<&str>) -> bool) {
    let dirs = runner_dirs(&select);
    kill_sync(select);
    for dir in dirs {
        paddock::contain::remove_groups(&dir);
    }
}

/// The data dirs of the runners among the marked processes.
fn runner_dirs(select: impl Fn(&str, Option<&str>) -> bool) -> Vec<PathBuf> {
    let mut runner_dirs: Vec<PathBuf> = Vec::new();
    for pid in marked_pids(&select) {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let Some(i) = args.iter().position(|a| a == "--socket") {
            if let Some(dir) = args.get(i + 1).and_then(|s| Path::new(s).parent()) {
                runner_dirs.push(dir.to_path_buf());
            }
        }
    }
    runner_dirs
}

/// SIGKILLs the marked processes until none is left (new ones forked meanwhile included), for
/// up to 3 s.
fn kill_sync(select: impl Fn(&str, Option<&str>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let pids = marked_pids(&select);
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for p in pids {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// State

struct Shared {
    dir: PathBuf,
    token: String,
    port: u16,
    namespaces: BTreeSet<String>,
    service_accounts: BTreeSet<String>,
    /// When the server started (the namespaces' creationTimestamp).
    started: String,
    state: Mutex<State>,
    /// The latest resourceVersion: watches wake up on its changes.
    rv_tx: watch::Sender<u64>,
    down_tx: watch::Sender<bool>,
    /// Bumped by `drop_execs`.
    drop_execs_tx: watch::Sender<u64>,
    execs: AtomicUsize,
    /// Answer exec upgrades with `v4.channel.k8s.io` only (an API server older than 1.30).
    v4_only: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_down(&self) -> bool {
        *self.down_tx.borrow()
    }
}

#[derive(Default)]
struct State {
    /// The global resourceVersion counter.
    rv: u64,
    pods: BTreeMap<Key, PodRt>,
    history: VecDeque<Event>,
    /// Events up to this resourceVersion are forgotten.
    compacted: u64,
    /// Every pod uid ever created.
    uids: HashSet<String>,
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, event: Event) {
        self.history.push_back(event);
        while self.history.len() > HISTORY {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
    }
}

/// One change, as watches see it.
struct Event {
    rv: u64,
    kind: &'static str,
    namespace: String,
    object: Value,
    /// The object before a MODIFIED (selectors may match one and not the other).
    old: Option<Value>,
}

/// Records `event` and wakes the watches (with the state locked, so a watch that read the
/// history under the lock cannot miss the wake-up).
fn publish(sh: &Shared, st: &mut State, event: Event) {
    let rv = event.rv;
    st.record(event);
    sh.rv_tx.send_replace(rv);
}

/// Rebuilds a pod's status from its containers and emits MODIFIED.
fn refresh(sh: &Shared, st: &mut State, key: &Key) {
    if !st.pods.contains_key(key) {
        return;
    }
    let rv = st.next_rv();
    let rt = st.pods.get_mut(key).unwrap();
    let old = rt.object.clone();
    rt.object["status"] = rt.status();
    rt.object["metadata"]["resourceVersion"] = json!(rv.to_string());
    let object = rt.object.clone();
    publish(
        sh,
        st,
        Event {
            rv,
            kind: "MODIFIED",
            namespace: key.0.clone(),
            object,
            old: Some(old),
        },
    );
}

/// A pod: its object as stored and what runs it.
struct PodRt {
    uid: String,
    object: Value,
    dir: PathBuf,
    logs: PathBuf,
    /// Scheduled and its containers started.
    started: bool,
    start_time: Option<String>,
    deleting: bool,
    containers: Vec<ContainerRt>,
}

struct ContainerRt {
    name: String,
    image: String,
    spec: Value,
    /// How many times it was started (its current log is `instances - 1`).
    instances: u32,
    state: CState,
    last: Option<CState>,
}

#[derive(Clone)]
enum CState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: Option<String>,
        started_at: String,
        finished_at: String,
        instance: u32,
    },
}

impl CState {
    fn to_json(&self, container_id: &str) -> Value {
        match self {
            CState::Waiting { reason, message } => {
                let mut w = json!({ "reason": reason });
                if let Some(m) = message {
                    w["message"] = json!(m);
                }
                json!({ "waiting": w })
            }
            CState::Running { started_at } => json!({ "running": { "startedAt": started_at } }),
            CState::Terminated {
                exit_code,
                reason,
                message,
                started_at,
                finished_at,
                ..
            } => {
                let mut t = json!({
                    "exitCode": exit_code,
                    "reason": reason,
                    "startedAt": started_at,
                    "finishedAt": finished_at,
                    "containerID": container_id,
                });
                if let Some(m) = message {
                    t["message"] = json!(m);
                }
                json!({ "terminated": t })
            }
        }
    }

    fn is_running(&self) -> bool {
        matches!(self, CState::Running { .. })
    }
}

impl PodRt {
    fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    fn restart_policy(&self) -> String {
        self.object["spec"]["restartPolicy"]
            .as_str()
            .unwrap_or("Always")
            .to_string()
    }

    fn phase(&self) -> &'static str {
        if !self.started {
            return "Pending";
        }
        let mut all_terminated = true;
        let mut all_zero = true;
        for c in &self.containers {
            match &c.state {
                CState::Terminated { exit_code, .. } => all_zero &= *exit_code == 0,
                _ => all_terminated = false,
            }
        }
        match (all_terminated, all_zero) {
            (true, true) => "Succeeded",
            (true, false) => "Failed",
            _ => "Running",
        }
    }

    fn container_id(&self, c: &ContainerRt) -> String {
        format!(
            "fake://{}/{}/{}",
            self.uid,
            c.name,
            c.instances.saturating_sub(1)
        )
    }

    fn status(&self) -> Value {
        if !self.started {
            return json!({ "phase": "Pending", "qosClass": "BestEffort" });
        }
        let phase = self.phase();
        let since = self.start_time.clone().unwrap_or_default();
        let unready: Vec<&str> = self
            .containers
            .iter()
            .filter(|c| !c.state.is_running())
            .map(|c| c.name.as_str())
            .collect();
        let cond = |ty: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
            let mut c = json!({
                "type": ty,
                "status": if ok { "True" } else { "False" },
                "lastProbeTime": null,
                "lastTransitionTime": since,
            });
            if let Some(r) = reason {
                c["reason"] = json!(r);
            }
            if let Some(m) = message {
                c["message"] = json!(m);
            }
            c
        };
        let terminal = phase == "Succeeded" || phase == "Failed";
        let (ready, reason, message) = if terminal {
            (false, Some("PodCompleted"), None)
        } else if unready.is_empty() {
            (true, None, None)
        } else {
            (
                false,
                Some("ContainersNotReady"),
                Some(format!(
                    "containers with unready status: [{}]",
                    unready.join(" ")
                )),
            )
        };
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|c| {
                let id = self.container_id(c);
                let last = match &c.last {
                    Some(CState::Terminated { instance, .. }) => c
                        .last
                        .as_ref()
                        .unwrap()
                        .to_json(&format!("fake://{}/{}/{}", self.uid, c.name, instance)),
                    _ => json!({}),
                };
                json!({
                    "name": c.name,
                    "state": c.state.to_json(&id),
                    "lastState": last,
                    "ready": c.state.is_running() && !terminal,
                    "restartCount": c.instances.saturating_sub(1),
                    "image": c.image,
                    "imageID": "",
                    "containerID": id,
                    "started": c.state.is_running(),
                })
            })
            .collect();
        json!({
            "phase": phase,
            "conditions": [
                cond("PodReadyToStartContainers", !terminal, None, None),
                cond("Initialized", true, None, None),
                cond("Ready", ready, reason, message.clone()),
                cond("ContainersReady", ready, reason, message),
                cond("PodScheduled", true, None, None),
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{ "ip": "127.0.0.1" }],
            "podIP": "127.0.0.1",
            "podIPs": [{ "ip": "127.0.0.1" }],
            "startTime": since,
            "containerStatuses": statuses,
            "qosClass": "BestEffort",
        })
    }

    /// A process of container `idx` running `argv` (stdio not set).
    fn command(&self, idx: usize, argv: &[String]) -> tokio::process::Command {
        let c = &self.containers[idx];
        let home = self.dir.join("home");
        let cwd = c.spec["workingDir"]
            .as_str()
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_dir())
            .unwrap_or_else(|| home.clone());
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("HOSTNAME", self.name());
        for e in c.spec["env"].as_array().into_iter().flatten() {
            let Some(name) = e["name"].as_str() else {
                continue;
            };
            let value = match (
                e["value"].as_str(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Some(v), _) => v.to_string(),
                (None, Some(path)) => field_value(&self.object, path),
                (None, None) => String::new(),
            };
            cmd.env(name, value);
        }
        cmd.env(POD_MARKER, &self.uid)
            .env(CONTAINER_MARKER, &c.name)
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: prctl is async-signal-safe; it only sets this process's parent-death signal
        // (the process dies with the test if the test dies without dropping the fake).
        unsafe {
            cmd.pre_exec(|| {
                let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
                Ok(())
            });
        }
        cmd
    }

    /// Starts container `idx` once more (its next log file), with the pod's state locked.
    fn spawn_instance(&mut self, idx: usize) -> Result<(tokio::process::Child, String), String> {
        let c = &mut self.containers[idx];
        c.instances += 1;
        let instance = c.instances - 1;
        let log_dir = self.logs.join(&c.name);
        let argv: Vec<String> = string_list(&c.spec["command"])
            .into_iter()
            .chain(string_list(&c.spec["args"]))
            .collect();
        let log = std::fs::create_dir_all(&log_dir)
            .and_then(|_| std::fs::File::create(log_dir.join(format!("{instance}.log"))))
            .map_err(|e| format!("failed to create the container's log: {e}"))?;
        let mut cmd = self.command(idx, &argv);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        match cmd.spawn() {
            Ok(child) => {
                let at = rfc3339(SystemTime::now());
                self.containers[idx].state = CState::Running {
                    started_at: at.clone(),
                };
                Ok((child, at))
            }
            Err(e) => Err(start_error(&argv[0], &e)),
        }
    }
}

/// The message a container runtime gives for a process that could not start.
fn start_error(argv0: &str, e: &std::io::Error) -> String {
    let why = if e.kind() == std::io::ErrorKind::NotFound {
        format!("exec: \"{argv0}\": executable file not found in $PATH")
    } else {
        format!("exec: \"{argv0}\": {e}")
    };
    format!(
        "failed to create containerd task: failed to create shim task: OCI runtime create \
         failed: runc create failed: unable to start container process: {why}: unknown"
    )
}

fn string_list(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// A pod field as a fieldRef or a field selector reads it ("" when absent).
fn field_value(pod: &Value, path: &str) -> String {
    let mut v = pod;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)),
        Err(_) => 128 + 9,
    }
}

// ---------------------------------------------------------------------------------------------
// Pod runtime

/// Schedules and starts a created pod's containers, after START_DELAY.
async fn start_pod(sh: Arc<Shared>, key: Key, uid: String) {
    tokio::time::sleep(START_DELAY).await;
    let mut supervised = Vec::new();
    {
        let mut st = sh.lock();
        let Some(rt) = st
            .pods
            .get_mut(&key)
            .filter(|p| p.uid == uid && !p.deleting)
        else {
            return;
        };
        let _ = std::fs::create_dir_all(rt.dir.join("home"));
        rt.started = true;
        rt.start_time = Some(rfc3339(SystemTime::now()));
        rt.object["spec"]["nodeName"] = json!(NODE);
        for idx in 0..rt.containers.len() {
            if rt.containers[idx].spec["command"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                let name = rt.containers[idx].name.clone();
                supervised.push((idx, name, rt.spawn_instance(idx)));
            } else {
                // Nothing to run: the container is "running" until the pod is deleted.
                let c = &mut rt.containers[idx];
                c.instances = 1;
                let log_dir = rt.logs.join(&c.name);
                let _ = std::fs::create_dir_all(&log_dir);
                let _ = std::fs::File::create(log_dir.join("0.log"));
                c.state = CState::Running {
                    started_at: rt.start_time.clone().unwrap(),
                };
            }
        }
        refresh(&sh, &mut st, &key);
    }
    for (idx, name, first) in supervised {
        tokio::spawn(supervise(
            sh.clone(),
            key.clone(),
            uid.clone(),
            idx,
            name,
            first,
        ));
    }
}

/// Waits for a container's process, records its end, and restarts it as restartPolicy says.
async fn supervise(
    sh: Arc<Shared>,
    key: Key,
    uid: String,
    idx: usize,
    name: String,
    mut current: Result<(tokio::process::Child, String), String>,
) {
    loop {
        let (code, reason, message, started_at) = match current {
            Ok((mut child, started)) => {
                let code = exit_code(child.wait().await);
                let reason = if code == 0 { "Completed" } else { "Error" };
                (code, reason, None, started)
            }
            Err(m) => (128, "StartError", Some(m), rfc3339(SystemTime::now())),
        };
        // The rest of the container's processes end with it, as with its PID namespace's init.
        let (u, n) = (uid.clone(), name.clone());
        let _ = tokio::task::spawn_blocking(move || {
            kill_sync(|pu, pc| pu == u && pc == Some(n.as_str()))
        })
        .await;
        let restart = {
            let mut st = sh.lock();
            let Some(rt) = st.pods.get_mut(&key).filter(|p| p.uid == uid) else {
                return;
            };
            let policy = rt.restart_policy();
            let restart = !rt.deleting
                && match policy.as_str() {
                    "Never" => false,
                    "OnFailure" => code != 0,
                    _ => true,
                };
            let pod_name = rt.name().to_string();
            let c = &mut rt.containers[idx];
            let term = CState::Terminated {
                exit_code: code,
                reason: reason.to_string(),
                message,
                started_at,
                finished_at: rfc3339(SystemTime::now()),
                instance: c.instances.saturating_sub(1),
            };
            if restart {
                c.last = Some(term);
                c.state = CState::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some(format!(
                        "back-off {}s restarting failed container={} pod={}_{}({})",
                        RESTART_BACKOFF.as_secs(),
                        c.name,
                        pod_name,
                        key.0,
                        uid
                    )),
                };
            } else {
                c.state = term;
            }
            refresh(&sh, &mut st, &key);
            restart
        };
        if !restart {
            return;
        }
        tokio::time::sleep(RESTART_BACKOFF).await;
        let mut st = sh.lock();
        let Some(rt) = st
            .pods
            .get_mut(&key)
            .filter(|p| p.uid == uid && !p.deleting)
        else {
            return;
        };
        current = rt.spawn_instance(idx);
        refresh(&sh, &mut st, &key);
    }
}

/// A deletion's second half: TERM, the grace period (at most MAX_GRACE), KILL, removal.
async fn terminate(sh: Arc<Shared>, key: Key, uid: String, grace: u64) {
    let wait = Duration::from_secs(grace).min(MAX_GRACE);
    // Found before the TERM: a runner that ends on it may leave its groups behind.
    let runners = runner_dirs(|u, _| u == uid);
    for p in marked_pids(|u, _| u == uid) {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline && !marked_pids(|u, _| u == uid).is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let u = uid.clone();
    let _ = tokio::task::spawn_blocking(move || {
        kill_sync(|pu, _| pu == u);
        for dir in runners {
            paddock::contain::remove_groups(&dir);
        }
    })
    .await;
    let dir = {
        let mut st = sh.lock();
        if st.pods.get(&key).is_none_or(|p| p.uid != uid) {
            return;
        }
        let rv = st.next_rv();
        let mut rt = st.pods.remove(&key).unwrap();
        let now = rfc3339(SystemTime::now());
        for c in &mut rt.containers {
            if !matches!(c.state, CState::Terminated { .. }) {
                let has_command = c.spec["command"].as_array().is_some_and(|a| !a.is_empty());
                c.state = CState::Terminated {
                    exit_code: if has_command { 137 } else { 0 },
                    reason: if has_command { "Error" } else { "Completed" }.into(),
                    message: None,
                    started_at: rt.start_time.clone().unwrap_or_else(|| now.clone()),
                    finished_at: now.clone(),
                    instance: c.instances.saturating_sub(1),
                };
            }
        }
        if rt.started {
            rt.object["status"] = rt.status();
        }
        rt.object["metadata"]["resourceVersion"] = json!(rv.to_string());
        publish(
            &sh,
            &mut st,
            Event {
                rv,
                kind: "DELETED",
                namespace: key.0.clone(),
                object: rt.object,
                old: None,
            },
        );
        rt.dir
    };
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

// ---------------------------------------------------------------------------------------------
// HTTP server

async fn bind(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    // The same port again after `set_down(false)`, past the closed connections' TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(([127, 0, 0, 1], port).into())?;
    socket.listen(1024)
}

/// Accepts connections; closes the listener while down and opens it again on the same port.
async fn serve(sh: Arc<Shared>, first: tokio::net::TcpListener) {
    let mut down_rx = sh.down_tx.subscribe();
    let mut listener = Some(first);
    loop {
        match listener.take() {
            Some(l) => {
                tokio::select! {
                    r = l.accept() => {
                        if let Ok((stream, _)) = r {
                            let sh = sh.clone();
                            tokio::spawn(async move {
                                let service = hyper::service::service_fn(move |req| {
                                    let sh = sh.clone();
                                    async move { Ok::<_, Infallible>(route(sh, req).await) }
                                });
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .with_upgrades()
                                    .await;
                            });
                        }
                        listener = Some(l);
                    }
                    _ = down_rx.changed() => {
                        if !*down_rx.borrow_and_update() {
                            listener = Some(l);
                        }
                    }
                }
            }
            None => {
                if down_rx.wait_for(|d| !*d).await.is_err() {
                    return;
                }
                for _ in 0..250 {
                    match bind(sh.port).await {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                if listener.is_none() {
                    eprintln!("fake kube: could not listen on port {} again", sh.port);
                    return;
                }
            }
        }
    }
}

async fn route(sh: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segs: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|s| percent_decode(s, false))
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let method = req.method().clone();
    if sh.is_down() {
        let mut r = status_response(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            None,
        );
        r.headers_mut()
            .insert(header::CONNECTION, "close".parse().unwrap());
        return r;
    }
    // The paths a real API server shows anonymous users (system:public-info-viewer).
    match segs.as_slice() {
        ["version"] if method == Method::GET => return version(),
        ["healthz"] | ["livez"] | ["readyz"] if method == Method::GET => {
            return respond(200, "text/plain; charset=utf-8", "ok")
        }
        _ => {}
    }
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {}", sh.token));
    if !authorized {
        return status_response(401, "Unauthorized", "Unauthorized", None);
    }
    let query = parse_query(req.uri().query());
    let get = method == Method::GET;
    match segs.as_slice() {
        ["api", "v1", "pods"] if get => list_or_watch(sh, None, &query).await,
        ["api", "v1", "namespaces", ns] if get => namespace(&sh, ns),
        ["api", "v1", "namespaces", ns, "pods"] if get => {
            list_or_watch(sh, Some(ns.to_string()), &query).await
        }
        ["api", "v1", "namespaces", ns, "pods"] if method == Method::POST => {
            let ns = ns.to_string();
            match read_body(req).await {
                Ok(body) => create(sh, &ns, &query, &body),
                Err(r) => r,
            }
        }
        ["api", "v1", "namespaces", ns, "pods", name] if get => get_pod(&sh, ns, name),
        ["api", "v1", "namespaces", ns, "pods", name] if method == Method::DELETE => {
            let (ns, name) = (ns.to_string(), name.to_string());
            match read_body(req).await {
                Ok(body) => delete(sh, &ns, &name, &query, &body),
                Err(r) => r,
            }
        }
        ["api", "v1", "namespaces", ns, "pods", name, "log"] if get => {
            logs(sh, ns, name, &query).await
        }
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] if get || method == Method::POST => {
            let (ns, name) = (ns.to_string(), name.to_string());
            exec(sh, &ns, &name, &query, req)
        }
        ["api", "v1", "pods"]
        | ["api", "v1", "namespaces", _]
        | ["api", "v1", "namespaces", _, "pods"]
        | ["api", "v1", "namespaces", _, "pods", _]
        | ["api", "v1", "namespaces", _, "pods", _, "log" | "exec"] => status_response(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(json!({})),
        ),
        _ => status_response(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        ),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Response<Body>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(status_response(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
            None,
        )),
        Err(e) => Err(status_response(
            400,
            "BadRequest",
            format!("reading the request body: {e}"),
            None,
        )),
    }
}

fn respond(code: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
    h.insert(header::CACHE_CONTROL, "no-cache, private".parse().unwrap());
    h.insert("audit-id", uuid().parse().unwrap());
    r
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    respond(code, "application/json", serde_json::to_vec(v).unwrap())
}

/// A streaming response whose body is what `rx` yields (chunked).
fn stream_response(content_type: &str, rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let body =
        StreamBody::new(ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b))));
    let mut r = Response::new(BodyExt::boxed_unsync(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
    h.insert(header::CACHE_CONTROL, "no-cache, private".parse().unwrap());
    h.insert("audit-id", uuid().parse().unwrap());
    r
}

/// A metav1.Status failure.
fn failure(code: u16, reason: &str, message: impl Into<String>, details: Option<Value>) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s
}

fn status_response(
    code: u16,
    reason: &str,
    message: impl Into<String>,
    details: Option<Value>,
) -> Response<Body> {
    json_response(code, &failure(code, reason, message, details))
}

fn pod_not_found(name: &str) -> Response<Body> {
    status_response(
        404,
        "NotFound",
        format!("pods \"{name}\" not found"),
        Some(json!({ "name": name, "kind": "pods" })),
    )
}

fn bad_request(message: impl Into<String>) -> Response<Body> {
    status_response(400, "BadRequest", message, None)
}

fn version() -> Response<Body> {
    json_response(
        200,
        &json!({
            "major": "1",
            "minor": "34",
            "gitVersion": "v1.34.0-paddock-fake",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }),
    )
}

fn namespace(sh: &Shared, ns: &str) -> Response<Body> {
    if !sh.namespaces.contains(ns) {
        return status_response(
            404,
            "NotFound",
            format!("namespaces \"{ns}\" not found"),
            Some(json!({ "name": ns, "kind": "namespaces" })),
        );
    }
    json_response(
        200,
        &json!({
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": ns,
                "uid": uuid_from(ns),
                "resourceVersion": "1",
                "creationTimestamp": sh.started,
                "labels": { "kubernetes.io/metadata.name": ns },
            },
            "spec": { "finalizers": ["kubernetes"] },
            "status": { "phase": "Active" },
        }),
    )
}

fn get_pod(sh: &Shared, ns: &str, name: &str) -> Response<Body> {
    match sh.lock().pods.get(&(ns.to_string(), name.to_string())) {
        Some(p) => json_response(200, &p.object),
        None => pod_not_found(name),
    }
}

// ---------------------------------------------------------------------------------------------
// Create

fn create(sh: Arc<Shared>, ns: &str, query: &[(String, String)], body: &[u8]) -> Response<Body> {
    let mut pod: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad_request("couldn't get version/kind; json parse error: not an object"),
        Err(e) => return bad_request(format!("couldn't get version/kind; json parse error: {e}")),
    };
    match pod["kind"].as_str() {
        Some("Pod") => {}
        None => {
            return bad_request(format!(
                "Object 'Kind' is missing in '{}'",
                String::from_utf8_lossy(body)
            ))
        }
        Some(k) => {
            return bad_request(format!(
                "the server could not handle a {k} posted to the pods resource"
            ))
        }
    }
    if let Some(v) = pod["apiVersion"].as_str().filter(|v| *v != "v1") {
        return bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version (v1)"
        ));
    }
    if !pod["metadata"].is_object() {
        pod["metadata"] = json!({});
    }
    if pod["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| !n.is_empty() && n != ns)
    {
        return bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    // Admission: the namespace, then the service account.
    if !sh.namespaces.contains(ns) {
        return status_response(
            404,
            "NotFound",
            format!("namespaces \"{ns}\" not found"),
            Some(json!({ "name": ns, "kind": "namespaces" })),
        );
    }
    let name = match pod["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => match pod["metadata"]["generateName"].as_str() {
            Some(prefix) if !prefix.is_empty() => {
                const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
                let suffix: String = random_bytes(5)
                    .iter()
                    .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
                    .collect();
                format!("{prefix}{suffix}")
            }
            _ => String::new(),
        },
    };
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .or(pod["spec"]["serviceAccount"].as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    if !sh.service_accounts.contains(&sa) {
        return status_response(
            403,
            "Forbidden",
            format!(
                "pods \"{name}\" is forbidden: error looking up service account {ns}/{sa}: \
                 serviceaccount \"{sa}\" not found"
            ),
            Some(json!({ "name": name, "kind": "pods" })),
        );
    }
    if let Err(r) = validate(&pod, &name) {
        return *r;
    }
    defaults(&mut pod, &sa);

    let uid = uuid();
    let md = &mut pod["metadata"];
    md["name"] = json!(name);
    md["namespace"] = json!(ns);
    md["uid"] = json!(uid);
    md["creationTimestamp"] = json!(rfc3339(SystemTime::now()));
    if let Some(m) = md.as_object_mut() {
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "generation",
        ] {
            m.remove(server_owned);
        }
    }
    pod["apiVersion"] = json!("v1");
    pod["status"] = json!({ "phase": "Pending", "qosClass": "BestEffort" });

    if query_get(query, "dryRun").is_some() {
        pod["metadata"]["resourceVersion"] = json!(sh.lock().rv.to_string());
        return json_response(201, &pod);
    }
    let key = (ns.to_string(), name.clone());
    let mut st = sh.lock();
    if st.pods.contains_key(&key) {
        return status_response(
            409,
            "AlreadyExists",
            format!("pods \"{name}\" already exists"),
            Some(json!({ "name": name, "kind": "pods" })),
        );
    }
    let rv = st.next_rv();
    pod["metadata"]["resourceVersion"] = json!(rv.to_string());
    let containers = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ContainerRt {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            image: c["image"].as_str().unwrap_or_default().to_string(),
            spec: c.clone(),
            instances: 0,
            state: CState::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            last: None,
        })
        .collect();
    st.pods.insert(
        key.clone(),
        PodRt {
            uid: uid.clone(),
            object: pod.clone(),
            dir: sh.dir.join("pods").join(ns).join(&name),
            logs: sh.dir.join("logs").join(format!("{ns}_{name}_{uid}")),
            started: false,
            start_time: None,
            deleting: false,
            containers,
        },
    );
    st.uids.insert(uid.clone());
    publish(
        &sh,
        &mut st,
        Event {
            rv,
            kind: "ADDED",
            namespace: ns.to_string(),
            object: pod.clone(),
            old: None,
        },
    );
    drop(st);
    tokio::spawn(start_pod(sh.clone(), key, uid));
    json_response(201, &pod)
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
    alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
    (e.g. 'example.com', regex used for validation is \
    '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
    characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  \
    or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The API server's validation, for the fields the fake uses: 422 Invalid with its causes.
fn validate(pod: &Value, name: &str) -> Result<(), Box<Response<Body>>> {
    let mut causes: Vec<(&str, String, String)> = Vec::new(); // (reason, field, message)
    if name.is_empty() {
        causes.push((
            "FieldValueRequired",
            "metadata.name".into(),
            "Required value: name or generateName is required".into(),
        ));
    } else if !is_dns_subdomain(name) {
        causes.push((
            "FieldValueInvalid",
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": {SUBDOMAIN_MSG}"),
        ));
    }
    let containers = pod["spec"]["containers"].as_array();
    match containers {
        None => causes.push((
            "FieldValueRequired",
            "spec.containers".into(),
            "Required value".into(),
        )),
        Some(cs) if cs.is_empty() => causes.push((
            "FieldValueRequired",
            "spec.containers".into(),
            "Required value".into(),
        )),
        Some(cs) => {
            let mut seen = HashSet::new();
            for (i, c) in cs.iter().enumerate() {
                let cname = c["name"].as_str().unwrap_or_default();
                let field = format!("spec.containers[{i}].name");
                if cname.is_empty() {
                    causes.push(("FieldValueRequired", field, "Required value".into()));
                } else if !is_dns_label(cname) {
                    causes.push((
                        "FieldValueInvalid",
                        field,
                        format!("Invalid value: \"{cname}\": {LABEL_MSG}"),
                    ));
                } else if !seen.insert(cname) {
                    causes.push((
                        "FieldValueDuplicate",
                        field,
                        format!("Duplicate value: \"{cname}\""),
                    ));
                }
                if c["image"].as_str().unwrap_or_default().is_empty() {
                    causes.push((
                        "FieldValueRequired",
                        format!("spec.containers[{i}].image"),
                        "Required value".into(),
                    ));
                }
            }
        }
    }
    if let Some(p) = pod["spec"]["restartPolicy"].as_str() {
        if !["Always", "OnFailure", "Never"].contains(&p) {
            causes.push((
                "FieldValueNotSupported",
                "spec.restartPolicy".into(),
                format!(
                    "Unsupported value: \"{p}\": supported values: \"Always\", \"OnFailure\", \"Never\""
                ),
            ));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = causes.iter().map(|(_, f, m)| format!("{f}: {m}")).collect();
    let list = if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    };
    let causes: Vec<Value> = causes
        .iter()
        .map(|(r, f, m)| json!({ "reason": r, "message": m, "field": f }))
        .collect();
    Err(Box::new(status_response(
        422,
        "Invalid",
        format!("Pod \"{name}\" is invalid: {list}"),
        Some(json!({ "name": name, "kind": "Pod", "causes": causes })),
    )))
}

/// The defaults the API server fills in (and the service account admission's field).
fn defaults(pod: &mut Value, sa: &str) {
    let spec = &mut pod["spec"];
    let mut default = |k: &str, v: Value| {
        if spec[k].is_null() {
            spec[k] = v;
        }
    };
    default("restartPolicy", json!("Always"));
    default("terminationGracePeriodSeconds", json!(30));
    default("dnsPolicy", json!("ClusterFirst"));
    default("securityContext", json!({}));
    default("schedulerName", json!("default-scheduler"));
    default("enableServiceLinks", json!(true));
    default("priority", json!(0));
    default("preemptionPolicy", json!("PreemptLowerPriority"));
    spec["serviceAccountName"] = json!(sa);
    spec["serviceAccount"] = json!(sa);
    for c in spec["containers"].as_array_mut().into_iter().flatten() {
        if c["terminationMessagePath"].is_null() {
            c["terminationMessagePath"] = json!("/dev/termination-log");
        }
        if c["terminationMessagePolicy"].is_null() {
            c["terminationMessagePolicy"] = json!("File");
        }
        if c["resources"].is_null() {
            c["resources"] = json!({});
        }
        if c["imagePullPolicy"].is_null() {
            let image = c["image"].as_str().unwrap_or_default();
            let last = image.rsplit('/').next().unwrap_or_default();
            let tagged = image.contains('@') || (last.contains(':') && !last.ends_with(":latest"));
            c["imagePullPolicy"] = json!(if tagged { "IfNotPresent" } else { "Always" });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Delete

fn delete(
    sh: Arc<Shared>,
    ns: &str,
    name: &str,
    query: &[(String, String)],
    body: &[u8],
) -> Response<Body> {
    let opts: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("invalid DeleteOptions: {e}")),
        }
    };
    let requested = opts["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| query_get(query, "gracePeriodSeconds").and_then(|g| g.parse().ok()));
    let key = (ns.to_string(), name.to_string());
    let mut st = sh.lock();
    let Some(rt) = st.pods.get(&key) else {
        return pod_not_found(name);
    };
    let conflict = |what: &str, pre: &str, actual: &str| {
        status_response(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on pods \"{name}\": Precondition failed: \
                 {what} in precondition: {pre}, {what} in object meta: {actual}"
            ),
            Some(json!({ "name": name, "kind": "pods" })),
        )
    };
    if let Some(pre) = opts["preconditions"]["uid"].as_str() {
        if pre != rt.uid {
            return conflict("UID", pre, &rt.uid);
        }
    }
    if let Some(pre) = opts["preconditions"]["resourceVersion"].as_str() {
        let actual = rt.object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if pre != actual {
            return conflict("ResourceVersion", pre, &actual);
        }
    }
    if rt.deleting {
        return json_response(200, &rt.object);
    }
    let grace = requested
        .or(rt.object["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0) as u64;
    let rv = st.next_rv();
    let rt = st.pods.get_mut(&key).unwrap();
    let old = rt.object.clone();
    rt.deleting = true;
    let md = &mut rt.object["metadata"];
    md["deletionTimestamp"] = json!(rfc3339(SystemTime::now() + Duration::from_secs(grace)));
    md["deletionGracePeriodSeconds"] = json!(grace);
    md["resourceVersion"] = json!(rv.to_string());
    let object = rt.object.clone();
    let uid = rt.uid.clone();
    publish(
        &sh,
        &mut st,
        Event {
            rv,
            kind: "MODIFIED",
            namespace: ns.to_string(),
            object: object.clone(),
            old: Some(old),
        },
    );
    drop(st);
    tokio::spawn(terminate(sh.clone(), key, uid, grace));
    json_response(200, &object)
}

// ---------------------------------------------------------------------------------------------
// List and watch

/// A label selector and a field selector, as the API server parses them.
#[derive(Default)]
struct Selector {
    labels: Vec<LabelReq>,
    fields: Vec<(String, bool, String)>,
}

enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// The field selectors pods support.
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

impl Selector {
    fn parse(query: &[(String, String)]) -> Result<Selector, String> {
        let mut sel = Selector::default();
        if let Some(l) = query_get(query, "labelSelector") {
            for term in split_top_level(l) {
                let term = term.trim();
                if term.is_empty() {
                    continue;
                }
                let bad = || format!("unable to parse requirement: found '{term}'");
                let key_ok = |k: &str| !k.is_empty() && !k.contains(char::is_whitespace);
                let req = if let Some(k) = term.strip_prefix('!') {
                    LabelReq::NotExists(k.trim().to_string())
                } else if let (Some(open), Some(close)) = (term.find('('), term.rfind(')')) {
                    let head = term[..open].trim();
                    let values: Vec<String> = term[open + 1..close]
                        .split(',')
                        .map(|v| v.trim().to_string())
                        .filter(|v| !v.is_empty())
                        .collect();
                    match head.rsplit_once(char::is_whitespace) {
                        Some((k, "in")) => LabelReq::In(k.trim().to_string(), values),
                        Some((k, "notin")) => LabelReq::NotIn(k.trim().to_string(), values),
                        _ => return Err(bad()),
                    }
                } else if let Some((k, v)) = term.split_once("!=") {
                    LabelReq::Ne(k.trim().to_string(), v.trim().to_string())
                } else if let Some((k, v)) = term.split_once("==") {
                    LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
                } else if let Some((k, v)) = term.split_once('=') {
                    LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
                } else {
                    LabelReq::Exists(term.to_string())
                };
                let key = match &req {
                    LabelReq::Eq(k, _)
                    | LabelReq::Ne(k, _)
                    | LabelReq::In(k, _)
                    | LabelReq::NotIn(k, _)
                    | LabelReq::Exists(k)
                    | LabelReq::NotExists(k) => k,
                };
                if !key_ok(key) {
                    return Err(bad());
                }
                sel.labels.push(req);
            }
        }
        if let Some(f) = query_get(query, "fieldSelector") {
            for term in f.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                let (field, eq, value) = if let Some((k, v)) = term.split_once("!=") {
                    (k, false, v)
                } else if let Some((k, v)) = term.split_once("==") {
                    (k, true, v)
                } else if let Some((k, v)) = term.split_once('=') {
                    (k, true, v)
                } else {
                    return Err(format!(
                        "invalid selector: '{f}'; can't understand '{term}'"
                    ));
                };
                let field = field.trim();
                if !POD_FIELDS.contains(&field) {
                    return Err(format!("field label not supported: {field}"));
                }
                sel.fields
                    .push((field.to_string(), eq, value.trim().to_string()));
            }
        }
        Ok(sel)
    }

    fn matches(&self, pod: &Value) -> bool {
        let labels = &pod["metadata"]["labels"];
        let label = |k: &str| labels[k].as_str();
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self
                .fields
                .iter()
                .all(|(f, eq, v)| (field_value(pod, f) == *v) == *eq)
    }
}

/// Splits at the commas outside parentheses (`a in (x,y),b`).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, ch) in s.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

async fn list_or_watch(
    sh: Arc<Shared>,
    ns: Option<String>,
    query: &[(String, String)],
) -> Response<Body> {
    let sel = match Selector::parse(query) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    if query_get(query, "watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(sh, ns, sel, query);
    }
    let st = sh.lock();
    let mut items: Vec<(&Key, &PodRt)> = st
        .pods
        .iter()
        .filter(|(k, p)| ns.as_ref().is_none_or(|n| *n == k.0) && sel.matches(&p.object))
        .collect();
    if let Some(token) = query_get(query, "continue").filter(|t| !t.is_empty()) {
        let Some(after) = String::from_utf8(unhex(token)).ok().and_then(|s| {
            s.split_once('/')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        }) else {
            return bad_request(format!("continue key is not valid: {token}"));
        };
        items.retain(|(k, _)| **k > after);
    }
    let mut metadata = json!({ "resourceVersion": st.rv.to_string() });
    if let Some(limit) = query_get(query, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
    {
        if items.len() > limit {
            let last = items[limit - 1].0;
            metadata["continue"] = json!(hex(format!("{}/{}", last.0, last.1).as_bytes()));
            metadata["remainingItemCount"] = json!(items.len() - limit);
            items.truncate(limit);
        }
    }
    let items: Vec<Value> = items
        .into_iter()
        .map(|(_, p)| {
            // List items carry no kind / apiVersion, as a real server's.
            let mut o = p.object.clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    json_response(
        200,
        &json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": items,
        }),
    )
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

fn expired(from: u64, oldest: u64) -> Bytes {
    watch_line(
        "ERROR",
        &failure(
            410,
            "Expired",
            format!("too old resource version: {from} ({oldest})"),
            None,
        ),
    )
}

fn watch(
    sh: Arc<Shared>,
    ns: Option<String>,
    sel: Selector,
    query: &[(String, String)],
) -> Response<Body> {
    let initial = query_get(query, "sendInitialEvents").is_some_and(|v| v == "true");
    let bookmarks = query_get(query, "allowWatchBookmarks").is_some_and(|v| v == "true");
    let from = match query_get(query, "resourceVersion").unwrap_or("") {
        "" | "0" => None,
        rv => match rv.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return bad_request(format!(
                    "resourceVersion: Invalid value: \"{rv}\": strconv.ParseUint: parsing \
                     \"{rv}\": invalid syntax"
                ))
            }
        },
    };
    let timeout = query_get(query, "timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut rv_rx = sh.rv_tx.subscribe();
        let mut down_rx = sh.down_tx.subscribe();
        let mut last = from.unwrap_or(0);
        let mut first = true;
        loop {
            let mut lines = Vec::new();
            let mut end = false;
            {
                let st = sh.lock();
                rv_rx.borrow_and_update();
                if first && (from.is_none() || initial) {
                    for (k, p) in &st.pods {
                        if ns.as_ref().is_none_or(|n| *n == k.0) && sel.matches(&p.object) {
                            lines.push(watch_line("ADDED", &p.object));
                        }
                    }
                    last = last.max(st.rv);
                    if initial && bookmarks {
                        lines.push(watch_line(
                            "BOOKMARK",
                            &json!({
                                "kind": "Pod",
                                "apiVersion": "v1",
                                "metadata": {
                                    "resourceVersion": st.rv.to_string(),
                                    "annotations": { "k8s.io/initial-events-end": "true" },
                                },
                            }),
                        ));
                    }
                } else if last < st.compacted {
                    lines.push(expired(last, st.compacted + 1));
                    end = true;
                } else {
                    for e in st.history.iter().filter(|e| e.rv > last) {
                        if ns.as_ref().is_some_and(|n| *n != e.namespace) {
                            continue;
                        }
                        let now = sel.matches(&e.object);
                        let before = e.old.as_ref().map(|o| sel.matches(o));
                        let kind = match (e.kind, before, now) {
                            ("MODIFIED", Some(false), true) => "ADDED",
                            ("MODIFIED", Some(true), false) => "DELETED",
                            (k, _, true) => k,
                            _ => continue,
                        };
                        lines.push(watch_line(kind, &e.object));
                    }
                    last = last.max(st.rv);
                }
                first = false;
            }
            for line in lines {
                tokio::select! {
                    r = tx.send(line) => if r.is_err() { return },
                    _ = &mut deadline => return,
                    _ = down_rx.wait_for(|d| *d) => return,
                }
            }
            if end {
                return;
            }
            tokio::select! {
                r = rv_rx.changed() => if r.is_err() { return },
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                _ = down_rx.wait_for(|d| *d) => return,
            }
        }
    });
    stream_response("application/json", rx)
}

// ---------------------------------------------------------------------------------------------
// Logs

/// The container a log or exec request names (or the only one), or the API server's refusal.
fn pick_container(
    rt: &PodRt,
    name: &str,
    query: &[(String, String)],
) -> Result<usize, Box<Response<Body>>> {
    match query_get(query, "container").filter(|c| !c.is_empty()) {
        Some(c) => rt
            .containers
            .iter()
            .position(|x| x.name == c)
            .ok_or_else(|| {
                Box::new(bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }),
        None if rt.containers.len() == 1 => Ok(0),
        None => {
            let names: Vec<&str> = rt.containers.iter().map(|c| c.name.as_str()).collect();
            Err(Box::new(bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                names.join(" ")
            ))))
        }
    }
}

async fn logs(sh: Arc<Shared>, ns: &str, name: &str, query: &[(String, String)]) -> Response<Body> {
    let key = (ns.to_string(), name.to_string());
    let previous = query_get(query, "previous").is_some_and(|v| v == "true");
    let (path, uid, idx, instance) = {
        let st = sh.lock();
        let Some(rt) = st.pods.get(&key) else {
            return pod_not_found(name);
        };
        let idx = match pick_container(rt, name, query) {
            Ok(i) => i,
            Err(r) => return *r,
        };
        let c = &rt.containers[idx];
        if c.instances == 0 {
            return bad_request(format!(
                "container \"{}\" in pod \"{name}\" is waiting to start: ContainerCreating",
                c.name
            ));
        }
        let instance = if previous {
            if c.instances < 2 {
                return bad_request(format!(
                    "previous terminated container \"{}\" in pod \"{name}\" not found",
                    c.name
                ));
            }
            c.instances - 2
        } else {
            c.instances - 1
        };
        (
            rt.logs.join(&c.name).join(format!("{instance}.log")),
            rt.uid.clone(),
            idx,
            instance,
        )
    };
    let content = tokio::fs::read(&path).await.unwrap_or_default();
    let mut offset = content.len() as u64;
    let mut out = match query_get(query, "tailLines").and_then(|t| t.parse::<usize>().ok()) {
        Some(n) => tail_lines(&content, n).to_vec(),
        None => content,
    };
    let mut limit = query_get(query, "limitBytes").and_then(|l| l.parse::<usize>().ok());
    if let Some(l) = limit {
        out.truncate(l);
        limit = Some(l - out.len());
    }
    let follow = query_get(query, "follow").is_some_and(|v| v == "true");
    if !follow || previous {
        return respond(200, "text/plain", out);
    }
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut down_rx = sh.down_tx.subscribe();
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
        loop {
            // Whether this instance still runs, read before the file so that nothing it wrote
            // before it ended is missed.
            let running = {
                let st = sh.lock();
                st.pods.get(&key).is_some_and(|p| {
                    p.uid == uid
                        && p.containers[idx].instances - 1 == instance
                        && p.containers[idx].state.is_running()
                })
            };
            let mut chunk = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&path) {
                use std::io::Seek;
                if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
                    let _ = f.take(256 * 1024).read_to_end(&mut chunk);
                }
            }
            offset += chunk.len() as u64;
            if let Some(l) = limit.as_mut() {
                chunk.truncate(*l);
                *l -= chunk.len();
            }
            let more = !chunk.is_empty();
            if more && tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
            if limit == Some(0) || (!running && !more) {
                return;
            }
            if !more {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = tx.closed() => return,
                    _ = down_rx.wait_for(|d| *d) => return,
                }
            }
        }
    });
    stream_response("text/plain", rx)
}

/// The last `n` lines of `content` (a final line without a newline counts).
fn tail_lines(content: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = content.strip_suffix(b"\n").unwrap_or(content);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &content[i + 1..];
            }
        }
    }
    content
}

// ---------------------------------------------------------------------------------------------
// Exec

const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

fn exec(
    sh: Arc<Shared>,
    ns: &str,
    name: &str,
    query: &[(String, String)],
    mut req: Request<Incoming>,
) -> Response<Body> {
    let key = (ns.to_string(), name.to_string());
    let (uid, idx) = {
        let st = sh.lock();
        let Some(rt) = st.pods.get(&key) else {
            return pod_not_found(name);
        };
        let idx = match pick_container(rt, name, query) {
            Ok(i) => i,
            Err(r) => return *r,
        };
        let phase = rt.phase();
        if phase == "Succeeded" || phase == "Failed" {
            return bad_request(format!(
                "cannot exec into a container in a completed pod; current phase is {phase}"
            ));
        }
        if !rt.started {
            return bad_request(format!("pod {name} does not have a host assigned"));
        }
        if !rt.containers[idx].state.is_running() {
            return status_response(
                404,
                "NotFound",
                format!(
                    "unable to upgrade connection: container not found (\"{}\")",
                    rt.containers[idx].name
                ),
                None,
            );
        }
        (rt.uid.clone(), idx)
    };
    let argv = query_all(query, "command");
    if argv.is_empty() {
        return bad_request("you must specify at least 1 command");
    }
    let flag = |k: &str| query_get(query, k).is_some_and(|v| v == "true" || v == "1");
    let (stdin, stdout, stderr, tty) = (flag("stdin"), flag("stdout"), flag("stderr"), flag("tty"));
    if !stdin && !stdout && !stderr {
        return bad_request("you must specify at least 1 of stdin, stdout, stderr");
    }
    let headers = req.headers();
    let has_token = |h: header::HeaderName, token: &str| {
        headers.get_all(h).iter().any(|v| {
            v.to_str()
                .unwrap_or_default()
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    };
    let Some(ws_key) = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|k| k.to_str().ok())
        .map(String::from)
        .filter(|_| {
            has_token(header::UPGRADE, "websocket") && has_token(header::CONNECTION, "upgrade")
        })
    else {
        return bad_request("Upgrade request required");
    };
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| {
            v.to_str()
                .unwrap_or_default()
                .split(',')
                .map(|p| p.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let protocol = if offered.iter().any(|p| p == V5) && !sh.v4_only.load(Ordering::SeqCst) {
        V5
    } else if offered.iter().any(|p| p == V4) {
        V4
    } else {
        return bad_request(format!(
            "unable to upgrade connection: none of the offered websocket subprotocols {offered:?} \
             is supported (this fake speaks {V5} and {V4})"
        ));
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    sh.execs.fetch_add(1, Ordering::SeqCst);
    let session = ExecSession {
        key,
        uid,
        idx,
        argv,
        stdin,
        stdout,
        stderr,
        tty,
        v5: protocol == V5,
    };
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            session.run(sh, TokioIo::new(upgraded)).await;
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, "websocket".parse().unwrap());
    h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        tokio_tungstenite::tungstenite::handshake::derive_accept_key(ws_key.as_bytes())
            .parse()
            .unwrap(),
    );
    h.insert(header::SEC_WEBSOCKET_PROTOCOL, protocol.parse().unwrap());
    r
}

struct ExecSession {
    key: Key,
    uid: String,
    idx: usize,
    argv: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    v5: bool,
}

/// Channels of the remotecommand protocol (the first byte of every binary frame).
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
/// v5: `[255, channel]` closes that channel.
const CLOSE: u8 = 255;

impl ExecSession {
    async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(self, sh: Arc<Shared>, io: S) {
        let (mut rd, mut wr) = tokio::io::split(io);
        let mut drop_rx = sh.drop_execs_tx.subscribe();
        let spawned = {
            let st = sh.lock();
            match st.pods.get(&self.key) {
                Some(rt) if rt.uid == self.uid && rt.containers[self.idx].state.is_running() => {
                    let mut cmd = rt.command(self.idx, &self.argv);
                    let pipe = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
                    cmd.stdin(pipe(self.stdin))
                        .stdout(pipe(self.stdout))
                        .stderr(pipe(self.stderr || (self.tty && self.stdout)));
                    cmd.spawn().map_err(|e| {
                        let cause = format!(
                            "failed to exec in container: failed to start exec \"{}\": OCI \
                             runtime exec failed: exec failed: unable to start container \
                             process: {}: unknown",
                            hex(&random_bytes(32)),
                            match e.kind() {
                                std::io::ErrorKind::NotFound => format!(
                                    "exec: \"{}\": executable file not found in $PATH",
                                    self.argv[0]
                                ),
                                _ => format!("exec: \"{}\": {e}", self.argv[0]),
                            }
                        );
                        failure(
                            500,
                            "InternalError",
                            format!(
                                "Internal error occurred: error executing command in container: \
                                 {cause}"
                            ),
                            Some(json!({ "causes": [{ "message": cause }] })),
                        )
                    })
                }
                _ => Err(failure(
                    500,
                    "InternalError",
                    format!(
                        "Internal error occurred: error executing command in container: container \
                         not found (\"{}\")",
                        self.argv[0]
                    ),
                    None,
                )),
            }
        };
        let mut child = match spawned {
            Ok(c) => c,
            Err(status) => {
                let mut frame = vec![ERROR];
                frame.extend(serde_json::to_vec(&status).unwrap());
                let _ = wr.write_all(&ws_frame(OP_BINARY, &frame)).await;
                let _ = wr
                    .write_all(&ws_frame(OP_CLOSE, &1000u16.to_be_bytes()))
                    .await;
                // Read what the client still sends until it closes (closing with unread data
                // would reset the connection, and the client could lose the status).
                let mut sink = tokio::io::sink();
                let drain = tokio::io::copy(&mut rd, &mut sink);
                let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                return;
            }
        };
        let pgid = child.id().map(|p| Pid::from_raw(p as i32));
        let kill_group = || {
            if let Some(g) = pgid {
                let _ = killpg(g, Signal::SIGKILL);
            }
        };

        // Output: one bounded queue of frames (a slow client slows the process down).
        let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(8);
        if let Some(o) = child.stdout.take() {
            tokio::spawn(pump(o, STDOUT, out_tx.clone()));
        }
        if let Some(e) = child.stderr.take() {
            let channel = if self.tty { STDOUT } else { STDERR };
            tokio::spawn(pump(e, channel, out_tx.clone()));
        }
        drop(out_tx);
        let (ctl_tx, ctl_rx) = mpsc::channel::<Vec<u8>>(8);
        // The first frame tells the client the streams are up: an empty frame on the lowest
        // channel it reads (as the kubelet does).
        let hello = if self.stdout {
            STDOUT
        } else if self.stderr {
            STDERR
        } else {
            ERROR
        };
        let mut writer = tokio::spawn(write_frames(wr, hello, out_rx, ctl_rx));
        let (gone_tx, mut gone_rx) = watch::channel(false);
        let reader = tokio::spawn(read_frames(
            rd,
            child.stdin.take(),
            ctl_tx,
            self.v5,
            gone_tx,
        ));

        enum End {
            Exited(i32),
            ClientGone,
            Dropped,
        }
        let end = tokio::select! {
            s = child.wait() => End::Exited(exit_code(s)),
            _ = gone_rx.wait_for(|g| *g) => End::ClientGone,
            _ = drop_rx.changed() => End::Dropped,
        };
        match end {
            End::Exited(code) => {
                // Everything the process wrote is sent before its status.
                let drained = tokio::select! {
                    w = &mut writer => w.ok().and_then(Result::ok),
                    _ = gone_rx.wait_for(|g| *g) => None,
                    _ = drop_rx.changed() => None,
                };
                match drained {
                    Some(mut wr) => {
                        let mut frame = vec![ERROR];
                        frame.extend(serde_json::to_vec(&self.exit_status(code)).unwrap());
                        let sent = async {
                            wr.write_all(&ws_frame(OP_BINARY, &frame)).await?;
                            wr.write_all(&ws_frame(OP_CLOSE, &1000u16.to_be_bytes()))
                                .await?;
                            wr.flush().await
                        };
                        if sent.await.is_ok() {
                            // Let the client read it all and close its side first.
                            tokio::select! {
                                _ = gone_rx.wait_for(|g| *g) => {}
                                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                                _ = drop_rx.changed() => {}
                            }
                        }
                    }
                    None => kill_group(),
                }
            }
            End::ClientGone | End::Dropped => {
                kill_group();
                let _ = child.wait().await;
            }
        }
        writer.abort();
        reader.abort();
    }

    /// The Status the kubelet writes on the error channel when the process ends.
    fn exit_status(&self, code: i32) -> Value {
        if code == 0 {
            return json!({ "metadata": {}, "status": "Success" });
        }
        json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                self.argv.join(" ")
            ),
            "reason": "NonZeroExitCode",
            "details": { "causes": [{ "reason": "ExitCode", "message": code.to_string() }] },
        })
    }
}

/// Reads a process's output into frames on `channel`.
async fn pump<R: AsyncRead + Unpin>(mut r: R, channel: u8, tx: mpsc::Sender<Vec<u8>>) {
    loop {
        let mut buf = vec![0u8; 32 * 1024 + 1];
        buf[0] = channel;
        match r.read(&mut buf[1..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf.truncate(n + 1);
                if tx.send(buf).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes the output frames (and control frames) until every output stream has ended; hands
/// the writer back for the status.
async fn write_frames<W: AsyncWrite + Unpin>(
    mut wr: W,
    hello: u8,
    mut out: mpsc::Receiver<Vec<u8>>,
    mut ctl: mpsc::Receiver<Vec<u8>>,
) -> std::io::Result<W> {
    wr.write_all(&ws_frame(OP_BINARY, &[hello])).await?;
    let mut ctl_open = true;
    loop {
        tokio::select! {
            biased;
            c = ctl.recv(), if ctl_open => match c {
                Some(frame) => wr.write_all(&frame).await?,
                None => ctl_open = false,
            },
            m = out.recv() => match m {
                Some(payload) => wr.write_all(&ws_frame(OP_BINARY, &payload)).await?,
                None => break,
            },
        }
    }
    wr.flush().await?;
    Ok(wr)
}

/// Reads the client's frames: stdin data, v5 stdin close, pings, close. Sets `gone` when the
/// client closes or goes away.
async fn read_frames<R: AsyncRead + Unpin>(
    rd: R,
    mut stdin: Option<tokio::process::ChildStdin>,
    ctl: mpsc::Sender<Vec<u8>>,
    v5: bool,
    gone: watch::Sender<bool>,
) {
    let mut rd = tokio::io::BufReader::with_capacity(64 * 1024, rd);
    // The channel of the (possibly fragmented) data message being read.
    let mut channel: Option<u8> = None;
    while let Ok(frame) = read_frame(&mut rd).await {
        match frame.opcode {
            OP_CONTINUATION | OP_TEXT | OP_BINARY => {
                if frame.opcode != OP_CONTINUATION {
                    channel = None;
                }
                let mut data = &frame.payload[..];
                if channel.is_none() && !data.is_empty() {
                    channel = Some(data[0]);
                    data = &data[1..];
                }
                match channel {
                    Some(STDIN) if !data.is_empty() => {
                        if let Some(s) = stdin.as_mut() {
                            if s.write_all(data).await.is_err() {
                                stdin = None;
                            }
                        }
                    }
                    Some(CLOSE) if v5 && data.first() == Some(&STDIN) => stdin = None,
                    _ => {} // resize (4) and the rest: ignored
                }
                if frame.fin {
                    channel = None;
                }
            }
            OP_PING => {
                let _ = ctl.try_send(ws_frame(OP_PONG, &frame.payload));
            }
            OP_PONG => {}
            OP_CLOSE => {
                let _ = ctl.try_send(ws_frame(OP_CLOSE, &1000u16.to_be_bytes()));
                break;
            }
            _ => break,
        }
    }
    drop(stdin);
    gone.send_replace(true);
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// A server's websocket frame (final, unmasked).
fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 10);
    f.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => f.push(n as u8),
        n if n <= 0xffff => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

struct WsFrame {
    fin: bool,
    opcode: u8,
    payload: Vec<u8>,
}

/// One client frame, unmasked.
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> std::io::Result<WsFrame> {
    let mut h = [0u8; 2];
    rd.read_exact(&mut h).await?;
    let len = match h[1] & 0x7f {
        126 => u64::from(rd.read_u16().await?),
        127 => rd.read_u64().await?,
        n => u64::from(n),
    };
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "websocket frame too large",
        ));
    }
    let mut mask = None;
    if h[1] & 0x80 != 0 {
        let mut m = [0u8; 4];
        rd.read_exact(&mut m).await?;
        mask = Some(m);
    }
    let mut payload = vec![0u8; len as usize];
    rd.read_exact(&mut payload).await?;
    if let Some(m) = mask {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= m[i & 3];
        }
    }
    Ok(WsFrame {
        fin: h[0] & 0x80 != 0,
        opcode: h[0] & 0x0f,
        payload,
    })
}

// ---------------------------------------------------------------------------------------------
// Utilities

fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

fn query_get<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn query_all(q: &[(String, String)], key: &str) -> Vec<String> {
    q.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let hexval = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("/dev/urandom");
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| {
            s.get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect()
}

fn format_uuid(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random (version 4) UUID.
fn uuid() -> String {
    format_uuid(random_bytes(16).try_into().unwrap())
}

/// A stable UUID-shaped id for `name`.
fn uuid_from(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut b = [0u8; 16];
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i, name).hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_be_bytes());
    }
    format_uuid(b)
}

/// RFC 3339 in UTC to the second, as metav1.Time serializes.
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------------
// The fake against kube-rs itself (and, for the v4 subprotocol, a bare websocket client).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams, WatchEvent, WatchParams,
};

/// A tempdir, a fake in it, and a runtime for the client (dropped in that order: runtime,
/// fake, tempdir).
fn setup(
    namespaces: &[&str],
    service_accounts: &[&str],
) -> (tempfile::TempDir, FakeKube, tokio::runtime::Runtime) {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeKube::start(tmp.path(), namespaces, service_accounts);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    (tmp, fake, rt)
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn pod_with(name: &str, command: &[&str], extra: Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "paddock", "pod": name } },
        "spec": { "containers": [{ "name": "main", "image": "busybox:1.36", "command": command }] },
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn pod(name: &str, command: &[&str]) -> Pod {
    pod_with(name, command, json!({}))
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Watches `name` (from "0": its current state first) until `done` says so.
async fn wait_for(api: &Api<Pod>, name: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(10);
    let stream = api.watch(&wp, "0").await.unwrap();
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            WatchEvent::Added(p) | WatchEvent::Modified(p) if done(&p) => return p,
            WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            e => panic!("{name}: {e:?}"),
        }
    }
    panic!("{name}: the watch ended first");
}

async fn running(api: &Api<Pod>, name: &str) -> Pod {
    wait_for(api, name, |p| phase(p) == "Running").await
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        e => panic!("not an API error: {e:?}"),
    }
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// The pod's live processes' command lines.
fn pod_processes(uid: &str) -> Vec<String> {
    marked_pids(|u, _| u == uid)
        .into_iter()
        .map(cmdline)
        .filter(|c| !c.is_empty())
        .collect()
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Runs `command` in the pod, feeding `input` to its stdin; its stdout, stderr and status.
async fn exec_all(
    api: &Api<Pod>,
    name: &str,
    command: &[&str],
    input: &[u8],
) -> (
    Vec<u8>,
    Vec<u8>,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Status,
) {
    let ap = AttachParams::default()
        .stdin(true)
        .stdout(true)
        .stderr(true);
    let mut p = api.exec(name, command.to_vec(), &ap).await.unwrap();
    let mut stdin = p.stdin().unwrap();
    let mut stdout = p.stdout().unwrap();
    let mut stderr = p.stderr().unwrap();
    let status = p.take_status().unwrap();
    let input = input.to_vec();
    let feed = async move {
        stdin.write_all(&input).await.unwrap();
        // Closes stdin: with v5 kube-rs then sends [255, 0]. (Dropping the writer does not:
        // kube-rs 5's stdin is one half of a tokio simplex, which only ends on shutdown.)
        stdin.shutdown().await.unwrap();
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (_, o, e) = tokio::join!(
        feed,
        stdout.read_to_end(&mut out),
        stderr.read_to_end(&mut err)
    );
    o.unwrap();
    e.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), status)
        .await
        .expect("the exec's status")
        .expect("a status");
    (out, err, status)
}

#[test]
fn kube_fake_pod_lifecycle() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let client = client_from(&fake.kubeconfig()).await;
        let api: Api<Pod> = Api::namespaced(client.clone(), "default");
        let created = api
            .create(
                &PostParams::default(),
                &pod(
                    "web",
                    &[
                        "sh",
                        "-c",
                        "echo one; echo two; echo three; exec sleep 1000",
                    ],
                ),
            )
            .await
            .unwrap();
        assert_eq!(phase(&created), "Pending");
        assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
        assert!(created.metadata.creation_timestamp.is_some());
        let rv: u64 = created
            .metadata
            .resource_version
            .clone()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rv > 0);
        let spec = created.spec.as_ref().unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.service_account_name.as_deref(), Some("default"));
        let id = uid(&created);

        let up = running(&api, "web").await;
        let status = up.status.clone().unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
        assert!(status.start_time.is_some());
        let cs = &status.container_statuses.unwrap()[0];
        assert!(cs.ready && cs.started == Some(true) && cs.restart_count == 0);
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert!(status
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"));
        assert_eq!(up.spec.unwrap().node_name.as_deref(), Some(NODE));

        let got = api.get("web").await.unwrap();
        assert_eq!(uid(&got), id);
        assert_eq!(fake.pods().len(), 1);
        assert!(fake.pod_dir("default", "web").join("home").is_dir());

        api.create(&PostParams::default(), &pod("other", &["sleep", "1000"]))
            .await
            .unwrap();
        let names = |l: kube::api::ObjectList<Pod>| -> Vec<String> {
            l.items
                .into_iter()
                .map(|p| p.metadata.name.unwrap())
                .collect()
        };
        for (selector, expected) in [
            ("pod=web", vec!["web"]),
            ("pod==web", vec!["web"]),
            ("app=paddock", vec!["other", "web"]),
            ("app=paddock,pod!=web", vec!["other"]),
            ("pod in (web,nothing)", vec!["web"]),
            ("pod notin (web)", vec!["other"]),
            ("app", vec!["other", "web"]),
            ("!app", vec![]),
            ("missing", vec![]),
        ] {
            let l = api
                .list(&ListParams::default().labels(selector))
                .await
                .unwrap();
            assert_eq!(names(l), expected, "{selector}");
        }
        let all: Api<Pod> = Api::all(client.clone());
        let l = all
            .list(&ListParams::default().fields("metadata.name=web"))
            .await
            .unwrap();
        assert_eq!(names(l), ["web"]);
        let page = api.list(&ListParams::default().limit(1)).await.unwrap();
        assert_eq!(page.items.len(), 1);
        let token = page.metadata.continue_.clone().unwrap();
        let rest = api
            .list(&ListParams::default().limit(1).continue_token(&token))
            .await
            .unwrap();
        assert_eq!(names(rest), ["web"]);

        // Logs: everything, then the last two lines.
        let mut log = String::new();
        for _ in 0..100 {
            log = api.logs("web", &LogParams::default()).await.unwrap();
            if log.ends_with("three\n") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(log, "one\ntwo\nthree\n");
        let tail = LogParams {
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(api.logs("web", &tail).await.unwrap(), "two\nthree\n");

        assert!(!pod_processes(&id).is_empty());
        let t = Instant::now();
        let deleting = api
            .delete("web", &DeleteParams::default())
            .await
            .unwrap()
            .left()
            .expect("the pod, being deleted");
        assert!(deleting.metadata.deletion_timestamp.is_some());
        assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
        // MODIFIED (deletionTimestamp) was at the delete's resourceVersion; DELETED follows.
        let wp = WatchParams::default()
            .fields("metadata.name=web")
            .timeout(10);
        let from = deleting.metadata.resource_version.clone().unwrap();
        let stream = api.watch(&wp, &from).await.unwrap();
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.next().await.expect("DELETED").unwrap() {
                WatchEvent::Deleted(p) => {
                    assert_eq!(uid(&p), id);
                    break;
                }
                WatchEvent::Modified(_) => {}
                e => panic!("{e:?}"),
            }
        }
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        let gone = api_status(api.get("web").await.unwrap_err());
        assert_eq!(gone.code, 404);
        assert_eq!(gone.reason, "NotFound");
        assert_eq!(gone.message, "pods \"web\" not found");
        assert!(pod_processes(&id).is_empty());
        until("the pod's directory is removed", || {
            !fake.pod_dir("default", "web").exists()
        })
        .await;
        let del404 = api_status(
            api.delete("web", &DeleteParams::default())
                .await
                .unwrap_err(),
        );
        assert_eq!(del404.code, 404);

        api.delete("other", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        until("other is deleted", || fake.pods().is_empty()).await;
    });
}

#[test]
fn kube_fake_exec() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        let p = api
            .create(&PostParams::default(), &pod("box", &["sleep", "1000"]))
            .await
            .unwrap();
        let id = uid(&p);
        running(&api, "box").await;

        let (out, err, status) = exec_all(
            &api,
            "box",
            &["sh", "-c", "cat; echo done; exit 3"],
            b"hello\n",
        )
        .await;
        assert_eq!(String::from_utf8_lossy(&out), "hello\ndone\n");
        assert!(err.is_empty());
        assert_eq!(status.status.as_deref(), Some("Failure"));
        assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "command terminated with non-zero exit code: error executing command \
                 [sh -c cat; echo done; exit 3], exit code 3"
            )
        );
        let cause = &status.details.unwrap().causes.unwrap()[0];
        assert_eq!(cause.reason.as_deref(), Some("ExitCode"));
        assert_eq!(cause.message.as_deref(), Some("3"));

        // The process's environment and directory, and stderr.
        let (out, err, status) = exec_all(
            &api,
            "box",
            &[
                "sh",
                "-c",
                "echo $HOME; pwd; echo $PADDOCK_FAKE_KUBE_POD; echo oops >&2",
            ],
            b"",
        )
        .await;
        let home = fake.pod_dir("default", "box").join("home");
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!("{0}\n{0}\n{id}\n", home.display())
        );
        assert_eq!(err, b"oops\n");
        assert_eq!(status.status.as_deref(), Some("Success"));

        // A program that does not exist: the upgrade succeeds, the status says why.
        let (_, _, status) = exec_all(&api, "box", &["no-such-program"], b"").await;
        assert_eq!(status.reason.as_deref(), Some("InternalError"));
        assert!(
            status
                .message
                .as_deref()
                .unwrap()
                .contains("\"no-such-program\": executable file not found in $PATH"),
            "{status:?}"
        );
        assert_eq!(fake.exec_count(), 3);

        // Refused before the upgrade.
        let e = api_status(
            api.exec("ghost", ["true"], &AttachParams::default())
                .await
                .err()
                .unwrap(),
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "pods \"ghost\" not found")
        );
        let e = api_status(
            api.exec("box", ["true"], &AttachParams::default().container("nope"))
                .await
                .err()
                .unwrap(),
        );
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (400, "BadRequest", "container nope is not valid for pod box")
        );
        assert_eq!(fake.exec_count(), 3);
    });
}

#[test]
fn kube_fake_exec_binary_20mib() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        api.create(&PostParams::default(), &pod("box", &["sleep", "1000"]))
            .await
            .unwrap();
        running(&api, "box").await;
        // Every byte value, in an order that repeats nowhere (xorshift).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let data: Vec<u8> = (0..20 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let t = Instant::now();
        let ap = AttachParams::default()
            .stdin(true)
            .stderr(false)
            .max_stdin_buf_size(1 << 20)
            .max_stdout_buf_size(1 << 20);
        let mut p = api.exec("box", ["cat"], &ap).await.unwrap();
        let mut stdin = p.stdin().unwrap();
        let mut stdout = p.stdout().unwrap();
        let status = p.take_status().unwrap();
        let input = data.clone();
        let feed = tokio::spawn(async move {
            stdin.write_all(&input).await.unwrap();
            stdin.shutdown().await.unwrap();
        });
        let mut out = Vec::with_capacity(data.len());
        stdout.read_to_end(&mut out).await.unwrap();
        feed.await.unwrap();
        assert_eq!(out.len(), data.len());
        assert!(out == data, "the bytes differ");
        let status = status.await.unwrap();
        assert_eq!(status.status.as_deref(), Some("Success"));
        eprintln!("20 MiB through cat in {:?}", t.elapsed());
    });
}

#[test]
fn kube_fake_errors() {
    let (tmp, fake, rt) = setup(&["team"], &["builder"]);
    rt.block_on(async {
        let client = client_from(&fake.kubeconfig()).await;
        let default: Api<Pod> = Api::namespaced(client.clone(), "default");
        let team: Api<Pod> = Api::namespaced(client.clone(), "team");
        let nope: Api<Pod> = Api::namespaced(client.clone(), "nope");
        let pp = PostParams::default();

        let e = api_status(nope.create(&pp, &pod("a", &["true"])).await.unwrap_err());
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (404, "NotFound", "namespaces \"nope\" not found")
        );
        let d = e.details.unwrap();
        assert_eq!((d.name.as_str(), d.kind.as_str()), ("nope", "namespaces"));

        let wrong = tmp.path().join("wrong-kubeconfig");
        std::fs::write(
            &wrong,
            std::fs::read_to_string(fake.kubeconfig())
                .unwrap()
                .replace(&fake.token(), "not-the-token"),
        )
        .unwrap();
        let intruder: Api<Pod> = Api::namespaced(client_from(&wrong).await, "default");
        let e = api_status(intruder.list(&ListParams::default()).await.unwrap_err());
        assert_eq!((e.code, e.reason.as_str()), (401, "Unauthorized"));

        let ghost_sa = json!({ "spec": { "serviceAccountName": "ghost" } });
        let e = api_status(
            team.create(&pp, &pod_with("a", &["true"], ghost_sa))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (
                403,
                "Forbidden",
                "pods \"a\" is forbidden: error looking up service account team/ghost: \
                 serviceaccount \"ghost\" not found"
            )
        );
        let builder = json!({ "spec": { "serviceAccountName": "builder" } });
        let made = team
            .create(&pp, &pod_with("a", &["sleep", "1000"], builder))
            .await
            .unwrap();
        assert_eq!(
            made.spec.unwrap().service_account_name.as_deref(),
            Some("builder")
        );

        let e = api_status(team.create(&pp, &pod("a", &["true"])).await.unwrap_err());
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (409, "AlreadyExists", "pods \"a\" already exists")
        );

        let mut empty = pod("empty", &[]);
        empty.spec.as_mut().unwrap().containers.clear();
        let e = api_status(default.create(&pp, &empty).await.unwrap_err());
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (
                422,
                "Invalid",
                "Pod \"empty\" is invalid: spec.containers: Required value"
            )
        );
        let causes = e.details.unwrap().causes;
        assert_eq!(causes[0].field, "spec.containers");

        let e = api_status(default.get("ghost").await.unwrap_err());
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "pods \"ghost\" not found")
        );
        assert_eq!(e.details.unwrap().kind, "pods");

        let e = api_status(
            default
                .list(&ListParams::default().fields("spec.nothing=x"))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "field label not supported: spec.nothing")
        );

        // Two containers: logs must name one.
        let two = pod_with(
            "two",
            &["sleep", "1000"],
            json!({ "spec": { "containers": [
                { "name": "a", "image": "busybox", "command": ["sh", "-c", "echo from-a; exec sleep 1000"] },
                { "name": "b", "image": "busybox" },
            ] } }),
        );
        default.create(&pp, &two).await.unwrap();
        running(&default, "two").await;
        let e = api_status(default.logs("two", &LogParams::default()).await.unwrap_err());
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "a container name must be specified for pod two, choose one of: [a b]"
            )
        );
        let lp = LogParams {
            container: Some("a".into()),
            ..Default::default()
        };
        let mut log = String::new();
        for _ in 0..100 {
            log = default.logs("two", &lp).await.unwrap();
            if !log.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(log, "from-a\n");

        // A path the fake does not serve.
        let req = hyper::Request::get("/apis/apps/v1/namespaces/default/deployments")
            .body(Vec::new())
            .unwrap();
        let e = api_status(client.request_text(req).await.unwrap_err());
        assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    });
}

#[test]
fn kube_fake_drop_execs() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    let id = rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        let id = uid(&api
            .create(&PostParams::default(), &pod("box", &["sleep", "1000"]))
            .await
            .unwrap());
        running(&api, "box").await;
        let ap = AttachParams::default().stderr(false);
        let mut p = api
            .exec(
                "box",
                [
                    "sh",
                    "-c",
                    "setsid sh -c 'exec sleep 1001' </dev/null >/dev/null 2>&1 & \
                     echo ready; exec sleep 1002",
                ],
                &ap,
            )
            .await
            .unwrap();
        let mut stdout = p.stdout().unwrap();
        let status = p.take_status().unwrap();
        let mut line = [0u8; 6];
        stdout.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"ready\n");
        let has = |what: &str| pod_processes(&id).iter().any(|c| c == what);
        until("the daemon and the exec'd sleep run", || {
            has("sleep 1001") && has("sleep 1002")
        })
        .await;

        fake.drop_execs();
        let status = tokio::time::timeout(Duration::from_secs(3), status)
            .await
            .expect("the exec ends");
        assert!(
            status.is_none(),
            "no status from a dropped connection: {status:?}"
        );
        // kube-rs 5 does not end stdout when the connection drops (its message loop returns
        // on the error without shutting the stdout pipe down): a client learns of the end from
        // the status future or join(), which fails.
        let joined = tokio::time::timeout(Duration::from_secs(3), p.join())
            .await
            .expect("join returns");
        assert!(joined.is_err(), "{joined:?}");
        drop(stdout);
        // The exec'd process group is killed; the setsid'd daemon and the container live on.
        until("the exec'd process is gone", || !has("sleep 1002")).await;
        assert!(has("sleep 1001") && has("sleep 1000"));
        assert_eq!(fake.exec_count(), 1);

        // A new exec works.
        let (out, _, status) = exec_all(&api, "box", &["echo", "again"], b"").await;
        assert_eq!(out, b"again\n");
        assert_eq!(status.status.as_deref(), Some("Success"));
        id
    });
    drop(rt);
    drop(fake);
    assert!(pod_processes(&id).is_empty(), "{:?}", pod_processes(&id));
}

#[test]
fn kube_fake_delete_kills_pod_processes() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        let id = uid(&api
            .create(&PostParams::default(), &pod("box", &["sleep", "1000"]))
            .await
            .unwrap());
        running(&api, "box").await;
        // A detached daemon (its own session; output elsewhere, or the exec would wait for it
        // as a kubelet's does).
        let (out, _, status) = exec_all(
            &api,
            "box",
            &[
                "sh",
                "-c",
                "setsid sh -c 'sleep 1000; echo never' </dev/null >/dev/null 2>&1 & echo started",
            ],
            b"",
        )
        .await;
        assert_eq!(out, b"started\n");
        assert_eq!(status.status.as_deref(), Some("Success"));
        until("the daemon runs", || pod_processes(&id).len() >= 3).await;

        let t = Instant::now();
        api.delete("box", &DeleteParams::default()).await.unwrap();
        until("the pod is gone", || fake.pods().is_empty()).await;
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(pod_processes(&id).is_empty(), "{:?}", pod_processes(&id));
        assert_eq!(api_status(api.get("box").await.unwrap_err()).code, 404);
    });
}

#[test]
fn kube_fake_restarts_logs_and_outage() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        let pp = PostParams::default();
        let never = json!({ "spec": { "restartPolicy": "Never" } });

        // Follow a log until the container ends.
        api.create(
            &pp,
            &pod_with(
                "count",
                &["sh", "-c", "echo a; sleep 0.3; echo b"],
                never.clone(),
            ),
        )
        .await
        .unwrap();
        // (On a busy machine it may be over before the watch starts.)
        wait_for(&api, "count", |p| {
            ["Running", "Succeeded"].contains(&phase(p))
        })
        .await;
        let follow = LogParams {
            follow: true,
            ..Default::default()
        };
        let log = tokio::time::timeout(Duration::from_secs(3), api.logs("count", &follow))
            .await
            .expect("the follow ends with the container")
            .unwrap();
        assert_eq!(log, "a\nb\n");

        // restartPolicy Never: the pod fails with its container's exit code.
        api.create(
            &pp,
            &pod_with("once", &["sh", "-c", "echo bye; exit 2"], never),
        )
        .await
        .unwrap();
        let failed = wait_for(&api, "once", |p| phase(p) == "Failed").await;
        let cs = &failed.status.unwrap().container_statuses.unwrap()[0];
        let term = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((term.exit_code, term.reason.as_deref()), (2, Some("Error")));
        assert!(!cs.ready);
        assert_eq!(
            api.logs("once", &LogParams::default()).await.unwrap(),
            "bye\n"
        );
        let e = api_status(
            api.exec("once", ["true"], &AttachParams::default())
                .await
                .err()
                .unwrap(),
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "cannot exec into a container in a completed pod; current phase is Failed"
            )
        );

        // restartPolicy Always: killed processes are started again.
        api.create(
            &pp,
            &pod("always", &["sh", "-c", "echo start; exec sleep 1000"]),
        )
        .await
        .unwrap();
        running(&api, "always").await;
        // Killed once it has written its line (under load, the shell may not have run yet).
        for _ in 0..500 {
            if api.logs("always", &LogParams::default()).await.unwrap() == "start\n" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fake.kill_pod_processes("default", "always");
        let back = wait_for(&api, "always", |p| {
            let cs = &p
                .status
                .as_ref()
                .unwrap()
                .container_statuses
                .as_ref()
                .unwrap()[0];
            cs.restart_count == 1 && cs.ready
        })
        .await;
        let cs = &back.status.unwrap().container_statuses.unwrap()[0];
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(last.exit_code, 137);
        let previous = LogParams {
            previous: true,
            ..Default::default()
        };
        assert_eq!(api.logs("always", &previous).await.unwrap(), "start\n");

        // Down, and back.
        fake.set_down(true);
        assert!(api.get("always").await.is_err());
        assert!(std::net::TcpStream::connect(fake.url().trim_start_matches("http://")).is_err());
        fake.set_down(false);
        assert_eq!(phase(&api.get("always").await.unwrap()), "Running");
    });
}

#[test]
fn kube_fake_watch_resume_and_expiry() {
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        let pp = PostParams::default();
        let a = api
            .create(&pp, &pod("a", &["sleep", "1000"]))
            .await
            .unwrap();
        let from = a.metadata.resource_version.clone().unwrap();
        api.create(&pp, &pod("b", &["sleep", "1000"]))
            .await
            .unwrap();
        let other = json!({ "metadata": { "labels": { "app": "other" } } });
        api.create(&pp, &pod_with("c", &["sleep", "1000"], other))
            .await
            .unwrap();
        running(&api, "a").await;
        running(&api, "b").await;
        running(&api, "c").await;

        // From a's creation: b's ADDED and both Running, none of c.
        let wp = WatchParams::default().labels("app=paddock").timeout(1);
        let stream = api.watch(&wp, &from).await.unwrap();
        let mut seen = Vec::new();
        let t = Instant::now();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let (kind, p) = match ev.unwrap() {
                WatchEvent::Added(p) => ("ADDED", p),
                WatchEvent::Modified(p) => ("MODIFIED", p),
                e => panic!("{e:?}"),
            };
            let name = p.metadata.name.clone().unwrap();
            seen.push(format!("{kind} {name} {}", phase(&p)));
        }
        // timeoutSeconds=1 ended it.
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(seen.contains(&"ADDED b Pending".to_string()), "{seen:?}");
        assert!(seen.contains(&"MODIFIED a Running".to_string()), "{seen:?}");
        assert!(seen.contains(&"MODIFIED b Running".to_string()), "{seen:?}");
        assert!(
            !seen
                .iter()
                .any(|s| s.starts_with("ADDED a") || s.contains(" c ")),
            "{seen:?}"
        );

        // From "0": the current pods first.
        let stream = api.watch(&wp, "0").await.unwrap();
        let mut stream = std::pin::pin!(stream);
        let mut names = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                WatchEvent::Added(p) => names.push(p.metadata.name.unwrap()),
                e => panic!("{e:?}"),
            }
        }
        assert_eq!(names, ["a", "b"]);

        // Compacted away: 410 Gone.
        fake.compact();
        let stream = api.watch(&wp, &from).await.unwrap();
        let mut stream = std::pin::pin!(stream);
        match stream.next().await.unwrap().unwrap() {
            WatchEvent::Error(s) => {
                assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
                assert!(s.message.starts_with("too old resource version"), "{s:?}");
            }
            e => panic!("{e:?}"),
        }
        assert!(stream.next().await.is_none());
    });
}

#[test]
fn kube_fake_exec_v4_and_subprotocols() {
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let (_tmp, fake, rt) = setup(&[], &[]);
    rt.block_on(async {
        let api: Api<Pod> = Api::namespaced(client_from(&fake.kubeconfig()).await, "default");
        api.create(&PostParams::default(), &pod("box", &["sleep", "1000"]))
            .await
            .unwrap();
        running(&api, "box").await;
        let request = |protocols: &str| {
            let url = format!(
                "{}/api/v1/namespaces/default/pods/box/exec?command=sh&command=-c&\
                 command=echo+hi%3B+exit+1&stdout=true",
                fake.url().replace("http://", "ws://")
            );
            let mut req = url.into_client_request().unwrap();
            let h = req.headers_mut();
            h.insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
            h.insert(
                "Authorization",
                format!("Bearer {}", fake.token()).parse().unwrap(),
            );
            req
        };
        let (mut ws, resp) = tokio_tungstenite::connect_async(request("v4.channel.k8s.io"))
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "v4.channel.k8s.io"
        );
        let mut frames = Vec::new();
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Binary(b)) => frames.push(b.to_vec()),
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        assert_eq!(
            frames[0],
            [STDOUT],
            "the first frame opens the stdout channel"
        );
        let stdout: Vec<u8> = frames
            .iter()
            .filter(|f| f[0] == STDOUT)
            .flat_map(|f| f[1..].to_vec())
            .collect();
        assert_eq!(stdout, b"hi\n");
        let last = frames.last().unwrap();
        assert_eq!(last[0], ERROR);
        let status: Value = serde_json::from_slice(&last[1..]).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "1");

        // Both offered, as kube-rs does: v5.
        let (_, resp) =
            tokio_tungstenite::connect_async(request("v5.channel.k8s.io, v4.channel.k8s.io"))
                .await
                .unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "v5.channel.k8s.io"
        );
        // None the fake speaks: refused.
        let e = tokio_tungstenite::connect_async(request("channel.k8s.io"))
            .await
            .unwrap_err();
        match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => assert_eq!(r.status(), 400),
            e => panic!("{e:?}"),
        }
        assert_eq!(fake.exec_count(), 2);
    });
}
