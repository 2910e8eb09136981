//! Where a session's agent runs: its environment, chosen by a driver, and the environment's life.
//!
//! An environment is a place on this machine whose processes — the agent, and every command a
//! client runs in the session (`session exec`, an Aria task of the session) — see one view of
//! the world: the `local` driver's is the host itself; `bubblewrap`'s is the host read-only
//! with only the workspace writable, a HOME and a /tmp of the session's own and, unless asked,
//! no network; `podman`'s is a container of the session's own, from an image (or a root
//! directory), with the workspace mounted; `ssh`'s is another machine, where a `paddock
//! runner` keeps the agent through a dropped connection; `qemu`'s is a VM of the session's own,
//! reached like `ssh`'s machine. A session may also have a git worktree of its own (on this
//! machine: not `ssh`, not `qemu`).
//!
//! The life of an environment ([`EnvState`]):
//!
//! ```text
//!   Creating ──Provisioned──► Ready ──(session deleted)──► (destroyed: the row is gone)
//!      │
//!      └──ProvisionFailed / startup timeout / daemon restart──► Failed
//! ```
//!
//! A session whose environment needs provisioning ([`EnvSpec::needs_provisioning`]) stays
//! `CREATED` (latis' "creating") until the shell reports [`EnvEvent::Provisioned`]; only then
//! is its agent spawned. A failed provisioning refuses the create, like an agent that could not
//! be started: nothing of the session stays. A making that takes longer than the start-up
//! timeout fails the session instead (FAILED, OBEY-2005, kept: the driver may still be at
//! work, and its report then is ignored; `delete` removes what it made). Stopping a session leaves its environment (a
//! restart finds its HOME, its worktree and what the agent wrote there); deleting the session
//! destroys it (`Effect::Forget`).

use std::fmt;

/// Who provisions and enters an environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Driver {
    /// The host itself: the agent runs as the user, in the working directory.
    #[default]
    Local,
    /// A bubblewrap sandbox per process, over a per-session HOME and /tmp.
    Bubblewrap,
    /// A podman container per session, from an image; every process of the session runs in
    /// it (`podman exec`).
    Podman,
    /// Another machine, reached over OpenSSH: the agent runs in a `paddock runner` there,
    /// which keeps it through a dropped connection.
    Ssh,
    /// A virtual machine of the session's own (QEMU), booted from an overlay of an image and
    /// reached over ssh like `ssh`'s machine.
    Qemu,
    /// A pod of the session's own on a Kubernetes cluster (the user's kubeconfig): the agent
    /// runs in a `paddock runner` in it, reached through the API server (exec streams).
    Kubernetes,
}

impl Driver {
    pub const ALL: [Driver; 6] = [
        Driver::Local,
        Driver::Bubblewrap,
        Driver::Podman,
        Driver::Ssh,
        Driver::Qemu,
        Driver::Kubernetes,
    ];

