//! latis' session commands on paddock's sessions: `session create --task …` (with a driver,
//! mounts and a `session.yaml`), the latis list (`ID DRIVER STATUS TASK AGE`), `session status`,
//! `session delete` and `session prune`. `attach` is in `attach.rs`.
//!
//! latis speaks of a session's *state* (creating, starting, working, waiting, complete,
//! stopped); paddock's core has statuses. [`latis_state`](super::view::latis_state) is the one place that maps one onto
//! the other.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use paddock_core::{ErrorCode, Status};
use paddock_proto::obey::local::v1 as pb;
use serde::Deserialize;

use super::client::Client;
use super::view::{age, driver_of, one_line, provider_name, state_of, DRIVERS};
use super::{Error, Result};
use crate::transport::obey_code;

/// The one workspace path a `--mount` may name as its destination under the local driver.
pub const WORKSPACE: &str = "/workspace";

/// How long a TASK cell may be (in characters, the ellipsis included).
pub const TASK_CELL_MAX_CHARS: usize = 40;

/// A `session.yaml` is read only up to this size: it is a handful of fields.
const SESSION_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// The latis list's row: ID, DRIVER, STATUS, TASK, AGE, then paddock's NAME, PROVIDER, TOKENS.
/// Its cells borrow what they show as it is (a list of 100 costs a few allocations a row).
pub fn list_row(s: &pb::SessionInfo, now_ms: u64) -> Vec<Cow<'_, str>> {
    vec![
        Cow::Borrowed(s.id.as_str()),
        Cow::Borrowed(driver_of(s)),
        if s.disconnected {
            // The agent works on, out of reach until the connection is back.
            Cow::Owned(format!("{} (disconnected)", state_of(s)))
        } else {
            Cow::Borrowed(state_of(s))
        },
        if s.initial_message.trim().is_empty() {
            Cow::Borrowed("-")
        } else {
            Cow::Owned(one_line(&s.initial_message, TASK_CELL_MAX_CHARS))
        },
        Cow::Owned(age(&s.created_at, now_ms)),
        Cow::Borrowed(s.agent_name.as_str()),
        Cow::Borrowed(provider_name(s.provider)),
        Cow::Owned((s.tokens_input + s.tokens_output).to_string()),
    ]
}

pub const LIST_HEADERS: [&str; 8] = [
    "ID", "DRIVER", "STATUS", "TASK", "AGE", "NAME", "PROVIDER", "TOKENS",
];

/// Checks a `--driver` / `driver:`; the error names the drivers there are.
pub fn check_driver(name: &str) -> Result<&'static str> {
    let n = name.trim().to_ascii_lowercase();
    if let Some(d) = DRIVERS.iter().find(|d| **d == n) {
        return Ok(d);
    }
    if let Some(d) = paddock_core::Driver::parse(&n) {
        return Ok(DRIVERS
            .iter()
            .find(|x| **x == d.name())
            .expect("every core driver is listed"));
    }
    let why = match n.as_str() {
        "docker" => format!(
            "driver \"{name}\" is not available: paddock runs containers with podman (--driver podman)"
        ),
        _ => format!("unknown driver \"{name}\""),
    };
    Err(Error::Usage(format!(
        "{why}; the drivers are: {} (local: on the host, not isolated; bubblewrap: a sandbox \
         on this machine; podman: a container per session; ssh: another machine; qemu: a VM per \
         session; kubernetes: a pod per session)",
        DRIVERS.join(", ")
    )))
}

/// What a `--mount SRC:DST` means under the local driver: the agent is not isolated, so
/// nothing is mounted; SRC becomes the session's working directory (its campaign root) and DST
/// must be the workspace (`/workspace` or `.`). Relative SRCs are taken from `base`. Returns
/// SRC, canonical.
pub fn parse_mount(spec: &str, base: &Path) -> Result<PathBuf> {
    let explain = "the local driver does not isolate the filesystem: the agent sees the host \
                   as it is, and a mount only names its working directory, as SRC:/workspace";
    let Some((src, dst)) = spec.split_once(':') else {
        return Err(Error::Usage(format!(
            "mount \"{spec}\": expected SRC:DST ({explain})"
        )));
    };
    if dst.contains(':') {
        return Err(Error::Usage(format!(
            "mount \"{spec}\": mount options are not supported ({explain})"
        )));
    }
    let dst_ok = matches!(dst.trim_end_matches('/'), "/workspace" | ".");
    if !dst_ok {
        return Err(Error::Usage(format!(
            "mount \"{spec}\": destination \"{dst}\" is not {WORKSPACE} ({explain})"
        )));
    }
    if src.is_empty() {
        return Err(Error::Usage(format!("mount \"{spec}\": SRC is empty")));
    }
    let path = base.join(src);
    let canon = std::fs::canonicalize(&path).map_err(Error::input(format!(
        "mount \"{spec}\": {}",
        path.display()
    )))?;
    if !canon.is_dir() {
        return Err(Error::Usage(format!(
            "mount \"{spec}\": {} is not a directory",
            canon.display()
        )));
    }
    Ok(canon)
}

/// `session create`'s flags. Every one may also come from `-c session.yaml`; a flag given
/// overrides the file.
// The fields' doc comments are `--help` text, for a terminal: `<name>` and `[USER@]HOST` are
// neither HTML nor links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Args, Debug, Default)]
pub struct CreateArgs {
    /// Campaign id or name [default with --task, --mount or -c: the current directory,
    /// registered as a campaign if none has it as its root]
    #[arg(long)]
    pub campaign: Option<String>,
    /// The task: the session's first message, sent as soon as the agent is up
    #[arg(long, visible_alias = "initial-message")]
    pub task: Option<String>,
    /// Where the agent runs: local (on the host, not isolated), bubblewrap (a sandbox: the
    /// host read-only, the workspace writable, its own HOME and /tmp, no network), podman (a
    /// container of its own, from --image), ssh (another machine, --ssh), qemu (a VM of its
    /// own, from --image; see the qemu block of -c) or kubernetes (a pod of its own on the
    /// cluster of your kubeconfig, from --image or the kubernetes block's podSpec)
    #[arg(long)]
    pub driver: Option<String>,
    /// The machine an ssh session runs on: [USER@]HOST[:PORT] (implies --driver ssh)
    #[arg(long, value_name = "[USER@]HOST[:PORT]")]
    pub ssh: Option<String>,
    /// The private key ssh logs in with [default: ssh's own keys and agent]
    #[arg(long, value_name = "FILE")]
    pub ssh_key: Option<PathBuf>,
    /// The agent's working directory on the ssh host [default: the home directory there]
    #[arg(long, value_name = "DIR")]
    pub ssh_workdir: Option<String>,
    /// The namespace a kubernetes session's pod goes to [default: the kubeconfig context's]
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The kubeconfig context a kubernetes session uses [default: its current context]
    #[arg(long, value_name = "CONTEXT")]
    pub kube_context: Option<String>,
    /// The container's image (podman): a reference (pulled with progress when missing), an
    /// image archive, or a root directory
    #[arg(long)]
    pub image: Option<String>,
    /// The most memory the session's processes may use: 512m, 2g, 1GiB (bubblewrap, podman)
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// The most processes the session may hold at once (bubblewrap, podman)
    #[arg(long)]
    pub pids: Option<u32>,
    /// SRC:/workspace: the agent's workspace is SRC (the one directory it may write under
    /// bubblewrap; see README)
    #[arg(long = "mount", value_name = "SRC:DST")]
    pub mounts: Vec<String>,
    /// Give the session a git worktree of its own, on branch paddock/<name>
    #[arg(long)]
    pub worktree: bool,
    /// Let an isolated agent use the network (bubblewrap, podman; the host's agents always can)
    #[arg(long)]
    pub network: bool,
    /// A YAML file with any of: task, driver, mounts, worktree, provider, model, name,
    /// max_tokens, timeout, config, env, campaign, and a block per driver (local: {workdir},
    /// bubblewrap: {network}, podman: {image, mounts, ports, flags, env, network, memory, pids},
    /// ssh: {host, port, user, keyFile, knownHosts, acceptNewHostKey, workdir, paddock,
    /// remoteDir})
    #[arg(short = 'c', long = "file", value_name = "session.yaml")]
    pub file: Option<PathBuf>,
    /// scripted, claude-code, codex, openclaw, openai-api, gemini, acp [default:
    /// $PADDOCK_PROVIDER, else the config file's [session] provider, else the first of claude,
    /// codex, gemini found on PATH]
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// Human-readable name [default: <provider>-<short id>]
    #[arg(long)]
    pub name: Option<String>,
    /// Token budget (0 = unlimited)
    #[arg(long)]
    pub max_tokens: Option<i64>,
    /// Session timeout: 90s, 30m, 2h, 1d, or seconds (0 = none)
    #[arg(long, value_parser = super::parse_secs)]
    pub timeout: Option<u64>,
    /// Provider configuration, KEY=VALUE (repeatable)
    #[arg(long = "config", value_parser = super::parse_kv)]
    pub config: Vec<(String, String)>,
    /// Environment for the agent, KEY=VALUE (repeatable)
    #[arg(long = "env", value_parser = super::parse_kv)]
    pub env: Vec<(String, String)>,
    #[arg(long)]
    pub festival: Option<String>,
    #[arg(long)]
    pub task_id: Option<String>,
}

