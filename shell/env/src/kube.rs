//! The `kubernetes` driver: a session's processes run in a pod of its own on a Kubernetes
//! cluster, in a `paddock runner` there, reached through the cluster's API server with the
//! user's kubeconfig (kube-rs: contexts, tokens, client certificates and exec credential
//! plugins work as they do for kubectl). The context is resolved when the pod is made and kept:
//! a later `kubectl config use-context` does not move the session.
//!
//! - Provisioning ([`make_pod`], then [`ready`]): the pod `paddock-<session>` in the session's
//!   namespace, labelled `app.kubernetes.io/managed-by=paddock`, `paddock.dev/session=<id>` and
//!   `paddock.dev/owner=<this paddock>` (how paddock finds its pods again, and never another
//!   paddock's), from latis' `podSpec` (images, resources, volumes, service account) or one
//!   container from the session's image. It is recorded (`made`, `pod.json`) before it runs.
//!   The agent's container is the one named `agent`, else the first; when the spec gives it
//!   no command, paddock gives it one that keeps it alive, so that the image's own entrypoint
//!   (often a shell that exits at once without a terminal) does not end the pod. paddock polls
//!   the pod until it runs (an image that cannot be pulled, a container the kubelet cannot
//!   make or that keeps exiting, is an error with the cluster's reason), then makes it ready
//!   the way the ssh driver makes a host ready ([`super::ssh::prepare`]: a probe, this paddock
//!   binary copied in through an exec's stdin when missing, a detached runner) over exec
//!   streams.
//! - Entering: the agent's launch becomes the same relay as ssh's (`paddock __ssh-run
//!   --pod …`). It reaches the runner in the pod through an exec of `paddock __mcp-relay
//!   <socket>` there (a pipe between the exec stream and the runner's socket) that carries the
//!   runner protocol's HTTP/2, with keepalives that notice a dead stream. A dropped stream is
//!   reconnected with backoff and the run re-attached after the last event copied, as over ssh;
//!   a pod deleted or ended outside paddock is made again from `pod.json` (its run is lost).
//! - The pod's log (`session logs --environment`) is what its containers write; the agent's
//!   output is the session's activity. Delete deletes the pod; a daemon start deletes its own
//!   pods whose session is gone ([`sweep`]).
//!
//! Exec streams go through a client without a read timeout (kube-rs applies it to upgraded
//! streams), never close their stdin (a `v4.channel.k8s.io` server takes that for the end of
//! the stream), and read to the command's exit status, which kube-rs gives even when it leaves
//! stdout open after a dropped connection.
//!
//! Tested against a fake API server (tests/e2e/kube_fake.rs) that serves the subset used here
//! with Kubernetes' JSON shapes; no cluster runs on paddock's CI machines.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use paddock_core::{EnvSpec, SessionId};

use super::{Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The label every pod of paddock's carries (the Kubernetes recommended label).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "paddock");
/// The label naming the pod's session.
pub const SESSION_LABEL: &str = "paddock.dev/session";
/// The label naming the paddock (its data dir's [`owner`] id) whose pod it is: on a team's
/// cluster, one user's paddock never touches another's pods.
pub const OWNER_LABEL: &str = "paddock.dev/owner";

/// The [`OWNER_LABEL`] of the daemon whose data dir is `data_dir`: a random id made once and
/// kept there (stable across upgrades; two machines cloned from one image differ once
/// either made its own).
pub fn owner(data_dir: &Path) -> Result<String> {
    let file = data_dir.join("kubernetes-owner");
    if let Ok(id) = std::fs::read_to_string(&file) {
        if !id.trim().is_empty() {
            return Ok(id.trim().to_string());
        }
    }
    let id = ulid::Ulid::new().to_string().to_ascii_lowercase();
    use std::io::Write;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
    {
        Ok(mut f) => f
            .write_all(id.as_bytes())
            .map(|()| id)
            .map_err(|e| Error::file("write", &file, e)),
        // Made by another process meanwhile: that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::read_to_string(&file)
            .map(|s| s.trim().to_string())
            .map_err(|e| Error::file("read", &file, e)),
        Err(e) => Err(Error::file("write", &file, e)),
    }
}
/// The pod as paddock created it, in the session's environment directory.
pub(super) const POD_FILE: &str = "pod.json";
/// How long a pod may take to run (an image pull included).
const RUN_WAIT: Duration = Duration::from_secs(300);
/// How long one API call (not a stream) may take.
const CALL_WAIT: Duration = Duration::from_secs(30);
/// The command paddock gives the agent's container when the spec gives none: alive until the
/// pod is deleted, ending at once on TERM.
const KEEP_ALIVE: &str =
    "trap 'exit 0' TERM INT; echo 'paddock: pod ready'; while :; do sleep 3600 & wait $!; done";

/// Where a session's pod is and how to reach it, kept in the environment's `made` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// The kubeconfig files (empty: `KUBECONFIG`, else `~/.kube/config`), `:`-separated.
    pub kubeconfig: String,
    /// The kubeconfig context, resolved when the pod was made: a later `kubectl config
    /// use-context` does not move the session to another cluster.
    pub context: String,
    pub namespace: String,
    pub name: String,
    /// The container paddock's processes run in.
    pub container: String,
}

