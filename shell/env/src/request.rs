//! What an obey request asks for as its environment (`SessionEnvironment`), read into the
//! core's [`core::EnvSpec`]: shared by the daemon's CreateSession and the CLI's `latis` check.

use paddock_core as core;
use paddock_proto::obey::local::v1 as pb;

/// A request's environment (unset: on the host), checked for what no driver could honour.
pub fn env_spec(e: Option<&pb::SessionEnvironment>) -> crate::Result<core::EnvSpec> {
    let Some(e) = e else {
        return Ok(core::EnvSpec::default());
    };
    let driver = if e.driver.trim().is_empty() {
        core::Driver::Local
    } else {
        core::Driver::parse(&e.driver).ok_or_else(|| {
            let names: Vec<&str> = core::Driver::ALL.iter().map(|d| d.name()).collect();
            crate::Error::Refused(format!(
                "unknown driver {:?}; the drivers are: {}",
                e.driver,
                names.join(", ")
            ))
        })?
    };
    let spec = core::EnvSpec {
        driver,
        worktree: e.worktree,
        network: e.network,
        image: e.image.trim().to_string(),
        memory_bytes: e.memory_bytes,
        pids: e.pids_limit,
        podman: Box::new(core::PodmanOptions {
            mounts: e.mounts.clone(),
            ports: e.ports.clone(),
            flags: e.flags.clone(),
            env: e.env.clone().into_iter().collect(),
        }),
        qemu: core::environment::boxed(match &e.qemu {
            None => core::QemuOptions::default(),
            Some(q) => core::QemuOptions {
                cpus: q.cpus,
                flags: q.flags.clone(),
            },
        }),
        ssh: core::environment::boxed(match &e.ssh {
            None => core::SshTarget::default(),
            Some(t) => core::SshTarget {
                host: t.host.trim().to_string(),
                port: u16::try_from(t.port).map_err(|_| {
                    crate::Error::Refused(format!("ssh port {} is not a port", t.port))
                })?,
                user: t.user.trim().to_string(),
                key_file: t.key_file.trim().to_string(),
                known_hosts: t.known_hosts.trim().to_string(),
                accept_new_host_key: t.accept_new_host_key,
                paddock: t.paddock.trim().to_string(),
                remote_dir: t.remote_dir.trim().to_string(),
                workdir: t.workdir.trim().to_string(),
            },
        }),
        kubernetes: core::environment::boxed(match &e.kubernetes {
            None => core::KubeOptions::default(),
            Some(k) => core::KubeOptions {
                namespace: k.namespace.trim().to_string(),
                service_account: k.service_account.trim().to_string(),
                pod_spec: k.pod_spec_json.trim().to_string(),
                kubeconfig: k.kubeconfig.trim().to_string(),
                context: k.context.trim().to_string(),
            },
        }),
    };
    spec.check()?;
    Ok(spec)
}