/// A scalar YAML value, kept as text (`max_rounds: 5` and `max_rounds: "5"` alike).
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Scalar {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Text(s) => s.clone(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// `-c session.yaml`. Unknown keys are errors (a typo must not be silently ignored).
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionFile {
    pub task: Option<String>,
    pub driver: Option<String>,
    /// `SRC:DST`, SRC relative to the file's directory.
    pub mounts: Option<Vec<String>>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub name: Option<String>,
    pub max_tokens: Option<i64>,
    /// Seconds.
    pub timeout: Option<u64>,
    pub config: Option<BTreeMap<String, Scalar>>,
    pub env: Option<BTreeMap<String, Scalar>>,
    pub campaign: Option<String>,
    /// A git worktree of its own for the session.
    pub worktree: Option<bool>,
    /// The seed's per-driver blocks: `local: {workdir}`, and paddock's `bubblewrap: {network}`;
    /// the others are read (so a latis file parses) and refused with their driver.
    pub local: Option<LocalBlock>,
    pub bubblewrap: Option<BubblewrapBlock>,
    pub podman: Option<PodmanBlock>,
    pub kubernetes: Option<KubeBlock>,
    pub qemu: Option<QemuBlock>,
    pub ssh: Option<SshBlock>,
}

/// latis' `qemu:` block (`image`, `memory`, `cpus`, `flags`, `ssh: {user, keyFile}`), with
/// paddock's network.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QemuBlock {
    /// A qcow2 image, relative to the file's directory.
    pub image: Option<String>,
    /// `4G`, `512m`, or bytes.
    pub memory: Option<Scalar>,
    pub cpus: Option<u32>,
    /// Raw `qemu-system-x86_64` flags (`-enable-kvm`).
    pub flags: Option<Vec<String>>,
    /// How paddock logs in to the VM: `user`, `keyFile`, and paddock's `port` (the VM's ssh
    /// port, 22), `workdir`, `paddock`, `remoteDir`.
    pub ssh: Option<SshBlock>,
    pub network: Option<bool>,
}

/// latis' `kubernetes:` block (`namespace`, `serviceAccount`, `podSpec`: a core/v1 PodSpec as
/// Kubernetes writes it), with paddock's `kubeconfig` and `context`.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeBlock {
    pub namespace: Option<String>,
    pub service_account: Option<String>,
    pub pod_spec: Option<serde_json::Value>,
    /// Relative to the file's directory; `~/` is this machine's home.
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
}

/// latis' `ssh:` block (`host`, `user`, `keyFile`), with paddock's port, host key checking,
/// working directory and where paddock lives there.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SshBlock {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub user: Option<String>,
    /// Relative to the file's directory; `~/` is this machine's home.
    pub key_file: Option<String>,
    pub known_hosts: Option<String>,
    pub accept_new_host_key: Option<bool>,
    /// The agent's working directory on the host.
    pub workdir: Option<String>,
    /// A paddock already installed there (latis' "assumes latis is already installed").
    pub paddock: Option<String>,
    pub remote_dir: Option<String>,
}

/// `--ssh [USER@]HOST[:PORT]`: (user, host, port).
fn parse_destination(d: &str) -> Result<(String, String, u16)> {
    let (user, rest) = match d.trim().rsplit_once('@') {
        Some((u, r)) => (u.to_string(), r),
        None => (String::new(), d.trim()),
    };
    // `[::1]:2222`: an address with colons is bracketed when a port follows.
    if let Some(inner) = rest.strip_prefix('[') {
        let (h, tail) = inner
            .split_once(']')
            .ok_or_else(|| Error::Usage(format!("--ssh {d:?}: no closing ]")))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| Error::Usage(format!("--ssh {d:?}: {p:?} is not a port")))?,
            None => 0,
        };
        return Ok((user, h.to_string(), port));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (
            h.to_string(),
            p.parse::<u16>()
                .map_err(|_| Error::Usage(format!("--ssh {d:?}: {p:?} is not a port")))?,
        ),
        _ => (rest.to_string(), 0),
    };
    Ok((user, host, port))
}

/// A file path from a flag or a session file: `~/` is the home, a relative one is taken from
/// `base`.
fn local_path(p: &str, base: &Path) -> String {
    match p.strip_prefix("~/") {
        Some(rest) => crate::paths::home().join(rest).display().to_string(),
        None => std::path::absolute(base.join(p))
            .unwrap_or_else(|_| base.join(p))
            .display()
            .to_string(),
    }
}

/// latis' `local:` block: where the agent works (created when missing; relative to the file).
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalBlock {
    pub workdir: Option<String>,
}

/// paddock's `bubblewrap:` block.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BubblewrapBlock {
    /// Network access inside the sandbox.
    pub network: Option<bool>,
    /// `512m`, `2g`, or bytes.
    pub memory: Option<Scalar>,
    pub pids: Option<u32>,
}

/// latis' `podman:` block, with paddock's network and limits.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodmanBlock {
    pub image: Option<String>,
    /// `SRC:DST[:OPTIONS]`, SRC relative to the file's directory.
    pub mounts: Option<Vec<String>>,
    /// `[HOST:]CONTAINER`.
    pub ports: Option<Vec<String>>,
    /// Raw flags for `podman run`.
    pub flags: Option<Vec<String>>,
    /// The container's variables.
    pub env: Option<BTreeMap<String, Scalar>>,
    pub network: Option<bool>,
    /// `512m`, `2g`, or bytes.
    pub memory: Option<Scalar>,
    pub pids: Option<u32>,
}

/// `--memory` and the podman block's `memory:`: a size with a unit (`512m`, `2g`, `1GiB`;
/// `k`, `m`, `g` are powers of 1024, as podman reads them) or bytes.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    // podman's (and docker's) one-letter units are binary; parse-size reads `1GiB` so.
    let binary = match t.char_indices().last() {
        Some((i, c)) if matches!(c.to_ascii_lowercase(), 'k' | 'm' | 'g' | 't') => {
            let head = &t[..i];
            if head.ends_with(|c: char| c.is_ascii_digit() || c == '.' || c == ' ') {
                format!("{t}iB")
            } else {
                t.to_string()
            }
        }
        _ => t.to_string(),
    };
    parse_size::parse_size(&binary).map_err(|e| format!("size {s:?}: {e} (e.g. 512m, 2g)"))
}

/// A path an image names, made absolute from `base` (a reference is left as it is): `./x`,
/// `../x`, `~/x` and anything that exists there are paths.
fn image_path(image: &str, base: &Path) -> String {
    let image = image.trim();
    if let Some(rest) = image.strip_prefix("~/") {
        return crate::paths::home().join(rest).display().to_string();
    }
    let looks_like_path =
        image.starts_with("./") || image.starts_with("../") || image.starts_with('/');
    let p = base.join(image);
    if looks_like_path || (!image.contains(':') && p.exists()) {
        return std::path::absolute(&p).unwrap_or(p).display().to_string();
    }
    image.to_string()
}

/// A podman mount's SRC made absolute from `base` (named volumes are left as they are).
fn podman_mount(m: &str, base: &Path) -> String {
    match m.split_once(':') {
        Some((src, rest)) if src.starts_with('.') || src.starts_with('~') => {
            format!("{}:{rest}", image_path(src, base))
        }
        _ => m.to_string(),
    }
}

impl SessionFile {
    /// The drivers whose block the file has.
    fn driver_blocks(&self) -> Vec<&'static str> {
        [
            ("local", self.local.is_some()),
            ("bubblewrap", self.bubblewrap.is_some()),
            ("podman", self.podman.is_some()),
            ("kubernetes", self.kubernetes.is_some()),
            ("qemu", self.qemu.is_some()),
            ("ssh", self.ssh.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }

    /// `local.workdir` as a directory (made when missing), taken from `file_dir` when relative.
    fn workdir(&self, file_dir: &Path) -> Result<Option<PathBuf>> {
        let Some(dir) = self.local.as_ref().and_then(|l| l.workdir.as_deref()) else {
            return Ok(None);
        };
        let path = match dir.strip_prefix("~/") {
            Some(rest) => crate::paths::home().join(rest),
            None => file_dir.join(dir),
        };
        std::fs::create_dir_all(&path)
            .and_then(|()| std::fs::canonicalize(&path))
            .map(Some)
            .map_err(Error::input(format!("local.workdir {}", path.display())))
    }

    pub fn parse(text: &str, origin: &str) -> Result<SessionFile> {
        if text.trim().is_empty() {
            return Ok(SessionFile::default());
        }
        serde_norway::from_str(text).map_err(|e| Error::Usage(format!("{origin}: {e}")))
    }

    pub fn read(path: &Path) -> Result<SessionFile> {
        use std::io::Read;
        let f = std::fs::File::open(path).map_err(Error::input(path.display()))?;
        let mut text = String::new();
        f.take(SESSION_FILE_MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(Error::input(path.display()))?;
        if text.len() as u64 > SESSION_FILE_MAX_BYTES {
            return Err(Error::Usage(format!(
                "{}: larger than {SESSION_FILE_MAX_BYTES} bytes",
                path.display()
            )));
        }
        SessionFile::parse(&text, &path.display().to_string())
    }
}

/// Where a new session runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A campaign, by id or name (the daemon resolves it).
    Campaign(String),
    /// A directory; the campaign whose root it is, registered if there is none.
    Dir(PathBuf),
    /// A campaign and the directory a mount named: they must be the same.
    Both(String, PathBuf),
}

/// A create request with its place still to be resolved to a campaign id.
#[derive(Debug)]
pub struct Plan {
    pub place: Place,
    pub driver: &'static str,
    /// Everything but `campaign_id`.
    pub request: pb::CreateSessionRequest,
}

/// What `session create` may look at on this machine to pick an agent.
pub struct Host {
    /// `$PADDOCK_PROVIDER`: the provider to use when none is given.
    pub default_provider: Option<String>,
    /// `[session] provider` of the configuration file (after `$PADDOCK_PROVIDER`).
    pub config_provider: Option<String>,
    /// `$PATH` of the CLI (the user's shell).
    pub path: Option<std::ffi::OsString>,
}

impl Host {
    pub fn current() -> Host {
        Host {
            default_provider: std::env::var("PADDOCK_PROVIDER")
                .ok()
                .filter(|p| !p.trim().is_empty()),
            config_provider: None,
            path: std::env::var_os("PATH"),
        }
    }