impl PodRef {
    /// `namespace/name`, for messages.
    pub fn destination(&self) -> String {
        format!("pod {}/{}", self.namespace, self.name)
    }

    /// The pod's namespace's API, for calls.
    async fn api(&self) -> Result<Api<Pod>> {
        self.api_for(Use::Calls).await
    }

    /// The pod's namespace's API, for exec streams (no read timeout).
    async fn streams(&self) -> Result<Api<Pod>> {
        self.api_for(Use::Streams).await
    }

    async fn api_for(&self, used: Use) -> Result<Api<Pod>> {
        let (client, ..) = client(&self.kubeconfig, &self.context, used).await?;
        Ok(Api::namespaced(client, &self.namespace))
    }
}

/// The pod of session `id`.
pub fn pod_name(id: &SessionId) -> String {
    // Pod names are DNS subdomains: lowercase.
    format!("paddock-{}", id.0.to_ascii_lowercase().replace('_', "-"))
}

/// Runs `f` to its end on a runtime of its own, on a thread of its own: callable from
/// anywhere (the daemon's blocking threads, a relay's runtime, the CLI's), never blocking an
/// async worker's runtime from inside.
pub(crate) fn block_on<F>(f: F) -> Result<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| super::runtime().map(|rt| rt.block_on(f)))
            .join()
            .map_err(|_| Error::Failed("the kubernetes client panicked".into()))?
    })
}

/// The kubeconfig: the files named (`:`-separated, merged as kubectl merges them), else
/// kube-rs' own lookup (`KUBECONFIG`, then `~/.kube/config`).
fn kubeconfig(files: &str) -> Result<Kubeconfig> {
    let explain = |what: &str, e: &dyn std::fmt::Display| {
        Error::Refused(format!(
            "cannot read the kubeconfig {what}: {e} (the kubernetes driver reaches the cluster \
             with your kubeconfig: set KUBECONFIG, or `kubeconfig:` in the session's kubernetes \
             block)"
        ))
    };
    if files.is_empty() {
        return Kubeconfig::read().map_err(|e| explain("(KUBECONFIG or ~/.kube/config)", &e));
    }
    let mut merged: Option<Kubeconfig> = None;
    for f in files.split(':').filter(|f| !f.is_empty()) {
        let k = Kubeconfig::read_from(f).map_err(|e| explain(f, &e))?;
        merged = Some(match merged {
            None => k,
            Some(m) => m.merge(k).map_err(|e| explain(f, &e))?,
        });
    }
    merged.ok_or_else(|| explain(files, &"no file named"))
}

/// What a client is for: API calls (each answered within [`CALL_WAIT`]) or exec streams (which
/// may be silent for as long as they live: a copy going in, an idle agent).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Calls,
    Streams,
}

/// A client for the kubeconfig's `context` (empty: its current one), with the context's name
/// and namespace (`default` when it names none).
async fn client(files: &str, context: &str, used: Use) -> Result<(kube::Client, String, String)> {
    let config = kubeconfig(files)?;
    let resolved = if context.is_empty() {
        config.current_context.clone().unwrap_or_default()
    } else {
        context.to_string()
    };
    let options = KubeConfigOptions {
        context: (!resolved.is_empty()).then(|| resolved.clone()),
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(config, &options)
        .await
        .map_err(|e| Error::Refused(format!("the kubeconfig cannot be used: {e}")))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    // kube-rs applies the read timeout to an upgraded exec stream too: none for those (the
    // relay's HTTP/2 keepalives notice a dead stream instead).
    config.read_timeout = match used {
        Use::Calls => Some(CALL_WAIT),
        Use::Streams => None,
    };
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config)
        .map_err(|e| Error::Failed(format!("cannot make a kubernetes client: {e}")))?;
    Ok((client, resolved, namespace))
}