    /// The driver's name, as `--driver` and `session.yaml` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Local => "local",
            Driver::Bubblewrap => "bubblewrap",
            Driver::Podman => "podman",
            Driver::Ssh => "ssh",
            Driver::Qemu => "qemu",
            Driver::Kubernetes => "kubernetes",
        }
    }

    /// The driver named `name` (case-insensitive; `bwrap` is bubblewrap's program name).
    pub fn parse(name: &str) -> Option<Driver> {
        match name.trim().to_ascii_lowercase().as_str() {
            "local" => Some(Driver::Local),
            "bubblewrap" | "bwrap" => Some(Driver::Bubblewrap),
            "podman" => Some(Driver::Podman),
            "ssh" => Some(Driver::Ssh),
            "qemu" => Some(Driver::Qemu),
            "kubernetes" | "k8s" => Some(Driver::Kubernetes),
            _ => None,
        }
    }

    /// Whether the driver keeps the agent from the host in an environment of this machine (a
    /// sandbox or a container). `ssh` runs it on another machine, as the user there, with
    /// that machine's network: nothing of this machine is hidden from it there, and nothing
    /// there is hidden from it either, so it is treated like `local` (its permissions ask).
    pub fn isolates(self) -> bool {
        matches!(
            self,
            Driver::Bubblewrap | Driver::Podman | Driver::Qemu | Driver::Kubernetes
        )
    }

    /// Whether the agent runs on another machine (reached over ssh or a cluster's API server,
    /// in a runner there): its CLI, its sign-in and its PATH are that machine's, not this one's.
    pub fn is_remote(self) -> bool {
        matches!(self, Driver::Ssh | Driver::Qemu | Driver::Kubernetes)
    }

    /// Whether the environment is a sandbox on this machine (a HOME and /tmp of the session's
    /// own, the workspace a directory here that must not undo the sandbox).
    pub fn sandboxes_here(self) -> bool {
        matches!(self, Driver::Bubblewrap | Driver::Podman)
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a session asked of its environment. Part of its configuration: fixed at create.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvSpec {
    pub driver: Driver,
    /// A git worktree of the working directory's repository, on branch `paddock/<session>`,
    /// becomes the agent's working directory.
    pub worktree: bool,
    /// Network access inside an isolating driver (the host's network is always there for
    /// `local`).
    pub network: bool,
    /// The image a container starts from (`podman`): a reference (`localhost/x:1`,
    /// `docker.io/library/debian:12`), an image archive (a file `podman load` reads), or a
    /// root directory (`podman --rootfs`). Empty for the other drivers.
    pub image: String,
    /// The most memory the environment's processes may use, in bytes (0: no limit).
    pub memory_bytes: u64,
    /// The most processes (and threads) the environment may hold at once (0: no limit).
    pub pids: u32,
    /// The seed's `podman:` block beyond the image (boxed: most sessions have none, and a
    /// config travels in every create input).
    pub podman: Box<PodmanOptions>,
    /// The seed's `ssh:` block: the machine an `ssh` session runs on; for `qemu`, how paddock
    /// logs in to the VM (its user, key, working directory). `None` when empty (most sessions:
    /// a stored session costs no allocation for it); read it with [`EnvSpec::ssh`].
    pub ssh: Option<Box<SshTarget>>,
    /// The seed's `qemu:` block beyond the image and memory (`image`, `memory_bytes`); `None`
    /// when empty, read with [`EnvSpec::qemu`].
    pub qemu: Option<Box<QemuOptions>>,
    /// The seed's `kubernetes:` block; `None` when empty, read with [`EnvSpec::kubernetes`].
    pub kubernetes: Option<Box<KubeOptions>>,
}

/// latis' `kubernetes:` block: where the session's pod goes and what it is, with the
/// kubeconfig context to reach the cluster with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KubeOptions {
    /// Empty: the context's namespace (or `default`).
    pub namespace: String,
    /// The pod's service account (empty: the namespace's `default`).
    pub service_account: String,
    /// The pod's spec (a core/v1 `PodSpec`) as JSON text: its containers' images, resources,
    /// volumes. Empty: one container from the environment's image. The shell reads it; the
    /// core only keeps it.
    pub pod_spec: String,
    /// The kubeconfig file (empty: `KUBECONFIG`, else `~/.kube/config`).
    pub kubeconfig: String,
    /// The kubeconfig context (empty: its current one).
    pub context: String,
}

impl KubeOptions {
    pub const EMPTY: KubeOptions = KubeOptions {
        namespace: String::new(),
        service_account: String::new(),
        pod_spec: String::new(),
        kubeconfig: String::new(),
        context: String::new(),
    };

    pub fn is_empty(&self) -> bool {
        *self == KubeOptions::default()
    }
}

/// `t` boxed, or `None` when it is its type's empty default: how the optional blocks of an
/// [`EnvSpec`] are made, so that an empty block and none compare equal.
pub fn boxed<T: Default + PartialEq>(t: T) -> Option<Box<T>> {
    (t != T::default()).then(|| Box::new(t))
}

/// What latis' `qemu:` block adds to a VM: its processors and raw flags for
/// `qemu-system-x86_64` (`-enable-kvm`, `-kernel …`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QemuOptions {
    /// 0: one.
    pub cpus: u32,
    pub flags: Vec<String>,
}

impl QemuOptions {
    /// No processors or flags asked for.
    pub const EMPTY: QemuOptions = QemuOptions {
        cpus: 0,
        flags: Vec::new(),
    };

    pub fn is_empty(&self) -> bool {
        *self == QemuOptions::default()
    }
}

/// Where an `ssh` session runs and how paddock gets there (latis' `ssh: {host, port, user,
/// keyFile}`, with the host key checked against a known_hosts file unless told not to).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SshTarget {
    pub host: String,
    /// 0: ssh's own default (22, or the user's ssh configuration's).
    pub port: u16,
    /// Empty: ssh's own default (the local user name, or the ssh configuration's).
    pub user: String,
    /// The private key to log in with (empty: ssh's defaults and agent).
    pub key_file: String,
    /// The known_hosts file the host's key must be in (empty: ssh's own, `~/.ssh/known_hosts`).
    pub known_hosts: String,
    /// Accept a host key seen for the first time (ssh's `accept-new`) instead of refusing it.
    /// Never a changed key.
    pub accept_new_host_key: bool,
    /// A paddock already installed on the host (latis' "already installed"); empty: paddock
    /// copies its own binary there when the host has none of this version.
    pub paddock: String,
    /// Where paddock keeps its binary and its runner on the host (empty: `~/.cache/paddock`).
    pub remote_dir: String,
    /// The agent's working directory on the host (empty: the user's home there). The
    /// session's campaign stays this machine's project.
    pub workdir: String,
}

impl SshTarget {
    /// Nothing said: ssh's own defaults.
    pub const EMPTY: SshTarget = SshTarget {
        host: String::new(),
        port: 0,
        user: String::new(),
        key_file: String::new(),
        known_hosts: String::new(),
        accept_new_host_key: false,
        paddock: String::new(),
        remote_dir: String::new(),
        workdir: String::new(),
    };