    fn find(&self, program: &str) -> Option<PathBuf> {
        crate::paths::find_program(program, self.path.as_deref())
    }
}

/// The agent CLIs `session create` looks for when no provider is given, in this order.
const FIRST_FOUND: [(&str, paddock_core::Provider); 3] = [
    ("claude", paddock_core::Provider::ClaudeCode),
    ("codex", paddock_core::Provider::Codex),
    ("gemini", paddock_core::Provider::Gemini),
];

/// Completes a planned request on this machine: with no provider given, `$PADDOCK_PROVIDER`,
/// else the first agent CLI found on the user's PATH (claude, codex, gemini), said on the
/// returned line; never the scripted agent silently. An agent CLI runs with the user's PATH
/// (unless the request sets one), so a CLI the user's shell finds is found by the daemon too,
/// whatever PATH the daemon was started with.
pub fn choose_provider(req: &mut pb::CreateSessionRequest, host: &Host) -> Result<Option<String>> {
    use paddock_core::Provider;
    let mut said = None;
    if req.provider == 0 {
        if let Some(name) = host
            .default_provider
            .as_ref()
            .or(host.config_provider.as_ref())
        {
            req.provider = Provider::from_name(name)
                .ok_or_else(|| Error::unknown_provider(name))?
                .number();
        } else {
            let Some((program, provider, path)) = FIRST_FOUND
                .iter()
                .find_map(|(prog, p)| host.find(prog).map(|path| (prog, p, path)))
            else {
                return Err(Error::Usage(
                    "no --provider given and no agent CLI (claude, codex, gemini) is on PATH: \
                     give --provider (`--provider scripted` runs the built-in scripted agent, no \
                     key needed), install one, or see `paddock doctor`"
                        .into(),
                ));
            };
            req.provider = provider.number();
            said = Some(format!(
                "No --provider given: using {} ({program} found at {}; --provider chooses another).",
                provider.name(),
                path.display()
            ));
        }
    }
    let runs_a_cli = Provider::from_number(req.provider)
        .is_some_and(|p| !matches!(p, Provider::Scripted | Provider::OpenAiApi));
    if runs_a_cli && !req.environment.contains_key("PATH") {
        if let Some(path) = host.path.as_ref().and_then(|p| p.to_str()) {
            req.environment.insert("PATH".into(), path.to_string());
        }
    }
    Ok(said)
}

/// Fills what the flags and the session file left unset from the configuration file's
/// `[session]`, `[agents]` and `[env]` (the provider is [`choose_provider`]'s, via
/// [`Host::config_provider`]).
pub fn apply_config(req: &mut pb::CreateSessionRequest, c: &crate::config::Config) -> Result<()> {
    let s = &c.session;
    if let Some(d) = &s.driver {
        check_driver(d.get_ref())?;
    }
    if req.model.is_empty() {
        if let Some(m) = &s.model {
            req.model = m.get_ref().clone();
        }
    }
    if req.max_tokens == 0 {
        if let Some(n) = &s.max_tokens {
            req.max_tokens = i64::try_from(*n.get_ref()).unwrap_or(i64::MAX);
        }
    }
    if req.timeout.is_none() {
        if let Some(t) = s.timeout_secs.as_ref().filter(|t| *t.get_ref() > 0) {
            req.timeout = Some(prost_types::Duration {
                seconds: i64::try_from(*t.get_ref()).unwrap_or(i64::MAX),
                nanos: 0,
            });
        }
    }
    if let Some(p) = &s.permissions {
        req.provider_config
            .entry("permissions".into())
            .or_insert_with(|| p.get_ref().clone());
    }
    for (k, v) in &c.env {
        req.environment
            .entry(k.clone())
            .or_insert_with(|| v.get_ref().clone());
    }
    Ok(())
}

/// A word before creating a sandboxed session without network whose agent talks to a model
/// over the network (all but the scripted agent, unless pointed elsewhere): its first turn
/// would fail to connect, and the reason would be far from the cause.
pub fn offline_note(req: &pb::CreateSessionRequest) -> Option<String> {
    let env = req.environment_spec.as_ref()?;
    let isolates = paddock_core::Driver::parse(&env.driver).is_some_and(|d| d.isolates());
    let provider = paddock_core::Provider::from_number(req.provider)?;
    (isolates && !env.network && provider != paddock_core::Provider::Scripted).then(|| {
        format!(
            "note: the {} environment has no network, and {} reaches its model over the network: \
             add --network (session.yaml: `{}: {{network: true}}`) unless it needs none",
            env.driver,
            provider.name(),
            env.driver
        )
    })
}

/// A podman image reference this machine does not have yet, pulled before the session is
/// created, with podman's own progress on the terminal (the daemon refuses a reference it
/// does not find: a create never waits on a download no one sees). Archives and root
/// directories need nothing; without podman the daemon's refusal says what to install.
pub fn pull_image(image: &str) -> Result<()> {
    let image = image.trim();
    if image.is_empty() || image.starts_with('/') {
        return Ok(());
    }
    let Some(podman) = crate::paths::find_on_own_path("podman") else {
        return Ok(());
    };
    let quiet = |args: &[&str]| {
        std::process::Command::new(&podman)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if quiet(&["image", "exists", image]) {
        return Ok(());
    }
    eprintln!("pulling image {image} (podman pull)…");
    let pulled = std::process::Command::new(&podman)
        .args(["pull", image])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(Error::io(podman.display()))?;
    if !pulled.success() {
        return Err(Error::Usage(format!(
            "cannot pull image {image} ({pulled}); give an image this machine has (podman \
             images), an image archive or a root directory"
        )));
    }
    Ok(())
}

/// What the default permissions the daemon gave a session mean for its user (nothing for
/// `allow-all`, the default inside a sandbox).
pub fn permissions_note(permissions: &str, provider: &str) -> Option<String> {
    let alone = "--config permissions=allow-all (or [session] permissions in config.toml), or \
                 --driver bubblewrap, lets it work alone";
    if permissions.starts_with("ask") {
        Some(format!(
            "note: on the host, {provider}'s writes and commands wait for your approval \
             (`paddock approvals`, `paddock session attach`); {alone}"
        ))
    } else if permissions == "deny" {
        Some(format!(
            "note: on the host, {provider} runs read-only (it cannot ask anyone before a write or \
             a command); {alone}"
        ))
    } else {
        None
    }
}

/// `[agents]`' command for the request's provider, unless the request names one.
pub fn apply_agent_command(req: &mut pb::CreateSessionRequest, c: &crate::config::Config) {
    let Some(p) = paddock_core::Provider::from_number(req.provider) else {
        return;
    };
    if let Some(cmd) = c.agents.get(p.name()) {
        req.provider_config
            .entry("command".into())
            .or_insert_with(|| cmd.get_ref().clone());
    }
}

/// Merges the flags over the file (`file_dir`: the file's directory, for its relative
/// mounts; `cwd`: for the flags' relative mounts and the default place).
pub fn plan(args: CreateArgs, file: Option<(SessionFile, PathBuf)>, cwd: &Path) -> Result<Plan> {
    let from_file = file.is_some();
    let (f, file_dir) = file.unwrap_or_else(|| (SessionFile::default(), cwd.to_path_buf()));
    let driver = check_driver(
        args.driver
            .as_deref()
            .or(f.driver.as_deref())
            .or(args.ssh.as_ref().map(|_| "ssh"))
            .unwrap_or(DRIVERS[0]),
    )?;
    // A block for another driver than the one chosen is a mistake, not a setting to drop.
    if let Some(other) = f.driver_blocks().into_iter().find(|b| *b != driver) {
        return Err(Error::Usage(format!(
            "the session file has a `{other}:` block, but the session's driver is {driver}"
        )));
    }
    let names_workdir = f.local.as_ref().is_some_and(|l| l.workdir.is_some());
    if names_workdir && (f.mounts.is_some() || !args.mounts.is_empty()) {
        return Err(Error::Usage(
            "local.workdir and mounts both name the working directory: give one".into(),
        ));
    }
    // Made only once the file is known to be consistent.
    let workdir = f.workdir(&file_dir)?;
    let mounts: Vec<PathBuf> = if !args.mounts.is_empty() {
        args.mounts
            .iter()
            .map(|m| parse_mount(m, cwd))
            .collect::<Result<_>>()?
    } else if let Some(dir) = workdir {
        vec![dir]
    } else {
        f.mounts
            .iter()
            .flatten()
            .map(|m| parse_mount(m, &file_dir))
            .collect::<Result<_>>()?
    };
    if mounts.len() > 1 {
        return Err(Error::Usage(format!(
            "{} mounts given: a session has one workspace (SRC:{WORKSPACE}), its working \
             directory; under bubblewrap it is the one directory the agent may write",
            mounts.len()
        )));
    }
    let task = args.task.or(f.task).unwrap_or_default();
    let campaign = args
        .campaign
        .or(f.campaign)
        .filter(|c| !c.trim().is_empty());
    let place = match (campaign, mounts.into_iter().next()) {
        (Some(c), Some(dir)) => Place::Both(c, dir),
        (Some(c), None) => Place::Campaign(c),
        (None, Some(dir)) => Place::Dir(dir),
        (None, None) if from_file || !task.trim().is_empty() => {
            Place::Dir(std::fs::canonicalize(cwd).map_err(Error::io(format!(
                "the current directory {}",
                cwd.display()
            )))?)
        }
        (None, None) => {
            return Err(Error::Usage(
                "--campaign is required, unless --task, --mount or -c is given (then \
                 the session runs in the current directory)"
                    .into(),
            ))
        }
    };
    // None given: chosen by [`choose_provider`] from what this machine has (0 until then).
    let provider = match args.provider.or(f.provider) {
        Some(name) => match paddock_core::Provider::from_name(&name) {
            Some(p) => p.number(),
            None => return Err(Error::unknown_provider(&name)),
        },
        None => 0,
    };
    let max_tokens = args.max_tokens.or(f.max_tokens).unwrap_or(0);
    if max_tokens < 0 {
        return Err(Error::Usage(format!(
            "max_tokens must be 0 or more, not {max_tokens}"
        )));
    }
    let timeout = args.timeout.or(f.timeout).unwrap_or(0);
    let timeout_secs = i64::try_from(timeout)
        .map_err(|_| Error::Usage(format!("timeout {timeout} is too large")))?;
    let merge = |file: Option<BTreeMap<String, Scalar>>, flags: Vec<(String, String)>| {
        let mut m: BTreeMap<String, String> = file
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.text()))
            .collect();
        m.extend(flags);
        m
    };
    let qemu = f.qemu.unwrap_or_default();
    let ssh = {
        let b = f.ssh.as_ref().or(qemu.ssh.as_ref());
        let mut t = pb::SshTarget {
            host: b.and_then(|b| b.host.clone()).unwrap_or_default(),
            port: b.and_then(|b| b.port).map(u32::from).unwrap_or(0),
            user: b.and_then(|b| b.user.clone()).unwrap_or_default(),
            key_file: b
                .and_then(|b| b.key_file.as_deref())
                .map(|k| local_path(k, &file_dir))
                .unwrap_or_default(),
            known_hosts: b
                .and_then(|b| b.known_hosts.as_deref())
                .map(|k| local_path(k, &file_dir))
                .unwrap_or_default(),
            accept_new_host_key: b.and_then(|b| b.accept_new_host_key).unwrap_or(false),
            paddock: b.and_then(|b| b.paddock.clone()).unwrap_or_default(),
            remote_dir: b.and_then(|b| b.remote_dir.clone()).unwrap_or_default(),
            workdir: b.and_then(|b| b.workdir.clone()).unwrap_or_default(),
        };
        if let Some(d) = &args.ssh {
            let (user, host, port) = parse_destination(d)?;
            t.host = host;
            if !user.is_empty() {
                t.user = user;
            }
            if port > 0 {
                t.port = u32::from(port);
            }
        }
        if let Some(k) = &args.ssh_key {
            t.key_file = local_path(&k.display().to_string(), cwd);
        }
        if let Some(w) = &args.ssh_workdir {
            t.workdir = w.clone();
        }
        (t != pb::SshTarget::default()).then_some(t)
    };
    let kubernetes = match f.kubernetes {
        None if driver != "kubernetes"
            && args.namespace.is_none()
            && args.kube_context.is_none() =>
        {
            None
        }
        k => {
            let k = k.unwrap_or_default();
            Some(pb::KubernetesOptions {
                namespace: args.namespace.or(k.namespace).unwrap_or_default(),
                service_account: k.service_account.unwrap_or_default(),
                pod_spec_json: match k.pod_spec {
                    Some(spec) if !spec.is_object() => {
                        return Err(Error::Usage(
                            "the kubernetes block's podSpec must be a mapping (a PodSpec: \
                             containers, volumes, …)"
                                .into(),
                        ))
                    }
                    Some(spec) => spec.to_string(),
                    None => String::new(),
                },
                // The kubeconfig this command sees (KUBECONFIG), unless the file names one: the
                // daemon (started elsewhere, by systemd) may see another.
                kubeconfig: k
                    .kubeconfig
                    .map(|p| local_path(&p, &file_dir))
                    .or_else(|| {
                        let list = std::env::var("KUBECONFIG").ok()?;
                        let files: Vec<String> = list
                            .split(':')
                            .filter(|f| !f.is_empty())
                            .map(|f| local_path(f, cwd))
                            .collect();
                        Some(files.join(":"))
                    })
                    .unwrap_or_default(),
                context: args.kube_context.or(k.context).unwrap_or_default(),
            })
        }
    };
    let pod = f.podman.unwrap_or_default();
    let bw = f.bubblewrap.as_ref().map(|b| (b.memory.clone(), b.pids));
    let bw = BubblewrapBlock {
        network: None,
        memory: bw.as_ref().and_then(|b| b.0.clone()),
        pids: bw.and_then(|b| b.1),
    };
    let request = pb::CreateSessionRequest {
        campaign_id: String::new(),
        provider,
        model: args.model.or(f.model).unwrap_or_default(),
        agent_name: args.name.or(f.name).unwrap_or_default(),
        festival_id: args.festival.unwrap_or_default(),
        task_id: args.task_id.unwrap_or_default(),
        provider_config: merge(f.config, args.config),
        environment: merge(f.env, args.env),
        max_tokens,
        timeout: (timeout_secs > 0).then_some(prost_types::Duration {
            seconds: timeout_secs,
            nanos: 0,
        }),
        initial_message: task,
        environment_spec: Some(pb::SessionEnvironment {
            driver: driver.to_string(),
            worktree: args.worktree || f.worktree.unwrap_or(false),
            network: args.network
                || f.bubblewrap
                    .as_ref()
                    .and_then(|b| b.network)
                    .or(pod.network)
                    .or(qemu.network)
                    .unwrap_or(false),
            image: args
                .image
                .map(|i| image_path(&i, cwd))
                .or(pod.image.as_ref().map(|i| image_path(i, &file_dir)))
                .or(qemu.image.as_ref().map(|i| image_path(i, &file_dir)))
                .unwrap_or_default(),
            memory_bytes: match args.memory {
                Some(m) => m,
                None => match pod
                    .memory
                    .as_ref()
                    .or(bw.memory.as_ref())
                    .or(qemu.memory.as_ref())
                {
                    Some(m) => parse_bytes(&m.text()).map_err(Error::Usage)?,
                    None => 0,
                },
            },
            pids_limit: args.pids.or(pod.pids).or(bw.pids).unwrap_or(0),
            mounts: pod
                .mounts
                .iter()
                .flatten()
                .map(|m| podman_mount(m, &file_dir))
                .collect(),
            ports: pod.ports.clone().unwrap_or_default(),
            flags: pod.flags.clone().unwrap_or_default(),
            env: pod
                .env
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.text()))
                .collect(),
            ssh,
            qemu: (qemu.cpus.is_some() || qemu.flags.is_some()).then(|| pb::QemuOptions {
                cpus: qemu.cpus.unwrap_or(0),
                flags: qemu.flags.clone().unwrap_or_default(),
            }),
            kubernetes,
        }),
    };
    // What no driver could honour is refused here, before a campaign is registered for it:
    // the daemon checks the same again.
    crate::env::request::env_spec(request.environment_spec.as_ref())
        .map_err(|e| Error::Usage(e.to_string()))?;
    Ok(Plan {
        place,
        driver,
        request,
    })
}