/// What the host lacks for a kubernetes session: a kubeconfig that names a cluster (the
/// cluster itself is reached when the environment is made).
pub fn check_host(spec: &EnvSpec) -> Result<()> {
    let k = spec.kubernetes();
    let config = kubeconfig(&k.kubeconfig)?;
    if !k.context.is_empty() && !config.contexts.iter().any(|c| c.name == k.context) {
        let names: Vec<&str> = config.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::Refused(format!(
            "the kubeconfig has no context {:?} (it has: {})",
            k.context,
            names.join(", ")
        )));
    }
    if k.context.is_empty() && config.current_context.as_deref().unwrap_or("").is_empty() {
        return Err(Error::Refused(
            "the kubeconfig has no current context: name one (`context:` in the kubernetes \
             block, --kube-context, or `kubectl config use-context`)"
                .into(),
        ));
    }
    Ok(())
}

/// An API error, said with what was asked (and what to do for the common refusals: see
/// [`Error::Kube`]).
fn explain(e: kube::Error, what: &str) -> Error {
    Error::Kube {
        doing: what.to_string(),
        source: e,
    }
}

/// The session's pod as paddock creates it: the spec's, labelled, with the container paddock
/// enters kept alive. Returns it and the name of that container.
pub fn pod_object(spec: &EnvSpec, id: &SessionId, owner: &str) -> Result<(Pod, String)> {
    let k = spec.kubernetes();
    let mut pod_spec: PodSpec = if k.pod_spec.trim().is_empty() {
        PodSpec::default()
    } else {
        serde_json::from_str(&k.pod_spec).map_err(|e| {
            Error::Refused(format!(
                "the kubernetes block's podSpec is not a PodSpec: {e}"
            ))
        })?
    };
    if pod_spec.containers.is_empty() {
        pod_spec.containers.push(Container {
            name: "agent".into(),
            ..Container::default()
        });
    }
    let at = pod_spec
        .containers
        .iter()
        .position(|c| c.name == "agent")
        .unwrap_or(0);
    let c = &mut pod_spec.containers[at];
    if c.image.as_deref().unwrap_or("").is_empty() {
        if spec.image.is_empty() {
            return Err(Error::Refused(format!(
                "the pod's container {:?} has no image: give it one in the podSpec, or --image",
                c.name
            )));
        }
        c.image = Some(spec.image.clone());
    }
    if c.command.is_none() && c.args.is_none() {
        c.command = Some(vec!["sh".into(), "-c".into(), KEEP_ALIVE.into()]);
    }
    if spec.memory_bytes > 0 {
        let r = c.resources.get_or_insert_with(Default::default);
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .entry("memory".into())
            .or_insert_with(|| Quantity(spec.memory_bytes.to_string()));
    }
    let container = c.name.clone();
    if !k.service_account.is_empty() {
        pod_spec.service_account_name = Some(k.service_account.clone());
    }
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(pod_name(id)),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                (SESSION_LABEL.to_string(), id.0.clone()),
                (OWNER_LABEL.to_string(), owner.to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    };
    Ok((pod, container))
}

/// Makes session `id`'s pod, or finds it (a start after a daemon restart, a restart of the
/// session): one that ended is made again. Returns where it is, before it runs: the caller
/// records it at once, so that a delete finds it whatever fails after. `log` hears what was
/// done.
pub fn make_pod(
    spec: &EnvSpec,
    id: &SessionId,
    owner: &str,
    root: &Path,
    log: &(dyn Fn(&str) + Sync),
) -> Result<PodRef> {
    let (object, container) = pod_object(spec, id, owner)?;
    // Kept: a relay that finds the pod deleted or ended makes it again from it.
    let file = root.join(POD_FILE);
    let text = serde_json::to_string_pretty(&object).expect("a Pod is JSON");
    std::fs::write(&file, text).map_err(|e| Error::file("write", &file, e))?;
    let k = spec.kubernetes();
    block_on(async {
        let (client, context, default_ns) = client(&k.kubeconfig, &k.context, Use::Calls).await?;
        let namespace = if k.namespace.is_empty() {
            default_ns
        } else {
            k.namespace.clone()
        };
        let api: Api<Pod> = Api::namespaced(client, &namespace);
        let pod = PodRef {
            kubeconfig: k.kubeconfig.clone(),
            context,
            namespace,
            name: pod_name(id),
            container,
        };
        ensure_pod(&api, &pod, object, log).await?;
        Ok::<_, Error>(pod)
    })?
}