    pub fn is_empty(&self) -> bool {
        *self == SshTarget::default()
    }

    /// `user@host` (or `host`), for ssh's command line and for messages.
    pub fn destination(&self) -> String {
        if self.user.is_empty() {
            self.host.clone()
        } else {
            format!("{}@{}", self.user, self.host)
        }
    }
}

/// What latis' `podman:` block adds to a container: more mounts (`SRC:DST[:OPTIONS]`), ports
/// (`[HOST:]CONTAINER`), raw flags for `podman run`, and variables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodmanOptions {
    pub mounts: Vec<String>,
    pub ports: Vec<String>,
    pub flags: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

impl PodmanOptions {
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
            && self.ports.is_empty()
            && self.flags.is_empty()
            && self.env.is_empty()
    }
}

impl EnvSpec {
    /// The `ssh:` block (empty when none was given).
    pub fn ssh(&self) -> &SshTarget {
        static EMPTY: SshTarget = SshTarget::EMPTY;
        self.ssh.as_deref().unwrap_or(&EMPTY)
    }

    /// The `qemu:` block (empty when none was given).
    pub fn qemu(&self) -> &QemuOptions {
        static EMPTY: QemuOptions = QemuOptions::EMPTY;
        self.qemu.as_deref().unwrap_or(&EMPTY)
    }

    /// The `kubernetes:` block (empty when none was given).
    pub fn kubernetes(&self) -> &KubeOptions {
        static EMPTY: KubeOptions = KubeOptions::EMPTY;
        self.kubernetes.as_deref().unwrap_or(&EMPTY)
    }

    /// Whether anything must be made before the agent can start (a worktree, a sandbox's
    /// directories). A plain `local` session starts at once.
    pub fn needs_provisioning(&self) -> bool {
        self.worktree || self.driver != Driver::Local
    }

    /// The spec's own consistency: what no driver could honour.
    pub fn check(&self) -> Result<(), EnvSpecError> {
        if self.driver == Driver::Local && self.network {
            // The host's network is there anyway: refused so that nobody believes the flag
            // did something.
            return Err(EnvSpecError::NetworkOnLocal);
        }
        crate::model::check_environment(&self.podman.env)?;
        let driver = self.driver;
        if !driver.is_remote() && !self.ssh().is_empty() {
            return Err(EnvSpecError::SshOptions { driver });
        }
        if driver != Driver::Qemu && !self.qemu().is_empty() {
            return Err(EnvSpecError::QemuOptions { driver });
        }
        if driver != Driver::Kubernetes && !self.kubernetes().is_empty() {
            return Err(EnvSpecError::KubernetesOptions { driver });
        }
        match driver {
            Driver::Ssh => return self.check_ssh(),
            Driver::Qemu => return self.check_qemu(),
            Driver::Kubernetes => return self.check_kubernetes(),
            Driver::Podman if self.image.trim().is_empty() => {
                return Err(EnvSpecError::PodmanNeedsImage)
            }
            Driver::Podman => {}
            _ if !self.image.is_empty() => return Err(EnvSpecError::ImageWithoutPodman { driver }),
            _ if !self.podman.is_empty() => return Err(EnvSpecError::PodmanOptions { driver }),
            Driver::Local if self.memory_bytes > 0 || self.pids > 0 => {
                return Err(EnvSpecError::LimitsOnLocal)
            }
            _ => {}
        }
        Ok(())
    }
}

impl EnvSpec {
    fn check_qemu(&self) -> Result<(), EnvSpecError> {
        if self.image.trim().is_empty() {
            return Err(EnvSpecError::QemuNeedsImage);
        }
        let t = self.ssh();
        if !t.host.is_empty() {
            return Err(EnvSpecError::QemuHost);
        }
        let refused = if self.worktree {
            Some(EnvSpecError::Worktree {
                driver: Driver::Qemu,
            })
        } else if !self.podman.is_empty() {
            Some(EnvSpecError::QemuPodmanOptions)
        } else if self.pids > 0 {
            Some(EnvSpecError::QemuProcessLimit)
        } else if t.accept_new_host_key || !t.known_hosts.is_empty() {
            Some(EnvSpecError::QemuHostKeys)
        } else {
            None
        };
        refused.map_or(Ok(()), Err)
    }