/// The campaign a session is created in, and whether it was registered for it.
pub struct Resolved {
    pub id: String,
    /// The campaign registered for this create (its root and name), if one was.
    registered: Option<(String, String)>,
}

impl Resolved {
    /// A campaign that was there before this create.
    fn existing(id: String) -> Resolved {
        Resolved {
            id,
            registered: None,
        }
    }

    /// The create went through: the campaign registered for it is said.
    pub fn keep(self) {
        if let Some((root, name)) = self.registered {
            eprintln!("paddock: registered {root} as campaign \"{name}\"");
        }
    }

    /// The create was refused: a campaign registered for it is removed again (a refused
    /// create leaves nothing behind; the daemon refuses the removal if a session of another
    /// client's has come into it meanwhile).
    pub async fn undo(self, c: &mut Client) {
        if self.registered.is_some() {
            let _ = c
                .remove_campaign(pb::RemoveCampaignRequest { campaign: self.id })
                .await;
        }
    }
}

/// The campaign whose root is `dir`, registering one (named after the directory, with `-2`,
/// `-3`, … when that name is taken) if none is.
pub async fn campaign_for_dir(c: &mut Client, dir: &Path) -> Result<Resolved> {
    let root = dir.display().to_string();
    let known = c
        .list_campaigns(pb::ListCampaignsRequest {})
        .await?
        .into_inner()
        .campaigns;
    if let Some(found) = known.iter().find(|k| k.root_path == root) {
        return Ok(Resolved::existing(found.id.clone()));
    }
    // AddCampaign without a name: the daemon finds or registers "the campaign of this
    // directory" (one way for every client, sunbeam's included).
    let k = c
        .add_campaign(pb::AddCampaignRequest {
            name: String::new(),
            root_path: root.clone(),
        })
        .await?
        .into_inner();
    let registered = (!known.iter().any(|x| x.id == k.id)).then(|| (root, k.name.clone()));
    Ok(Resolved {
        id: k.id,
        registered,
    })
}