/// Waits for the pod to run and makes it ready (paddock and its runner in it). Returns the
/// runner there and the agent's working directory there.
pub fn ready(
    exe: &Path,
    spec: &EnvSpec,
    pod: &PodRef,
    log: &(dyn Fn(&str) + Sync),
) -> Result<(super::ssh::Remote, std::path::PathBuf)> {
    block_on(async {
        let api = pod.api().await?;
        wait_running(&api, pod, log).await
    })??;
    let workdir = object_workdir(spec, &pod.container);
    super::ssh::prepare(&PodShell(pod.clone()), exe, "", "", &workdir, log)
}

/// The agent container's working directory in the spec (`.`: the image's, where an exec
/// starts).
fn object_workdir(spec: &EnvSpec, container: &str) -> String {
    serde_json::from_str::<PodSpec>(&spec.kubernetes().pod_spec)
        .ok()
        .and_then(|s| s.containers.into_iter().find(|c| c.name == container))
        .and_then(|c| c.working_dir)
        .unwrap_or_else(|| ".".into())
}

/// The pod, created unless it is there and alive; one that ended (its containers exited
/// under `restartPolicy: Never`) or is being deleted is replaced.
async fn ensure_pod(
    api: &Api<Pod>,
    pod: &PodRef,
    object: Pod,
    log: &(dyn Fn(&str) + Sync),
) -> Result<()> {
    let found = api
        .get_opt(&pod.name)
        .await
        .map_err(|e| explain(e, &format!("cannot look for {}", pod.destination())))?;
    if let Some(p) = found {
        let phase = phase(&p);
        let ending = p.metadata.deletion_timestamp.is_some();
        if !ending && phase != "Succeeded" && phase != "Failed" {
            log(&format!("{} is there ({phase})", pod.destination()));
            return Ok(());
        }
        log(&format!(
            "{} has ended ({phase}); making it again",
            pod.destination()
        ));
        delete_and_wait(api, &pod.name).await?;
    }
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        // Made meanwhile (two relays of the session healing at once): there it is.
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
        Err(e) => return Err(explain(e, &format!("cannot create {}", pod.destination()))),
    }
    log(&format!(
        "created {} (labels {}={}, {SESSION_LABEL}={})",
        pod.destination(),
        MANAGED_BY.0,
        MANAGED_BY.1,
        object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SESSION_LABEL))
            .map(String::as_str)
            .unwrap_or_default()
    ));
    Ok(())
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into())
}