    fn check_kubernetes(&self) -> Result<(), EnvSpecError> {
        let k = self.kubernetes();
        if self.image.trim().is_empty() && k.pod_spec.trim().is_empty() {
            return Err(EnvSpecError::KubernetesNeedsImage);
        }
        // A namespace is a DNS label (RFC 1123); a service account a DNS subdomain.
        let dns = |s: &str, dots: bool| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
                })
                && !s.starts_with(['-', '.'])
                && !s.ends_with(['-', '.'])
        };
        if !k.namespace.is_empty() && (!dns(&k.namespace, false) || k.namespace.len() > 63) {
            return Err(EnvSpecError::Namespace(k.namespace.clone()));
        }
        if !k.service_account.is_empty() && !dns(&k.service_account, true) {
            return Err(EnvSpecError::ServiceAccount(k.service_account.clone()));
        }
        let refused = if self.worktree {
            Some(EnvSpecError::Worktree {
                driver: Driver::Kubernetes,
            })
        } else if !self.podman.is_empty() || !self.qemu().is_empty() || !self.ssh().is_empty() {
            Some(EnvSpecError::KubernetesOtherOptions)
        } else if self.pids > 0 {
            Some(EnvSpecError::KubernetesProcessLimit)
        } else if self.network {
            Some(EnvSpecError::KubernetesNetwork)
        } else {
            None
        };
        refused.map_or(Ok(()), Err)
    }

    fn check_ssh(&self) -> Result<(), EnvSpecError> {
        let t = self.ssh();
        let word =
            |s: &str| !s.is_empty() && !s.starts_with('-') && !s.contains(char::is_whitespace);
        if !word(&t.host) {
            return Err(EnvSpecError::SshNeedsHost);
        }
        if !t.user.is_empty() && !word(&t.user) {
            return Err(EnvSpecError::SshUser(t.user.clone()));
        }
        let refused = if self.worktree {
            Some(EnvSpecError::Worktree {
                driver: Driver::Ssh,
            })
        } else if self.network {
            Some(EnvSpecError::SshNetwork)
        } else if !self.image.is_empty() || !self.podman.is_empty() || !self.qemu().is_empty() {
            Some(EnvSpecError::SshOtherOptions)
        } else if self.memory_bytes > 0 || self.pids > 0 {
            Some(EnvSpecError::SshLimits)
        } else {
            None
        };
        refused.map_or(Ok(()), Err)
    }
}

/// Why [`EnvSpec::check`] refuses a spec: what no driver could honour, or what this driver
/// does not take. Each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvSpecError {
    #[error("network applies to isolating drivers; a local session always has the host's network")]
    NetworkOnLocal,
    /// A variable of the podman block's `env`.
    #[error(transparent)]
    Env(#[from] crate::model::EnvVarError),
    #[error("ssh options (host, port, user, key) given, but the driver is {driver}")]
    SshOptions { driver: Driver },
    #[error("qemu options (cpus, flags) given, but the driver is {driver}")]
    QemuOptions { driver: Driver },
    #[error(
        "kubernetes options (namespace, serviceAccount, podSpec) given, but the driver is {driver}"
    )]
    KubernetesOptions { driver: Driver },
    #[error(
        "the podman driver needs an image (--image, or `image:` in the podman block): \
         a reference, an image archive or a root directory"
    )]
    PodmanNeedsImage,
    /// An image for a driver that runs none (`local`, `bubblewrap`).
    #[error("an image is for containers: the {driver} driver runs no image (use --driver podman)")]
    ImageWithoutPodman { driver: Driver },
    #[error("podman options (mounts, ports, flags, env) given, but the driver is {driver}")]
    PodmanOptions { driver: Driver },
    #[error(
        "memory and process limits need an isolating driver: a local agent runs as \
         you, under your own limits (use --driver bubblewrap or podman)"
    )]
    LimitsOnLocal,
    /// A worktree for a driver whose agent runs elsewhere (`ssh`, `qemu`, `kubernetes`).
    #[error(
        "a worktree (--worktree) is made on this machine's repository: not for the {driver} driver"
    )]
    Worktree { driver: Driver },
    #[error(
        "the qemu driver needs an image (`image:` in the qemu block, --image): a qcow2 \
         disk the VM boots from (it is never written: each session gets an overlay)"
    )]
    QemuNeedsImage,
    #[error(
        "a qemu session's host is its VM: give the qemu block's ssh {{user, keyFile}}, \
         not a host"
    )]
    QemuHost,
    #[error("podman options (mounts, ports, env): not for the qemu driver")]
    QemuPodmanOptions,
    #[error("a process limit (the VM's own kernel counts its processes): not for the qemu driver")]
    QemuProcessLimit,
    #[error(
        "host key settings (a VM's key is taken at its first boot and held to): not for the \
         qemu driver"
    )]
    QemuHostKeys,
    #[error(
        "the kubernetes driver needs an image (--image) or a podSpec (`podSpec:` in the \
         kubernetes block) for the session's pod"
    )]
    KubernetesNeedsImage,
    /// The namespace given is not a DNS label.
    #[error(
        "kubernetes namespace {0:?} is not a namespace name (lowercase letters, digits and \
         '-', at most 63)"
    )]
    Namespace(String),
    /// The service account given is not a DNS subdomain.
    #[error("kubernetes service account {0:?} is not a service account name")]
    ServiceAccount(String),
    #[error("podman, qemu and ssh options: not for the kubernetes driver")]
    KubernetesOtherOptions,
    #[error("a process limit (the cluster's own pid limits apply): not for the kubernetes driver")]
    KubernetesProcessLimit,
    #[error(
        "network (the pod's network is the cluster's: its network policies decide): not for \
         the kubernetes driver"
    )]
    KubernetesNetwork,
    #[error(
        "the ssh driver needs a host (--ssh [USER@]HOST[:PORT], or `host:` in the ssh \
         block)"
    )]
    SshNeedsHost,
    /// The user given is not a word.
    #[error("ssh user {0:?} is not a user name")]
    SshUser(String),
    #[error("network (the host's own network is there, as for local): not for the ssh driver")]
    SshNetwork,
    #[error("an image, podman and qemu options: not for the ssh driver")]
    SshOtherOptions,
    #[error("memory and process limits: not for the ssh driver")]
    SshLimits,
}