/// The campaign a plan's place comes to.
pub async fn resolve_place(c: &mut Client, place: &Place) -> Result<Resolved> {
    match place {
        Place::Campaign(name) => Ok(Resolved::existing(name.clone())),
        Place::Dir(dir) => campaign_for_dir(c, dir).await,
        Place::Both(name, dir) => {
            let list = c
                .list_campaigns(pb::ListCampaignsRequest {})
                .await?
                .into_inner()
                .campaigns;
            let Some(k) = list.iter().find(|k| k.id == *name || k.name == *name) else {
                return Err(Error::refused(
                    paddock_core::ErrorCode::CampaignNotFound,
                    format!("campaign \"{name}\" not found"),
                ));
            };
            if Path::new(&k.root_path) != dir {
                return Err(Error::Usage(format!(
                    "the mount's SRC {} is not campaign \"{}\"'s root {}: under the local \
                     driver a mount names the working directory, and a campaign has one; give \
                     one of the two",
                    dir.display(),
                    k.name,
                    k.root_path
                )));
            }
            Ok(Resolved::existing(k.id.clone()))
        }
    }
}

/// `session status`'s driver line: the driver, and in parentheses what it means, its
/// environment's state when not ready, and where the agent works.
fn driver_line(s: &pb::SessionInfo) -> String {
    let env = s.environment_spec.clone().unwrap_or_default();
    let mut parts = vec![match driver_of(s) {
        "bubblewrap" => format!(
            "sandbox: host read-only, own HOME and /tmp, {}",
            if env.network { "network" } else { "no network" }
        ),
        "local" => "no isolation".to_string(),
        "podman" => format!(
            "container paddock-{} from {}, {}",
            s.id,
            env.image,
            if env.network { "network" } else { "no network" }
        ),
        "qemu" => format!(
            "VM from {}, {} MiB, {} cpu(s), {}",
            env.image,
            if env.memory_bytes > 0 {
                env.memory_bytes >> 20
            } else {
                1024
            },
            env.qemu.as_ref().map_or(1, |q| q.cpus.max(1)),
            if env.network { "network" } else { "no network" }
        ),
        "ssh" => {
            let t = env.ssh.clone().unwrap_or_default();
            let mut host = t.host.clone();
            if !t.user.is_empty() {
                host = format!("{}@{host}", t.user);
            }
            if t.port > 0 {
                host = format!("{host}:{}", t.port);
            }
            format!(
                "on {host}, in {} there",
                if t.workdir.is_empty() {
                    "the home directory"
                } else {
                    &t.workdir
                }
            )
        }
        "kubernetes" => {
            let k = env.kubernetes.clone().unwrap_or_default();
            let mut at = if k.namespace.is_empty() {
                "the context's namespace".to_string()
            } else {
                format!("namespace {}", k.namespace)
            };
            if !k.context.is_empty() {
                at += &format!(" of context {}", k.context);
            }
            format!(
                "pod {} in {at}, {}",
                crate::env::kube::pod_name(&paddock_core::SessionId(s.id.clone())),
                if env.image.is_empty() {
                    "from its podSpec".to_string()
                } else {
                    format!("from {}", env.image)
                }
            )
        }
        _ => String::new(),
    }];
    if env.memory_bytes > 0 && driver_of(s) != "qemu" {
        parts.push(format!("memory {} MiB", env.memory_bytes >> 20));
    }
    if env.pids_limit > 0 {
        parts.push(format!("at most {} processes", env.pids_limit));
    }
    if env.worktree {
        parts.push(format!(
            "own worktree of {} on branch {}",
            s.working_dir,
            worktree_branch(s)
        ));
    }
    if !matches!(s.environment_state.as_str(), "" | "ready") {
        parts.push(format!("environment {}", s.environment_state));
    }
    if matches!(driver_of(s), "ssh" | "qemu") {
        // The campaign's directory is this machine's; the agent works on the other one.
        parts.push(format!("campaign directory {} here", s.working_dir));
    } else if !env.worktree {
        parts.push(format!("working directory {}", s.working_dir));
    }
    parts.retain(|p| !p.is_empty());
    format!("{} ({})", driver_of(s), parts.join("; "))
}

/// Where a session's agent works, as `session create` says it: its working directory, or for
/// a session with a worktree, that it works in a worktree of it on its own branch, not in the
/// directory itself (`session diff` shows what it changed).
pub fn where_it_works(s: &pb::SessionInfo) -> String {
    if s.environment_spec.as_ref().is_some_and(|e| e.worktree) {
        format!(
            "its own worktree of {} on branch {} (`paddock session diff` shows its changes)",
            s.working_dir,
            worktree_branch(s)
        )
    } else {
        s.working_dir.clone()
    }
}

/// The branch a session's worktree is on (the environments crate names it).
fn worktree_branch(s: &pb::SessionInfo) -> String {
    crate::env::branch(&s.agent_name, &paddock_core::SessionId(s.id.clone()))
}

/// `session status`: the session's details, latis state first, as `key: value` lines.
pub fn status_lines(s: &pb::SessionInfo, now_ms: u64) -> Vec<(String, String)> {
    use super::view::{rfc3339, status_name};
    let at = |t: &Option<prost_types::Timestamp>| match t {
        Some(t) => format!(
            "{} ({} ago)",
            rfc3339(t.seconds, t.nanos),
            age(&Some(*t), now_ms)
        ),
        None => "-".into(),
    };
    let mut out = vec![
        (
            "state".to_string(),
            format!(
                "{} (status {}, {} turn(s) completed{})",
                state_of(s),
                status_name(s.status),
                s.turns_completed,
                if s.last_turn_failed
                    && Status::from_number(s.status).is_none_or(|x| x != Status::Failed)
                {
                    ", the last one failed: `session logs` shows why"
                } else {
                    ""
                }
            ),
        ),
        (
            "task".into(),
            if s.initial_message.trim().is_empty() {
                "-".into()
            } else {
                s.initial_message.trim_end().replace('\n', "\n      ")
            },
        ),
        ("driver".into(), driver_line(s)),
        ("name".into(), s.agent_name.clone()),
        (
            "provider".into(),
            if s.model.is_empty() {
                provider_name(s.provider).to_string()
            } else {
                format!("{} (model {})", provider_name(s.provider), s.model)
            },
        ),
        ("campaign".into(), s.campaign_id.clone()),
        (
            "tokens".into(),
            format!(
                "{} in / {} out{}",
                s.tokens_input,
                s.tokens_output,
                if s.max_tokens > 0 {
                    format!(" (budget {})", s.max_tokens)
                } else {
                    String::new()
                }
            ),
        ),
        ("created".into(), at(&s.created_at)),
        ("started".into(), at(&s.started_at)),
        ("last activity".into(), at(&s.last_activity_at)),
    ];
    if s.ended_at.is_some() {
        out.push(("ended".into(), at(&s.ended_at)));
    }
    if s.restart_count > 0 {
        out.push(("restarts".into(), s.restart_count.to_string()));
    }
    if s.pid > 0 {
        out.push(("pid".into(), s.pid.to_string()));
    }
    if !Status::from_number(s.status).is_some_and(Status::is_terminal) {
        out.push((
            "pending approvals".into(),
            if s.pending_approvals > 0 {
                format!(
                    "{} (answer in `paddock session attach {}` or with `paddock approvals`)",
                    s.pending_approvals, s.id
                )
            } else {
                "0".into()
            },
        ));
    }
    if s.disconnected {
        let at = out
            .iter()
            .position(|(k, _)| k == "driver")
            .map_or(out.len(), |i| i + 1);
        out.insert(
            at,
            (
                "connection".into(),
                "lost: the agent works on there while paddock reconnects".into(),
            ),
        );
    }
    if !s.error_message.is_empty() {
        out.push(("error".into(), s.error_message.clone()));
    }
    out
}

/// `session delete`: a live session is force-stopped first (its agent's whole process group
/// goes), then DeleteSession removes it and every row stored about it.
/// On a terminal (and without `--yes`), asks `question` and reads y/yes; anywhere else (a
/// script, a pipe) the answer is yes, as before.
pub fn confirm(question: &str, yes: bool) -> Result<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if yes || !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    // On stderr: stdout stays the command's output (JSON with --json).
    eprint!("{question} [y/N] ");
    std::io::stderr()
        .flush()
        .map_err(Error::io("standard error"))?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(Error::io("standard input"))?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// Deletes a session, stopping it first (at once) if it is live; whether it had to be stopped.