/// Restarts of the agent's container in a crash loop before its making is given up.
const CRASH_LOOPS: i32 = 3;
/// Why a pod does not run that no wait mends (the kubelet's reasons).
const HOPELESS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Waits until the pod runs (its agent container started), polling it; fails at once on a
/// reason no wait mends or a container that keeps exiting, and after [`RUN_WAIT`] with the
/// last reason seen.
async fn wait_running(api: &Api<Pod>, pod: &PodRef, log: &(dyn Fn(&str) + Sync)) -> Result<()> {
    let deadline = tokio::time::Instant::now() + RUN_WAIT;
    let mut said = String::new();
    loop {
        let p = api
            .get(&pod.name)
            .await
            .map_err(|e| explain(e, &format!("cannot read {}", pod.destination())))?;
        let phase = phase(&p);
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let waiting: Vec<(String, String)> = statuses
            .iter()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
            .map(|w| {
                (
                    w.reason.clone().unwrap_or_default(),
                    w.message.clone().unwrap_or_default(),
                )
            })
            .collect();
        let agent = statuses.iter().find(|c| c.name == pod.container);
        // Running is enough (not ready: a readiness probe is the cluster's business).
        let started = agent.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        match phase.as_str() {
            "Running" if started => {
                log(&format!("{} is running", pod.destination()));
                return Ok(());
            }
            "Running" if statuses.is_empty() => return Ok(()),
            "Succeeded" | "Failed" => {
                return Err(Error::Failed(format!(
                    "{} ended ({phase}) before paddock could use it: see `kubectl logs -n {} {}`",
                    pod.destination(),
                    pod.namespace,
                    pod.name
                )))
            }
            _ => {}
        }
        // A container that keeps exiting (an image without `sh` for paddock's keep-alive, a
        // command that ends): its last exit says why.
        if let Some(c) = agent.filter(|c| {
            c.restart_count >= CRASH_LOOPS
                && c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
        }) {
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            return Err(Error::Failed(format!(
                "{}'s container {} keeps exiting (restarted {} times){}",
                pod.destination(),
                c.name,
                c.restart_count,
                match last {
                    Some(t) => format!(
                        ": its last run ended with {} ({}){}",
                        t.exit_code,
                        t.reason.as_deref().unwrap_or("no reason given"),
                        t.message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ),
                    None => String::new(),
                }
            )));
        }
        if let Some((reason, message)) =
            waiting.iter().find(|(r, _)| HOPELESS.contains(&r.as_str()))
        {
            return Err(Error::Failed(format!(
                "{} cannot run: {reason}{}",
                pod.destination(),
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            )));
        }
        let now = match waiting.first() {
            Some((r, _)) if !r.is_empty() => format!("{phase}: {r}"),
            _ => phase.clone(),
        };
        if now != said {
            log(&format!("{} is {now}", pod.destination()));
            said = now;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Failed(format!(
                "{} did not run within {}s (it is {said})",
                pod.destination(),
                RUN_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deletes the pod `name` and waits until it is gone (at most its grace and a little).
async fn delete_and_wait(api: &Api<Pod>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(explain(e, &format!("cannot delete pod {name}"))),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        match api.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => return Err(explain(e, &format!("cannot read pod {name}"))),
        }
    }
    Err(Error::Failed(format!(
        "pod {name} was not gone within 60s of its delete"
    )))
}

/// The most of a file sent into an exec before kube-rs flushes it as a frame.
const STDIN_FRAME: usize = 256 * 1024;
/// How long the output of an exec that ended may take to drain.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Runs `argv` in the pod's container (an exec), with `stdin` fed from a file (its end is not
/// signalled: a server of `v4.channel.k8s.io` would take that for the end of the stream; the
/// command reads what it expects); its stdout, or why it failed (its stderr and the exit the
/// API server reported).
pub async fn exec(pod: &PodRef, argv: Vec<String>, stdin: Option<&Path>) -> Result<String> {
    let api = pod.streams().await?;
    let params = AttachParams::default()
        .container(pod.container.clone())
        .stdin(stdin.is_some())
        .stdout(true)
        .stderr(true)
        .max_stdin_buf_size(STDIN_FRAME);
    let mut p = api
        .exec(&pod.name, argv, &params)
        .await
        .map_err(|e| explain(e, &format!("cannot exec in {}", pod.destination())))?;
    let Some(status) = p.take_status() else {
        return Err(Error::Failed("the exec gave no status".into()));
    };
    // Read as it comes, kept when the exec ends early: kube-rs ends stdout and stderr when the
    // command ends, but not when the connection drops.
    let collect = |r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = buf.clone();
        let task = tokio::spawn(async move {
            let Some(mut r) = r else { return };
            let mut chunk = vec![0u8; 64 * 1024];
            while let Ok(n) = r.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                into.lock()
                    .expect("exec output")
                    .extend_from_slice(&chunk[..n]);
            }
        });
        (buf, task)
    };
    let (out, out_task) = collect(p.stdout());
    let (err, err_task) = collect(p.stderr());
    let feed = match (stdin, p.stdin()) {
        (Some(file), Some(mut w)) => {
            let file = file.to_path_buf();
            Some(tokio::spawn(async move {
                let mut f = tokio::fs::File::open(&file)
                    .await
                    .map_err(|e| Error::file("read", &file, e))?;
                let sent = async {
                    tokio::io::copy(&mut f, &mut w).await?;
                    w.flush().await
                };
                sent.await
                    .map_err(|e| Error::file("send into the pod", &file, e))?;
                Ok::<_, Error>(())
            }))
        }
        _ => None,
    };
    let status = status.await;
    let _ = tokio::time::timeout(DRAIN_WAIT, async {
        let _ = out_task.await;
        let _ = err_task.await;
    })
    .await;
    // The command ended: what it did not read of stdin is moot, unless the file itself failed.
    let fed = match feed {
        Some(f) if f.is_finished() => f.await.unwrap_or(Ok(())),
        Some(f) => {
            f.abort();
            Ok(())
        }
        None => Ok(()),
    };
    let text = |b: &std::sync::Mutex<Vec<u8>>| {
        String::from_utf8_lossy(&b.lock().expect("exec output")).to_string()
    };
    let (stdout, stderr) = (text(&out), text(&err));
    match status {
        Some(s) if s.status.as_deref() == Some("Success") => fed.map(|()| stdout),
        Some(s) => Err(Error::Failed(format!(
            "in {}: {}",
            pod.destination(),
            if stderr.trim().is_empty() {
                s.message.clone().unwrap_or_default()
            } else {
                stderr.trim().to_string()
            }
        ))),
        None => Err(Error::Failed(format!(
            "in {}: the exec's connection dropped before it ended{}",
            pod.destination(),
            if stderr.trim().is_empty() {
                String::new()
            } else {
                format!(" ({})", stderr.trim())
            }
        ))),
    }
}

/// A pod as a shell that runs commands for [`super::ssh::prepare`].
struct PodShell(PodRef);

impl super::ssh::RemoteShell for PodShell {
    fn run(&self, command: &str, stdin: Option<&Path>) -> Result<String> {
        let argv = vec!["sh".to_string(), "-c".to_string(), command.to_string()];
        block_on(exec(&self.0, argv, stdin))?
    }

    fn destination(&self) -> String {
        self.0.destination()
    }

    fn login_shell(&self) -> bool {
        false
    }
}

/// Makes the pod ready again (its runner gone: its container restarted, or the pod itself
/// deleted or ended outside paddock, when it is made again from what `root` kept of it): the
/// relay's heal.
/// Why a pod could not be made ready again.
pub enum PrepareError {
    /// The cluster, or the way into the pod, does not answer now: try again later.
    Retry(Error),
    /// It will not be: the run is lost.
    Fatal(Error),
}

pub fn prepare_again(
    exe: &Path,
    pod: &PodRef,
    workdir: &str,
    root: &Path,
    log: &(dyn Fn(&str) + Sync),
) -> Result<(), PrepareError> {
    let made = block_on(async {
        let api = pod.api().await?;
        let found = api
            .get_opt(&pod.name)
            .await
            .map_err(|e| explain(e, &format!("cannot read {}", pod.destination())))?;
        let alive = found.as_ref().is_some_and(|p| {
            !matches!(phase(p).as_str(), "Succeeded" | "Failed")
                && p.metadata.deletion_timestamp.is_none()
        });
        if !alive {
            let file = root.join(POD_FILE);
            let object: Pod = std::fs::read_to_string(&file)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
                .map_err(|e| {
                    Error::Failed(format!(
                        "{} is gone, and {} cannot be read to make it again: {e}",
                        pod.destination(),
                        file.display()
                    ))
                })?;
            log(&format!(
                "{} is gone or has ended; making it again",
                pod.destination()
            ));
            ensure_pod(&api, pod, object, log).await?;
        }
        wait_running(&api, pod, log).await
    })
    .and_then(|r| r);
    made.map_err(|e| {
        if e.is_transient() {
            PrepareError::Retry(e)
        } else {
            PrepareError::Fatal(e)
        }
    })?;
    // An exec path that does not work now (the node unreachable, the kubelet restarting) is
    // not a reason to give the run up.
    block_on(exec(pod, vec!["true".into()], None))
        .and_then(|r| r)
        .map_err(PrepareError::Retry)?;
    super::ssh::prepare(&PodShell(pod.clone()), exe, "", "", workdir, log)
        .map(|_| ())
        .map_err(PrepareError::Fatal)
}

/// Whether the pod is there and running: `Ok(false)` when it is gone, ended or not yet
/// running, `Err` when the API server cannot say (unreachable: try again).
pub async fn running(pod: &PodRef) -> Result<bool> {
    let api = pod.api().await?;
    match api.get_opt(&pod.name).await {
        Ok(Some(p)) => Ok(phase(&p) == "Running" && p.metadata.deletion_timestamp.is_none()),
        Ok(None) => Ok(false),
        Err(e) => Err(explain(e, &format!("cannot read {}", pod.destination()))),
    }
}

/// A gRPC channel to the runner in the pod, through an exec stream of `paddock __mcp-relay
/// <socket>` there (a byte pipe to the runner's socket), with HTTP/2 keepalives that notice a
/// stream that went dead.
/// Why [`runner_channel`] has no channel.
pub enum ChannelError {
    /// The exec could not be opened (the API server, the node or the kubelet): try again.
    Unreachable(String),
    /// The exec ran, but nothing answered through it (no runner on the socket there).
    NoAnswer(String),
}

pub async fn runner_channel(
    pod: &PodRef,
    paddock: &str,
    socket: &str,
) -> Result<tonic::transport::Channel, ChannelError> {
    let api = pod
        .streams()
        .await
        .map_err(|e| ChannelError::Unreachable(e.to_string()))?;
    // What the last exec's opening said, when it failed: the channel's error is then the
    // exec's, not the runner's.
    let opening = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let said = opening.clone();
    let dest = pod.destination();
    let (pod, argv) = (
        pod.clone(),
        vec![
            paddock.to_string(),
            "__mcp-relay".to_string(),
            socket.to_string(),
        ],
    );
    tonic::transport::Endpoint::from_static("http://pod.paddock")
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_timeout(CALL_WAIT)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let (api, pod, argv, said) = (api.clone(), pod.clone(), argv.clone(), said.clone());
            async move {
                let params = AttachParams::default()
                    .container(pod.container.clone())
                    .stdin(true)
                    .stdout(true)
                    .stderr(false);
                let mut p = match api.exec(&pod.name, argv, &params).await {
                    Ok(p) => p,
                    Err(e) => {
                        let why = explain(e, "exec").to_string();
                        *said.lock().expect("exec opening") = Some(why.clone());
                        return Err(std::io::Error::other(why));
                    }
                };
                let (Some(r), Some(w), Some(status)) = (p.stdout(), p.stdin(), p.take_status())
                else {
                    return Err(std::io::Error::other("the exec has no stdin or stdout"));
                };
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Piped {
                    io: tokio::io::join(r, w),
                    ended: Box::pin(async move {
                        let _ = status.await;
                    }),
                    over: false,
                    exec: p,
                }))
            }
        }))
        .await
        .map_err(|e| match opening.lock().expect("exec opening").take() {
            Some(why) => ChannelError::Unreachable(format!("cannot exec in {dest}: {why}")),
            None => ChannelError::NoAnswer(format!("cannot reach the runner in {dest}: {e}")),
        })
}