/// Where an environment is in its life (see the module's diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum EnvState {
    /// The driver is making it; the agent waits.
    Creating,
    /// Made: the agent (and every command of the session) runs in it.
    #[default]
    Ready,
    /// It could not be made, or its making was cut short (a daemon restart, the startup
    /// timeout). What was made stays until the session is deleted.
    Failed,
}

impl EnvState {
    pub const ALL: [EnvState; 3] = [EnvState::Creating, EnvState::Ready, EnvState::Failed];

    /// The number the store keeps.
    pub fn number(self) -> i64 {
        match self {
            EnvState::Creating => 0,
            EnvState::Ready => 1,
            EnvState::Failed => 2,
        }
    }

    pub fn from_number(n: i64) -> Option<EnvState> {
        EnvState::ALL.into_iter().find(|s| s.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            EnvState::Creating => "creating",
            EnvState::Ready => "ready",
            EnvState::Failed => "failed",
        }
    }

    /// The state after `event`, or `None` when the event means nothing in this state (a
    /// report that arrives after the making was given up).
    pub fn on(self, event: &EnvEvent) -> Option<EnvState> {
        match (self, event) {
            (EnvState::Creating, EnvEvent::Provisioned) => Some(EnvState::Ready),
            (EnvState::Creating, EnvEvent::ProvisionFailed { .. }) => Some(EnvState::Failed),
            _ => None,
        }
    }
}