pub async fn stop_and_delete(c: &mut Client, info: &pb::SessionInfo) -> Result<bool> {
    let id = &info.id;
    let mut stopped = false;
    if !Status::from_number(info.status).is_some_and(Status::is_terminal) {
        match c
            .stop_session(pb::StopSessionRequest {
                session_id: id.to_string(),
                graceful: false,
            })
            .await
        {
            Ok(_) => stopped = true,
            // It ended on its own meanwhile.
            Err(e) if obey_code(&e) == Some(ErrorCode::AlreadyStopped) => {}
            Err(source) => {
                return Err(Error::Step {
                    step: format!("cannot stop session {id} to delete it"),
                    source,
                })
            }
        }
    }
    c.delete_session(pb::DeleteSessionRequest {
        session_id: id.to_string(),
    })
    .await?;
    Ok(stopped)
}

pub async fn delete(
    ctx: &super::Ctx,
    c: &mut Client,
    id: &str,
    yes: bool,
    delete_branch: bool,
) -> Result<()> {
    let info = c
        .get_session(pb::GetSessionRequest {
            session_id: id.to_string(),
        })
        .await?
        .into_inner();
    let what = format!(
        "Delete session {id} ({}, {}) and everything stored about it?",
        state_of(&info),
        info.agent_name
    );
    if !confirm(&what, yes)? {
        outln!("Nothing deleted.")?;
        return Ok(());
    }
    let has_worktree = info.environment_spec.as_ref().is_some_and(|e| e.worktree);
    if delete_branch && !has_worktree {
        return Err(Error::Usage(format!(
            "session {id} has no worktree, so no branch of its own to delete"
        )));
    }
    let stopped = stop_and_delete(c, &info).await?;
    // The daemon removed the worktree with the session; its branch goes only when asked.
    // The session is gone whatever becomes of its branch: a branch git will not delete is a
    // warning, not a failed delete.
    let branch = if delete_branch {
        match super::workspace::delete_branch(&info) {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("warning: session {id} was deleted, but not its branch: {e}");
                None
            }
        }
    } else {
        None
    };
    if ctx.json {
        let mut v = serde_json::json!({ "id": id, "deleted": true, "stopped": stopped });
        if let Some(b) = &branch {
            v["deleted_branch"] = b.as_str().into();
        }
        super::print_json(&v)?;
    } else {
        if stopped {
            outln!("Session {id} stopped.")?;
        }
        outln!("Session {id} deleted.")?;
        if let Some(b) = branch {
            outln!("Branch {b} deleted.")?;
        } else if has_worktree {
            outln!(
                "Its branch {} is kept (--delete-branch removes it).",
                crate::env::branch(&info.agent_name, &paddock_core::SessionId(id.to_string()))
            )?;
        }
    }
    Ok(())
}

/// Whether `session prune` takes a session in latis state `state`: latis prunes "completed"
/// sessions — `complete` (its task finished, successfully or not: `failed`) and `stopped` —
/// and leaves those not done (`ready`, `working`, `waiting`, …).
pub fn prunable(state: &str) -> bool {
    matches!(state, "complete" | "failed" | "stopped")
}

/// `session prune`: deletes every finished session (complete, failed or stopped; of one
/// campaign, if given), a live one stopped first, and says which. A session restarted (or
/// deleted) by someone else between the list and its delete is skipped, and said so.
pub async fn prune(
    ctx: &super::Ctx,
    c: &mut Client,
    campaign: Option<String>,
    yes: bool,
) -> Result<()> {
    let list: Vec<pb::SessionInfo> = super::list_sessions(
        c,
        pb::ListSessionsRequest {
            campaign_id: campaign.unwrap_or_default(),
            include_terminated: true,
            view: pb::SessionView::Basic.into(),
            ..Default::default()
        },
    )
    .await?
    .into_iter()
    .filter(|s| prunable(state_of(s)))
    .collect();
    let live = list
        .iter()
        .filter(|s| !Status::from_number(s.status).is_some_and(Status::is_terminal))
        .count();
    let question = match live {
        0 => format!(
            "Delete {} finished session(s) and everything stored about them?",
            list.len()
        ),
        n => format!(
            "Delete {} finished session(s) ({n} still running: stopped first) and everything \
             stored about them?",
            list.len()
        ),
    };
    if !list.is_empty() && !confirm(&question, yes)? {
        outln!("Nothing deleted.")?;
        return Ok(());
    }
    let (mut deleted, mut skipped, mut failed) = (Vec::new(), Vec::new(), 0);
    for s in &list {
        // Looked at again just before: one that started working meanwhile is not finished.
        let now = c
            .get_session(pb::GetSessionRequest {
                session_id: s.id.clone(),
            })
            .await
            .map(|r| r.into_inner());
        let s = match now {
            Ok(now) if prunable(state_of(&now)) => now,
            Ok(now) => {
                let reason = format!("it is {} now", state_of(&now));
                if !ctx.json {
                    outln!("Skipped {}: {reason}", s.id)?;
                }
                skipped.push(serde_json::json!({ "id": s.id, "reason": reason }));
                continue;
            }
            Err(_) => s.clone(), // gone or unreadable: the delete below says which
        };
        let s = &s;
        let gone = match stop_and_delete(c, s).await {
            Ok(_) => Ok(()),
            Err(Error::Daemon(e)) => Err(e),
            Err(Error::Step { source, .. }) => Err(source),
            Err(e) => {
                eprintln!("error: session {}: {e}", s.id);
                failed += 1;
                continue;
            }
        };
        match gone {
            Ok(_) => {
                if !ctx.json {
                    outln!(
                        "Deleted {} ({}, {})",
                        s.id,
                        state_of(s),
                        if s.initial_message.trim().is_empty() {
                            "no task".to_string()
                        } else {
                            one_line(&s.initial_message, TASK_CELL_MAX_CHARS)
                        }
                    )?;
                }
                deleted.push(s.id.clone());
            }
            // Restarted (or deleted) by someone else meanwhile: not ours to prune any more.
            Err(e)
                if matches!(
                    obey_code(&e),
                    Some(ErrorCode::WrongState | ErrorCode::SessionNotFound)
                ) =>
            {
                if !ctx.json {
                    outln!("Skipped {}: {}", s.id, e.message())?;
                }
                skipped.push(serde_json::json!({ "id": s.id, "reason": e.message() }));
            }
            Err(e) => {
                eprintln!("error: session {}: {}", s.id, e.message());
                failed += 1;
            }
        }
    }
    if ctx.json {
        super::print_json(&serde_json::json!({ "deleted": deleted, "skipped": skipped }))?;
    } else if deleted.is_empty() && skipped.is_empty() && failed == 0 {
        outln!("No finished sessions to prune.")?;
    } else {
        outln!("Pruned {} session(s).", deleted.len())?;
    }
    // Each failed delete has been said on stderr.
    if failed > 0 {
        return Err(Error::Reported);
    }
    Ok(())
}