/// An exec stream as one connection: its stdout read, its stdin written; the exec ends when
/// it is dropped. Its end (the command's, or the connection's: kube-rs then leaves stdout
/// open) reads as the end of the stream.
struct Piped {
    io: tokio::io::Join<
        tokio::io::ReadHalf<tokio::io::SimplexStream>,
        tokio::io::WriteHalf<tokio::io::SimplexStream>,
    >,
    /// Ready once the exec is over.
    ended: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    over: bool,
    exec: kube::api::AttachedProcess,
}

impl Drop for Piped {
    fn drop(&mut self) {
        self.exec.abort();
    }
}

impl tokio::io::AsyncRead for Piped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        if self.over {
            return Poll::Ready(Ok(()));
        }
        match std::pin::Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Pending => match self.ended.as_mut().poll(cx) {
                // Nothing buffered and nothing more to come: the end of the stream.
                Poll::Ready(()) => {
                    self.over = true;
                    Poll::Ready(Ok(()))
                }
                Poll::Pending => Poll::Pending,
            },
            r => r,
        }
    }
}

impl tokio::io::AsyncWrite for Piped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Deletes the session's pod (best effort, off the event loop: a cluster that does not answer
/// is logged, never waited for beyond the client's timeouts).
pub fn remove(pod: &PodRef, id: &SessionId) {
    let result = block_on(async {
        let (client, _, default_ns) = client(&pod.kubeconfig, &pod.context, Use::Calls).await?;
        let namespace = if pod.namespace.is_empty() {
            default_ns
        } else {
            pod.namespace.clone()
        };
        let api: Api<Pod> = Api::namespaced(client, &namespace);
        match api.delete(&pod.name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(explain(e, &format!("cannot delete {}", pod.destination()))),
        }
    });
    match result {
        Ok(Ok(true)) => tracing::info!(session = %id, "deleted {}", pod.destination()),
        Ok(Ok(false)) => tracing::info!(session = %id, "{} was already gone", pod.destination()),
        Ok(Err(e)) | Err(e) => tracing::warn!(session = %id, "{e}"),
    }
}