/// What the shell reports about a session's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvEvent {
    /// Made: the agent can start in it.
    Provisioned,
    /// Could not be made; `reason` says what to install or fix.
    ProvisionFailed { reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_parse_by_their_names() {
        for d in Driver::ALL {
            assert_eq!(Driver::parse(d.name()), Some(d));
            assert_eq!(Driver::parse(&d.name().to_uppercase()), Some(d));
        }
        assert_eq!(Driver::parse("bwrap"), Some(Driver::Bubblewrap));
        assert_eq!(Driver::parse("docker"), None);
    }

    #[test]
    fn an_ssh_spec_needs_a_host_and_takes_nothing_of_this_machine() {
        let host = |h: &str| SshTarget {
            host: h.into(),
            ..SshTarget::default()
        };
        let ssh = |t: SshTarget| EnvSpec {
            driver: Driver::Ssh,
            ssh: boxed(t),
            ..EnvSpec::default()
        };
        assert!(ssh(host("build")).needs_provisioning());
        assert!(
            !Driver::Ssh.isolates(),
            "its permissions ask, as on the host"
        );
        assert_eq!(ssh(host("build")).check(), Ok(()));
        for bad in ["", "-oProxyCommand=x", "a b"] {
            assert_eq!(
                ssh(host(bad)).check(),
                Err(EnvSpecError::SshNeedsHost),
                "{bad:?}"
            );
        }
        let bad_user = SshTarget {
            user: "-l".into(),
            ..host("build")
        };
        assert_eq!(
            ssh(bad_user).check(),
            Err(EnvSpecError::SshUser("-l".into()))
        );
        for (spec, what) in [
            (
                EnvSpec {
                    worktree: true,
                    ..ssh(host("build"))
                },
                EnvSpecError::Worktree {
                    driver: Driver::Ssh,
                },
            ),
            (
                EnvSpec {
                    network: true,
                    ..ssh(host("build"))
                },
                EnvSpecError::SshNetwork,
            ),
            (
                EnvSpec {
                    pids: 5,
                    ..ssh(host("build"))
                },
                EnvSpecError::SshLimits,
            ),
            (
                EnvSpec {
                    image: "x".into(),
                    ..ssh(host("build"))
                },
                EnvSpecError::SshOtherOptions,
            ),
        ] {
            assert_eq!(spec.check(), Err(what));
        }
        let elsewhere = EnvSpec {
            driver: Driver::Podman,
            image: "x".into(),
            ssh: boxed(host("build")),
            ..EnvSpec::default()
        };
        assert_eq!(
            elsewhere.check(),
            Err(EnvSpecError::SshOptions {
                driver: Driver::Podman
            })
        );
    }

    #[test]
    fn a_qemu_spec_needs_an_image_and_no_host() {
        let vm = |image: &str| EnvSpec {
            driver: Driver::Qemu,
            image: image.into(),
            memory_bytes: 1 << 30,
            network: true,
            qemu: boxed(QemuOptions {
                cpus: 2,
                flags: vec!["-enable-kvm".into()],
            }),
            ..EnvSpec::default()
        };
        assert_eq!(vm("/img.qcow2").check(), Ok(()));
        assert!(Driver::Qemu.isolates() && Driver::Qemu.is_remote());
        assert_eq!(vm("").check(), Err(EnvSpecError::QemuNeedsImage));
        let with_host = EnvSpec {
            ssh: boxed(SshTarget {
                host: "h".into(),
                ..SshTarget::default()
            }),
            ..vm("/img.qcow2")
        };
        assert_eq!(with_host.check(), Err(EnvSpecError::QemuHost));
        for (spec, what) in [
            (
                EnvSpec {
                    worktree: true,
                    ..vm("/i")
                },
                EnvSpecError::Worktree {
                    driver: Driver::Qemu,
                },
            ),
            (
                EnvSpec {
                    pids: 3,
                    ..vm("/i")
                },
                EnvSpecError::QemuProcessLimit,
            ),
        ] {
            assert_eq!(spec.check(), Err(what));
        }
        let elsewhere = EnvSpec {
            driver: Driver::Bubblewrap,
            qemu: boxed(QemuOptions {
                cpus: 2,
                flags: vec![],
            }),
            ..EnvSpec::default()
        };
        assert_eq!(
            elsewhere.check(),
            Err(EnvSpecError::QemuOptions {
                driver: Driver::Bubblewrap
            })
        );
    }

    #[test]
    fn a_kubernetes_spec_needs_an_image_or_a_pod_spec() {
        let pod = |image: &str, k: KubeOptions| EnvSpec {
            driver: Driver::Kubernetes,
            image: image.into(),
            memory_bytes: 1 << 30,
            kubernetes: boxed(k),
            ..EnvSpec::default()
        };
        assert_eq!(pod("debian:12", KubeOptions::default()).check(), Ok(()));
        let spec = KubeOptions {
            namespace: "team-a".into(),
            service_account: "agents.x".into(),
            pod_spec: "{\"containers\":[]}".into(),
            ..KubeOptions::default()
        };
        assert_eq!(pod("", spec.clone()).check(), Ok(()));
        assert!(Driver::Kubernetes.isolates() && Driver::Kubernetes.is_remote());
        assert!(!Driver::Kubernetes.sandboxes_here());
        assert_eq!(Driver::parse("k8s"), Some(Driver::Kubernetes));
        assert_eq!(
            pod("", KubeOptions::default()).check(),
            Err(EnvSpecError::KubernetesNeedsImage)
        );
        for bad in ["Team", "-a", "a_b", &"x".repeat(64)] {
            let k = KubeOptions {
                namespace: bad.into(),
                ..spec.clone()
            };
            assert_eq!(pod("", k).check(), Err(EnvSpecError::Namespace(bad.into())));
        }
        let refused = pod(
            "i",
            KubeOptions {
                service_account: "Bad SA".into(),
                ..KubeOptions::default()
            },
        )
        .check();
        assert_eq!(refused, Err(EnvSpecError::ServiceAccount("Bad SA".into())));
        for (s, what) in [
            (
                EnvSpec {
                    worktree: true,
                    ..pod("i", KubeOptions::default())
                },
                EnvSpecError::Worktree {
                    driver: Driver::Kubernetes,
                },
            ),
            (
                EnvSpec {
                    pids: 3,
                    ..pod("i", KubeOptions::default())
                },
                EnvSpecError::KubernetesProcessLimit,
            ),
            (
                EnvSpec {
                    network: true,
                    ..pod("i", KubeOptions::default())
                },
                EnvSpecError::KubernetesNetwork,
            ),
        ] {
            assert_eq!(s.check(), Err(what));
        }
        let elsewhere = EnvSpec {
            driver: Driver::Local,
            kubernetes: boxed(spec),
            ..EnvSpec::default()
        };
        assert_eq!(
            elsewhere.check(),
            Err(EnvSpecError::KubernetesOptions {
                driver: Driver::Local
            })
        );
    }

    /// Each refusal of `check` is a variant of its own, in the words clients get.
    #[test]
    fn every_refusal_is_a_variant_with_its_words() {
        use crate::model::EnvVarError;
        let spec = |driver| EnvSpec {
            driver,
            ..EnvSpec::default()
        };
        let host = |h: &str| SshTarget {
            host: h.into(),
            ..SshTarget::default()
        };
        let ssh = EnvSpec {
            ssh: boxed(host("build")),
            ..spec(Driver::Ssh)
        };
        let vm = EnvSpec {
            image: "/i.qcow2".into(),
            ..spec(Driver::Qemu)
        };
        let pod = |k: KubeOptions| EnvSpec {
            image: "i".into(),
            kubernetes: boxed(k),
            ..spec(Driver::Kubernetes)
        };
        let mounts = Box::new(PodmanOptions {
            mounts: vec!["/a:/b".into()],
            ..PodmanOptions::default()
        });
        let bad_env = Box::new(PodmanOptions {
            env: [("A=B".to_string(), "x".to_string())].into(),
            ..PodmanOptions::default()
        });
        let refused = |spec: EnvSpec, want: EnvSpecError, words: &str| {
            let e = spec.check().unwrap_err();
            assert_eq!(e, want, "{spec:?}");
            assert_eq!(e.to_string(), words);
        };
        refused(
            EnvSpec {
                network: true,
                ..spec(Driver::Local)
            },
            EnvSpecError::NetworkOnLocal,
            "network applies to isolating drivers; a local session always has the host's network",
        );
        refused(
            EnvSpec {
                podman: bad_env,
                image: "x".into(),
                ..spec(Driver::Podman)
            },
            EnvSpecError::Env(EnvVarError::Separator("A=B".into())),
            "environment variable name \"A=B\" contains '=' or NUL",
        );
        refused(
            EnvSpec {
                ssh: boxed(host("h")),
                ..spec(Driver::Bubblewrap)
            },
            EnvSpecError::SshOptions {
                driver: Driver::Bubblewrap,
            },
            "ssh options (host, port, user, key) given, but the driver is bubblewrap",
        );
        refused(
            EnvSpec {
                qemu: boxed(QemuOptions {
                    cpus: 2,
                    flags: vec![],
                }),
                ..spec(Driver::Local)
            },
            EnvSpecError::QemuOptions {
                driver: Driver::Local,
            },
            "qemu options (cpus, flags) given, but the driver is local",
        );
        let namespace = KubeOptions {
            namespace: "a".into(),
            ..KubeOptions::default()
        };
        refused(
            EnvSpec {
                kubernetes: boxed(namespace),
                ..spec(Driver::Podman)
            },
            EnvSpecError::KubernetesOptions {
                driver: Driver::Podman,
            },
            "kubernetes options (namespace, serviceAccount, podSpec) given, but the driver is \
             podman",
        );
        refused(
            spec(Driver::Podman),
            EnvSpecError::PodmanNeedsImage,
            "the podman driver needs an image (--image, or `image:` in the podman block): a \
             reference, an image archive or a root directory",
        );
        refused(
            EnvSpec {
                image: "x".into(),
                ..spec(Driver::Bubblewrap)
            },
            EnvSpecError::ImageWithoutPodman {
                driver: Driver::Bubblewrap,
            },
            "an image is for containers: the bubblewrap driver runs no image (use --driver podman)",
        );
        refused(
            EnvSpec {
                podman: mounts.clone(),
                ..spec(Driver::Local)
            },
            EnvSpecError::PodmanOptions {
                driver: Driver::Local,
            },
            "podman options (mounts, ports, flags, env) given, but the driver is local",
        );
        refused(
            EnvSpec {
                pids: 10,
                ..spec(Driver::Local)
            },
            EnvSpecError::LimitsOnLocal,
            "memory and process limits need an isolating driver: a local agent runs as you, under \
             your own limits (use --driver bubblewrap or podman)",
        );
        refused(
            EnvSpec {
                worktree: true,
                ..vm.clone()
            },
            EnvSpecError::Worktree {
                driver: Driver::Qemu,
            },
            "a worktree (--worktree) is made on this machine's repository: not for the qemu driver",
        );
        refused(
            spec(Driver::Qemu),
            EnvSpecError::QemuNeedsImage,
            "the qemu driver needs an image (`image:` in the qemu block, --image): a qcow2 disk \
             the VM boots from (it is never written: each session gets an overlay)",
        );
        refused(
            EnvSpec {
                ssh: boxed(host("h")),
                ..vm.clone()
            },
            EnvSpecError::QemuHost,
            "a qemu session's host is its VM: give the qemu block's ssh {user, keyFile}, not a \
             host",
        );
        refused(
            EnvSpec {
                podman: mounts.clone(),
                ..vm.clone()
            },
            EnvSpecError::QemuPodmanOptions,
            "podman options (mounts, ports, env): not for the qemu driver",
        );
        refused(
            EnvSpec {
                pids: 3,
                ..vm.clone()
            },
            EnvSpecError::QemuProcessLimit,
            "a process limit (the VM's own kernel counts its processes): not for the qemu driver",
        );
        refused(
            EnvSpec {
                ssh: boxed(SshTarget {
                    accept_new_host_key: true,
                    ..SshTarget::default()
                }),
                ..vm.clone()
            },
            EnvSpecError::QemuHostKeys,
            "host key settings (a VM's key is taken at its first boot and held to): not for the \
             qemu driver",
        );
        refused(
            spec(Driver::Kubernetes),
            EnvSpecError::KubernetesNeedsImage,
            "the kubernetes driver needs an image (--image) or a podSpec (`podSpec:` in the \
             kubernetes block) for the session's pod",
        );
        refused(
            pod(KubeOptions {
                namespace: "Team".into(),
                ..KubeOptions::default()
            }),
            EnvSpecError::Namespace("Team".into()),
            "kubernetes namespace \"Team\" is not a namespace name (lowercase letters, digits and \
             '-', at most 63)",
        );
        refused(
            pod(KubeOptions {
                service_account: "Bad SA".into(),
                ..KubeOptions::default()
            }),
            EnvSpecError::ServiceAccount("Bad SA".into()),
            "kubernetes service account \"Bad SA\" is not a service account name",
        );
        refused(
            EnvSpec {
                podman: mounts.clone(),
                ..pod(KubeOptions::default())
            },
            EnvSpecError::KubernetesOtherOptions,
            "podman, qemu and ssh options: not for the kubernetes driver",
        );
        refused(
            EnvSpec {
                pids: 3,
                ..pod(KubeOptions::default())
            },
            EnvSpecError::KubernetesProcessLimit,
            "a process limit (the cluster's own pid limits apply): not for the kubernetes driver",
        );
        refused(
            EnvSpec {
                network: true,
                ..pod(KubeOptions::default())
            },
            EnvSpecError::KubernetesNetwork,
            "network (the pod's network is the cluster's: its network policies decide): not for \
             the kubernetes driver",
        );
        refused(
            spec(Driver::Ssh),
            EnvSpecError::SshNeedsHost,
            "the ssh driver needs a host (--ssh [USER@]HOST[:PORT], or `host:` in the ssh block)",
        );
        refused(
            EnvSpec {
                ssh: boxed(SshTarget {
                    user: "-l".into(),
                    ..host("build")
                }),
                ..spec(Driver::Ssh)
            },
            EnvSpecError::SshUser("-l".into()),
            "ssh user \"-l\" is not a user name",
        );
        refused(
            EnvSpec {
                network: true,
                ..ssh.clone()
            },
            EnvSpecError::SshNetwork,
            "network (the host's own network is there, as for local): not for the ssh driver",
        );
        refused(
            EnvSpec {
                image: "x".into(),
                ..ssh.clone()
            },
            EnvSpecError::SshOtherOptions,
            "an image, podman and qemu options: not for the ssh driver",
        );
        refused(
            EnvSpec {
                pids: 5,
                ..ssh.clone()
            },
            EnvSpecError::SshLimits,
            "memory and process limits: not for the ssh driver",
        );
    }

    #[test]
    fn only_creating_moves() {
        let ok = EnvEvent::Provisioned;
        let bad = EnvEvent::ProvisionFailed { reason: "x".into() };
        assert_eq!(EnvState::Creating.on(&ok), Some(EnvState::Ready));
        assert_eq!(EnvState::Creating.on(&bad), Some(EnvState::Failed));
        for s in [EnvState::Ready, EnvState::Failed] {
            assert_eq!(s.on(&ok), None);
            assert_eq!(s.on(&bad), None);
        }
        for s in EnvState::ALL {
            assert_eq!(EnvState::from_number(s.number()), Some(s));
        }
    }

    #[test]
    fn only_isolation_and_worktrees_need_provisioning() {
        assert!(!EnvSpec::default().needs_provisioning());
        let bwrap = EnvSpec {
            driver: Driver::Bubblewrap,
            ..EnvSpec::default()
        };
        assert!(bwrap.needs_provisioning() && bwrap.check().is_ok());
        let wt = EnvSpec {
            worktree: true,
            ..EnvSpec::default()
        };
        assert!(wt.needs_provisioning());
        let net = EnvSpec {
            network: true,
            ..EnvSpec::default()
        };
        assert_eq!(net.check(), Err(EnvSpecError::NetworkOnLocal));
        let podman = EnvSpec {
            driver: Driver::Podman,
            ..EnvSpec::default()
        };
        assert!(podman.needs_provisioning());
        assert_eq!(podman.check(), Err(EnvSpecError::PodmanNeedsImage));
        let image = EnvSpec {
            image: "x".into(),
            ..podman.clone()
        };
        assert!(image.check().is_ok());
        let image_elsewhere = EnvSpec {
            driver: Driver::Bubblewrap,
            ..image.clone()
        };
        assert_eq!(
            image_elsewhere.check(),
            Err(EnvSpecError::ImageWithoutPodman {
                driver: Driver::Bubblewrap
            })
        );
        let limits_on_host = EnvSpec {
            pids: 10,
            ..EnvSpec::default()
        };
        assert_eq!(limits_on_host.check(), Err(EnvSpecError::LimitsOnLocal));
        let limits_in_sandbox = EnvSpec {
            driver: Driver::Bubblewrap,
            ..limits_on_host
        };
        assert!(limits_in_sandbox.check().is_ok());
    }
}