/// Renders [`status_lines`] under a `Session <id> - <state>` header.
pub fn status_text(s: &pb::SessionInfo, now_ms: u64) -> String {
    let lines = status_lines(s, now_ms);
    let w = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = format!("Session {} - {}", s.id, state_of(s));
    for (k, v) in lines {
        out.push_str(&format!("\n  {:<w$} {v}", format!("{k}:")));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_podman_reads_them() {
        use super::parse_bytes;
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("lots").is_err());
    }

    use super::*;

    #[test]
    fn a_sandbox_without_network_is_pointed_out_for_agents_that_need_one() {
        let req = |driver: &str, network: bool, provider: paddock_core::Provider| {
            pb::CreateSessionRequest {
                provider: provider.number(),
                environment_spec: Some(pb::SessionEnvironment {
                    driver: driver.into(),
                    network,
                    ..Default::default()
                }),
                ..Default::default()
            }
        };
        use paddock_core::Provider as P;
        let note = offline_note(&req("bubblewrap", false, P::ClaudeCode)).unwrap();
        assert!(note.contains("add --network"), "{note}");
        assert!(offline_note(&req("bubblewrap", true, P::ClaudeCode)).is_none());
        assert!(offline_note(&req("bubblewrap", false, P::Scripted)).is_none());
        assert!(offline_note(&req("local", false, P::Codex)).is_none());
    }

    #[test]
    fn every_status_has_its_latis_state() {
        use crate::view::latis_state;
        let cases = [
            (Status::Created, 0, false, "creating"),
            (Status::Starting, 0, false, "starting"),
            (Status::Working, 0, false, "working"),
            (Status::Working, 3, true, "working"),
            (Status::Waiting, 1, false, "waiting"),
            (Status::Running, 0, false, "ready"),
            (Status::Running, 1, false, "complete"),
            (Status::Running, 7, false, "complete"),
            // A live session whose task failed is not complete (UX review B2).
            (Status::Running, 1, true, "failed"),
            (Status::Stopping, 2, false, "stopping"),
            (Status::Stopped, 0, false, "stopped"),
            (Status::Stopped, 5, true, "stopped"),
            (Status::Failed, 0, false, "failed"),
            (Status::Failed, 2, false, "failed"),
        ];
        for (status, turns, failed, want) in cases {
            assert_eq!(
                latis_state(status, turns, failed),
                want,
                "{status:?} after {turns} (last failed: {failed})"
            );
        }
        // Every status is covered above.
        for st in Status::ALL {
            assert!(cases.iter().any(|(s, _, _, _)| *s == st), "{st:?}");
        }
        let info = pb::SessionInfo {
            status: 99,
            ..Default::default()
        };
        assert_eq!(state_of(&info), "unknown");
    }

    #[test]
    fn tasks_fit_one_cell() {
        assert_eq!(
            one_line("Fix the failing tests", 40),
            "Fix the failing tests"
        );
        assert_eq!(one_line("  two\nlines\t here ", 40), "two lines here");
        let long = "Refactor the authentication module so that it uses the new token store";
        let cell = one_line(long, 24);
        assert_eq!(cell, "Refactor the authentica…");
        assert!(cell.chars().count() <= 24);
        assert_eq!(one_line("ééééé", 3), "éé…");
    }

    #[test]
    fn drivers_other_than_local_are_clear_errors() {
        assert_eq!(check_driver("local").unwrap(), "local");
        assert_eq!(check_driver("LOCAL").unwrap(), "local");
        assert_eq!(check_driver("Podman").unwrap(), "podman");
        assert!(check_driver("docker")
            .unwrap_err()
            .to_string()
            .contains("--driver podman"));
        assert_eq!(check_driver("ssh").unwrap(), "ssh");
        assert_eq!(check_driver("qemu").unwrap(), "qemu");
        assert_eq!(check_driver("kubernetes").unwrap(), "kubernetes");
        assert_eq!(check_driver("k8s").unwrap(), "kubernetes");
        let e = check_driver("banana").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown driver \"banana\"; the drivers are: local"),
            "{e}"
        );
    }

    #[test]
    fn a_mount_names_the_working_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(base.join("repo")).unwrap();
        std::fs::write(base.join("file"), "x").unwrap();
        for dst in ["/workspace", "/workspace/", ".", "./"] {
            assert_eq!(
                parse_mount(&format!("repo:{dst}"), &base).unwrap(),
                base.join("repo"),
                "{dst}"
            );
        }
        let abs = format!("{}:/workspace", base.join("repo").display());
        assert_eq!(
            parse_mount(&abs, Path::new("/")).unwrap(),
            base.join("repo")
        );
        let e = parse_mount("repo:/src", &base).unwrap_err().to_string();
        assert!(
            e.contains("destination \"/src\" is not /workspace")
                && e.contains("does not isolate the filesystem"),
            "{e}"
        );
        let e = parse_mount("repo:/workspace:Z", &base)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mount options are not supported"), "{e}");
        assert!(parse_mount("repo", &base)
            .unwrap_err()
            .to_string()
            .contains("expected SRC:DST"));
        assert!(parse_mount(":/workspace", &base)
            .unwrap_err()
            .to_string()
            .contains("SRC is empty"));
        assert!(parse_mount("nope:/workspace", &base)
            .unwrap_err()
            .to_string()
            .contains("nope"));
        assert!(parse_mount("file:/workspace", &base)
            .unwrap_err()
            .to_string()
            .contains("is not a directory"));
    }

    #[test]
    fn session_files_parse_strictly() {
        let f = SessionFile::parse(
            "task: Fix the tests\ndriver: local\nmounts: [\"./repo:/workspace\"]\n\
             provider: scripted\nmodel: m\nname: fixer\nmax_tokens: 500\ntimeout: 60\n\
             config:\n  script: s.json\n  rounds: 5\n  verbose: true\nenv:\n  A: b\n\
             campaign: proj\n",
            "session.yaml",
        )
        .unwrap();
        assert_eq!(f.task.as_deref(), Some("Fix the tests"));
        assert_eq!(f.mounts, Some(vec!["./repo:/workspace".to_string()]));
        assert_eq!(f.max_tokens, Some(500));
        let cfg = f.config.unwrap();
        assert_eq!(cfg["rounds"].text(), "5");
        assert_eq!(cfg["verbose"].text(), "true");
        assert_eq!(cfg["script"].text(), "s.json");
        assert_eq!(
            SessionFile::parse("\n", "x").unwrap(),
            SessionFile::default()
        );
        let e = SessionFile::parse("task: x\nimage: fedora\n", "session.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("session.yaml: unknown field `image`") && e.contains("expected one of"),
            "{e}"
        );
        let e = SessionFile::parse("timeout: soon\n", "s.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.yaml: timeout: invalid type"), "{e}");
    }

    fn args() -> CreateArgs {
        CreateArgs::default()
    }

    #[test]
    fn the_seeds_per_driver_blocks_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(tmp.path()).unwrap();
        // latis' local block: the working directory, made when missing, relative to the file.
        let f = SessionFile::parse(
            "task: Fix it\ndriver: local\nlocal:\n  workdir: ./ws\n",
            "session.yaml",
        )
        .unwrap();
        let p = plan(args(), Some((f, cwd.clone())), &cwd).unwrap();
        assert_eq!(p.place, Place::Dir(cwd.join("ws")));
        assert!(cwd.join("ws").is_dir());
        // The seed's podman file: every field reaches the request, paths made absolute.
        let podman = "driver: podman\npodman:\n  image: ghcr.io/x/ws:latest\n  mounts:\n    - \
                      ./repo:/workspace:Z\n  ports:\n    - \"4433\"\n  flags:\n    - \
                      \"--userns=keep-id\"\n  env:\n    A: b\n  memory: 1g\n  pids: 99\n";
        let f = SessionFile::parse(podman, "session.yaml").unwrap();
        let p = plan(args(), Some((f, cwd.clone())), &cwd).unwrap();
        let e = p.request.environment_spec.unwrap();
        assert_eq!(e.driver, "podman");
        assert_eq!(e.image, "ghcr.io/x/ws:latest");
        assert_eq!(
            e.mounts,
            vec![format!("{}:/workspace:Z", cwd.join("repo").display())]
        );
        assert_eq!(e.ports, vec!["4433".to_string()]);
        assert_eq!(e.flags, vec!["--userns=keep-id".to_string()]);
        assert_eq!(e.env.get("A").map(String::as_str), Some("b"));
        assert_eq!((e.memory_bytes, e.pids_limit), (1 << 30, 99));
        // latis' ssh block, with paddock's keys; a key file relative to the file's directory.
        let f = SessionFile::parse(
            "driver: ssh\nssh:\n  host: dev-server.example.com\n  user: latis\n  \
             keyFile: keys/id_ed25519\n  port: 2222\n  workdir: /srv/repo\n  \
             acceptNewHostKey: true\n",
            "s.yaml",
        )
        .unwrap();
        let p = plan(args(), Some((f, cwd.join("conf"))), &cwd).unwrap();
        assert_eq!(p.driver, "ssh");
        let t = p.request.environment_spec.unwrap().ssh.unwrap();
        assert_eq!(
            (t.host.as_str(), t.user.as_str(), t.port, t.workdir.as_str()),
            ("dev-server.example.com", "latis", 2222, "/srv/repo")
        );
        assert_eq!(
            t.key_file,
            cwd.join("conf/keys/id_ed25519").display().to_string()
        );
        assert!(t.accept_new_host_key && t.known_hosts.is_empty());
        // latis' qemu block: the image relative to the file, memory with a unit, the VM's login.
        std::fs::create_dir_all(cwd.join("conf")).unwrap();
        std::fs::write(cwd.join("conf/dev.qcow2"), "").unwrap();
        let f = SessionFile::parse(
            "driver: qemu\nqemu:\n  image: dev.qcow2\n  memory: 4G\n  cpus: 2\n  flags:\n    \
             - \"-enable-kvm\"\n  ssh:\n    user: latis\n    keyFile: k\n",
            "s.yaml",
        )
        .unwrap();
        let p = plan(args(), Some((f, cwd.join("conf"))), &cwd).unwrap();
        assert_eq!(p.driver, "qemu");
        let e = p.request.environment_spec.unwrap();
        assert_eq!(e.image, cwd.join("conf/dev.qcow2").display().to_string());
        assert_eq!(e.memory_bytes, 4 << 30);
        let q = e.qemu.unwrap();
        assert_eq!((q.cpus, q.flags), (2, vec!["-enable-kvm".to_string()]));
        let t = e.ssh.unwrap();
        assert_eq!(t.user, "latis");
        assert_eq!(t.key_file, cwd.join("conf/k").display().to_string());
        // `--ssh [USER@]HOST[:PORT]` alone means the ssh driver.
        let p = plan(
            CreateArgs {
                ssh: Some("ci@build:2200".into()),
                task: Some("t".into()),
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap();
        assert_eq!(p.driver, "ssh");
        let t = p.request.environment_spec.unwrap().ssh.unwrap();
        assert_eq!(
            (t.user.as_str(), t.host.as_str(), t.port),
            ("ci", "build", 2200)
        );
        assert_eq!(
            parse_destination("root@[::1]:2200").unwrap(),
            ("root".to_string(), "::1".to_string(), 2200)
        );
        assert_eq!(
            parse_destination("fe80::1").unwrap(),
            (String::new(), "fe80::1".to_string(), 0)
        );
        assert!(plan(
            CreateArgs {
                ssh: Some("build:x".into()),
                task: Some("t".into()),
                ..args()
            },
            None,
            &cwd
        )
        .unwrap_err()
        .to_string()
        .contains("not a port"));
        // A block for another driver, or two ways to say where: refused.
        let f = SessionFile::parse("driver: local\nssh:\n  host: h\n", "s.yaml").unwrap();
        let e = plan(args(), Some((f, cwd.clone())), &cwd)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ssh:` block") && e.contains("driver is local"),
            "{e}"
        );
        let f = SessionFile::parse(
            "local:\n  workdir: ws\nmounts: [\"ws:/workspace\"]\n",
            "s.yaml",
        )
        .unwrap();
        let e = plan(args(), Some((f, cwd.clone())), &cwd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("give one"), "{e}");
        let f = SessionFile::parse(
            "local:\n  workdir: not-made\nmounts: [\"ws:/workspace\"]\n",
            "s.yaml",
        )
        .unwrap();
        assert!(plan(args(), Some((f, cwd.clone())), &cwd).is_err());
        assert!(
            !cwd.join("not-made").exists(),
            "nothing made for a refused file"
        );
        let e = SessionFile::parse("local:\n  image: x\n", "s.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `image`"), "{e}");
    }

    #[test]
    fn flags_override_the_file_and_the_place_defaults_to_the_current_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir_all(cwd.join("conf/repo")).unwrap();
        std::fs::create_dir_all(cwd.join("other")).unwrap();

        // Nothing says where: an error; a task alone: the current directory.
        let e = plan(args(), None, &cwd).unwrap_err().to_string();
        assert!(e.starts_with("--campaign is required"), "{e}");
        let p = plan(
            CreateArgs {
                task: Some("Fix it".into()),
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap();
        assert_eq!(p.place, Place::Dir(cwd.clone()));
        assert_eq!(p.request.initial_message, "Fix it");
        assert_eq!(p.request.provider, 0, "chosen by choose_provider");
        assert_eq!(p.driver, "local");

        // The file's mounts are relative to the file; its maps merge under the flags'.
        let file = SessionFile::parse(
            "task: from file\nmounts: [\"repo:/workspace\"]\nname: f\nmax_tokens: 9\n\
             config: {a: \"1\", b: 2}\nenv: {X: x}\n",
            "s.yaml",
        )
        .unwrap();
        let p = plan(
            CreateArgs {
                name: Some("flag".into()),
                config: vec![("b".into(), "3".into())],
                ..args()
            },
            Some((file, cwd.join("conf"))),
            &cwd,
        )
        .unwrap();
        assert_eq!(p.place, Place::Dir(cwd.join("conf/repo")));
        assert_eq!(p.request.initial_message, "from file");
        assert_eq!(p.request.agent_name, "flag");
        assert_eq!(p.request.max_tokens, 9);
        assert_eq!(p.request.provider_config["a"], "1");
        assert_eq!(p.request.provider_config["b"], "3");
        assert_eq!(p.request.environment["X"], "x");

        // A flag's mount replaces the file's, relative to the current directory.
        let file = SessionFile::parse("mounts: [\"repo:/workspace\"]\n", "s.yaml").unwrap();
        let p = plan(
            CreateArgs {
                mounts: vec!["other:.".into()],
                ..args()
            },
            Some((file, cwd.join("conf"))),
            &cwd,
        )
        .unwrap();
        assert_eq!(p.place, Place::Dir(cwd.join("other")));

        // A file alone (no task) runs in the current directory; a campaign is kept by name.
        let p = plan(args(), Some((SessionFile::default(), cwd.clone())), &cwd).unwrap();
        assert_eq!(p.place, Place::Dir(cwd.clone()));
        let p = plan(
            CreateArgs {
                campaign: Some("proj".into()),
                mounts: vec!["other:/workspace".into()],
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap();
        assert_eq!(p.place, Place::Both("proj".into(), cwd.join("other")));

        // Two mounts, a bad driver from the file, a negative budget.
        let e = plan(
            CreateArgs {
                mounts: vec!["other:/workspace".into(), "conf:/workspace".into()],
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("2 mounts given"), "{e}");
        // The seed's kubernetes block: the podSpec travels as JSON, the kubeconfig made absolute.
        let file = SessionFile::parse(
            "driver: kubernetes\ntask: t\nkubernetes:\n  namespace: latis-sessions\n  \
             serviceAccount: latis-agent\n  kubeconfig: kube/config\n  podSpec:\n    \
             containers:\n      - name: agent\n        image: ghcr.io/x/ws:latest\n        \
             resources:\n          limits:\n            memory: \"4Gi\"\n",
            "s.yaml",
        )
        .unwrap();
        let p = plan(args(), Some((file, cwd.clone())), &cwd).unwrap();
        let k = p.request.environment_spec.unwrap().kubernetes.unwrap();
        assert_eq!(
            (k.namespace.as_str(), k.service_account.as_str()),
            ("latis-sessions", "latis-agent")
        );
        assert_eq!(k.kubeconfig, cwd.join("kube/config").display().to_string());
        let spec: serde_json::Value = serde_json::from_str(&k.pod_spec_json).unwrap();
        assert_eq!(spec["containers"][0]["image"], "ghcr.io/x/ws:latest");
        assert_eq!(
            spec["containers"][0]["resources"]["limits"]["memory"],
            "4Gi"
        );
        let file = SessionFile::parse(
            "driver: kubernetes\ntask: t\nkubernetes:\n  podSpec: [1]\n",
            "s.yaml",
        )
        .unwrap();
        let e = plan(args(), Some((file, cwd.clone())), &cwd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("podSpec must be a mapping"), "{e}");
        let file = SessionFile::parse("driver: kubernetes\ntask: t\n", "s.yaml").unwrap();
        let p = plan(
            CreateArgs {
                driver: Some("local".into()),
                ..args()
            },
            Some((file, cwd.clone())),
            &cwd,
        );
        assert!(p.is_ok(), "the flag overrides the file's driver");
        let e = plan(
            CreateArgs {
                task: Some("t".into()),
                max_tokens: Some(-1),
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_tokens must be 0 or more"), "{e}");
        let e = plan(
            CreateArgs {
                task: Some("t".into()),
                provider: Some("banana".into()),
                ..args()
            },
            None,
            &cwd,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("OBEY-2002: unknown provider \"banana\""),
            "{e}"
        );
    }

    #[test]
    fn campaign_names_come_from_the_directory() {
        use paddock_store::campaign_name_for;
        assert_eq!(campaign_name_for(Path::new("/home/me/my repo")), "my-repo");
        assert_eq!(campaign_name_for(Path::new("/srv/web.app_2")), "web.app_2");
        assert_eq!(campaign_name_for(Path::new("/")), "root");
    }

    #[test]
    fn list_rows_start_with_latis_columns() {
        let s = pb::SessionInfo {
            id: "sess_1".into(),
            status: Status::Running.number(),
            turns_completed: 1,
            initial_message: "Fix the failing tests in the whole repository, then open a PR".into(),
            agent_name: "a".into(),
            provider: paddock_core::Provider::Scripted.number(),
            tokens_input: 5,
            tokens_output: 7,
            created_at: Some(prost_types::Timestamp {
                seconds: 100,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            list_row(&s, 100_000 + 120_000),
            [
                "sess_1",
                "local",
                "complete",
                "Fix the failing tests in the whole repo…",
                "2m",
                "a",
                "scripted",
                "12"
            ]
        );
    }

    #[test]
    fn with_no_provider_the_first_agent_found_is_used_and_said() {
        use paddock_core::Provider;
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let host = |default: Option<&str>| Host {
            default_provider: default.map(String::from),
            config_provider: None,
            path: Some(bin.clone().into_os_string()),
        };
        // Nothing found, nothing set: refused, never the scripted agent silently.
        let mut req = pb::CreateSessionRequest::default();
        let e = choose_provider(&mut req, &host(None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--provider scripted"), "{e}");
        // codex and gemini found: codex (claude comes first, but is not there).
        std::fs::write(bin.join("gemini"), "").unwrap();
        std::fs::write(bin.join("codex"), "").unwrap();
        let said = choose_provider(&mut req, &host(None)).unwrap().unwrap();
        assert_eq!(req.provider, Provider::Codex.number());
        assert!(said.contains("using codex"), "{said}");
        // The agent runs with the user's PATH, unless the request sets one.
        assert_eq!(req.environment["PATH"], bin.to_str().unwrap());
        // $PADDOCK_PROVIDER decides before anything is looked for; a given one is kept.
        let mut req = pb::CreateSessionRequest::default();
        assert_eq!(
            choose_provider(&mut req, &host(Some("scripted"))).unwrap(),
            None
        );
        assert_eq!(req.provider, Provider::Scripted.number());
        assert!(
            !req.environment.contains_key("PATH"),
            "the scripted agent needs none"
        );
        let mut req = pb::CreateSessionRequest {
            provider: Provider::Gemini.number(),
            environment: [("PATH".to_string(), "/mine".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(choose_provider(&mut req, &host(None)).unwrap(), None);
        assert_eq!(req.environment["PATH"], "/mine");
    }
}