/// Where session `id`'s pod is by its spec alone (an empty namespace: the context's): for a
/// delete that comes before its making recorded it.
pub fn expected(spec: &EnvSpec, id: &SessionId) -> PodRef {
    let k = spec.kubernetes();
    PodRef {
        kubeconfig: k.kubeconfig.clone(),
        context: k.context.clone(),
        namespace: k.namespace.clone(),
        name: pod_name(id),
        container: String::new(),
    }
}

/// The pod's state and the last `lines` of the agent container's log, for `session logs
/// --environment`.
pub fn describe(pod: &PodRef, lines: i64) -> Result<(String, String)> {
    block_on(async {
        let api = pod.api().await?;
        let p = api
            .get(&pod.name)
            .await
            .map_err(|e| explain(e, &format!("cannot read {}", pod.destination())))?;
        let mut state = phase(&p);
        if let Some(c) = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == pod.container))
        {
            state += &format!(
                ", container {} restarted {} time(s)",
                c.name, c.restart_count
            );
        }
        let logs = api
            .logs(
                &pod.name,
                &LogParams {
                    container: Some(pod.container.clone()),
                    tail_lines: Some(lines),
                    ..LogParams::default()
                },
            )
            .await
            .map_err(|e| explain(e, &format!("cannot read the log of {}", pod.destination())))?;
        Ok((state, logs))
    })?
}

/// Deletes the pods of `owner` (this paddock's) in the namespaces of `places` whose session
/// has no environment in `environments` (checked as each is found: a session made meanwhile
/// has its directory before its pod): what a crash between a delete's commit and the pod's
/// removal left on the cluster. Found by their labels; best effort (a cluster that does not
/// answer is logged).
pub fn sweep(places: &[PodRef], environments: &Path, owner: &str) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    let mut removed = 0;
    for place in places {
        if !seen.insert((&place.kubeconfig, &place.context, &place.namespace)) {
            continue;
        }
        let selector = format!("{}={},{OWNER_LABEL}={owner}", MANAGED_BY.0, MANAGED_BY.1);
        let result = block_on(async {
            let api = place.api().await?;
            let list = api
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| explain(e, &format!("cannot list the pods of {}", place.namespace)))?;
            let mut gone = Vec::new();
            for p in list.items {
                let session = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SESSION_LABEL))
                    .cloned()
                    .unwrap_or_default();
                let Some(name) = p.metadata.name else {
                    continue;
                };
                let ours = !session.is_empty()
                    && !session.contains(['/', '.'])
                    && !environments.join(&session).exists();
                if !ours || p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => gone.push(name),
                    Err(e) => {
                        tracing::warn!("{}", explain(e, &format!("cannot delete pod {name}")))
                    }
                }
            }
            Ok::<_, Error>(gone)
        });
        match result {
            Ok(Ok(gone)) => {
                for name in &gone {
                    tracing::info!(
                        "deleted pod {}/{name}: its session is gone",
                        place.namespace
                    );
                }
                removed += gone.len();
            }
            Ok(Err(e)) | Err(e) => tracing::warn!("cannot look for paddock's pods: {e}"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::KubeOptions;

    fn spec(pod_spec: &str, image: &str) -> EnvSpec {
        EnvSpec {
            driver: paddock_core::Driver::Kubernetes,
            image: image.into(),
            memory_bytes: 1 << 30,
            kubernetes: paddock_core::environment::boxed(KubeOptions {
                service_account: "agents".into(),
                pod_spec: pod_spec.into(),
                ..KubeOptions::default()
            }),
            ..EnvSpec::default()
        }
    }

    #[test]
    fn the_pod_is_the_spec_labelled_with_its_agent_container_kept_alive() {
        let id = SessionId("01JX_ABC".into());
        let (pod, container) = pod_object(&spec("", "debian:12"), &id, "o1").unwrap();
        assert_eq!(container, "agent");
        assert_eq!(pod.metadata.name.as_deref(), Some("paddock-01jx-abc"));
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels[MANAGED_BY.0], "paddock");
        assert_eq!(labels[SESSION_LABEL], "01JX_ABC");
        assert_eq!(labels[OWNER_LABEL], "o1");
        let s = pod.spec.unwrap();
        assert_eq!(s.service_account_name.as_deref(), Some("agents"));
        let c = &s.containers[0];
        assert_eq!(c.image.as_deref(), Some("debian:12"));
        assert_eq!(c.command.as_ref().unwrap()[2], KEEP_ALIVE);
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
            (1u64 << 30).to_string()
        );
        // The seed's spec: the container named agent is paddock's, its command and limits kept.
        let seed = r#"{"containers":[{"name":"side","image":"busybox"},
            {"name":"agent","image":"ghcr.io/x/ws","command":["/init"],"workingDir":"/workspace",
             "resources":{"limits":{"memory":"4Gi"}}}],
            "volumes":[{"name":"workspace","persistentVolumeClaim":{"claimName":"repo"}}]}"#;
        let (pod, container) = pod_object(&spec(seed, ""), &id, "o1").unwrap();
        assert_eq!(container, "agent");
        let s = pod.spec.unwrap();
        assert_eq!(s.containers[1].command.as_ref().unwrap(), &["/init"]);
        assert_eq!(
            s.containers[1]
                .resources
                .as_ref()
                .unwrap()
                .limits
                .as_ref()
                .unwrap()["memory"]
                .0,
            "4Gi"
        );
        assert_eq!(s.volumes.unwrap()[0].name, "workspace");
        assert_eq!(object_workdir(&spec(seed, ""), "agent"), "/workspace");
        let e = pod_object(&spec(r#"{"containers":[{"name":"a"}]}"#, ""), &id, "o1").unwrap_err();
        assert!(
            matches!(&e, Error::Refused(m) if m.contains("has no image")),
            "{e}"
        );
        let e = pod_object(&spec(r#"{"containers":7}"#, ""), &id, "o1").unwrap_err();
        assert!(
            matches!(&e, Error::Refused(m) if m.contains("is not a PodSpec")),
            "{e}"
        );
    }
}
