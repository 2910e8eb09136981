//! Aria's containers on the environment drivers: a container is an environment of its own
//! (`<data dir>/environments/<container id>/`, and for podman the container
//! `paddock-<container id>`), made, entered and destroyed by the same code as a session's; the
//! core decides its life ([`paddock_core::container`]), this module does the driver's part.

use paddock_core::container::{ContainerEvent, ContainerRecord, ContainerWork};
use paddock_core::{Driver, EnvSpec, PodmanOptions, Provider, SessionConfig, SessionId};

use super::{Error, Host, Result};
use paddock_sys::proc::LaunchPlan;

/// The environment a container is, in the terms of a session's: its id names its directory
/// and its podman container; its variables are the podman container's own (bubblewrap: each
/// command's, added by the core at launch); its workspace is its session's working directory,
/// or for a container of no session a directory of its own (`workspace/` in its environment).
pub fn config_of(host: &Host, c: &ContainerRecord) -> (SessionId, SessionConfig) {
    let id = SessionId(c.id.clone());
    let workdir = if c.spec.working_dir.is_empty() {
        host.root(&id).join("workspace").display().to_string()
    } else {
        c.spec.working_dir.clone()
    };
    let mut config = SessionConfig::new("", Provider::Scripted, &workdir);
    config.env = EnvSpec {
        driver: c.spec.driver,
        network: c.spec.network,
        image: c.spec.image.clone(),
        podman: Box::new(PodmanOptions {
            env: if c.spec.driver == Driver::Podman {
                c.spec.environment.clone()
            } else {
                Default::default()
            },
            ..PodmanOptions::default()
        }),
        ..EnvSpec::default()
    };
    (id, config)
}

/// What the host lacks for a container of this driver and image, before anything is made.
pub fn check_host(host: &Host, c: &ContainerRecord) -> Result<()> {
    let (_, config) = config_of(host, c);
    config.env.check()?;
    super::check_host(&config.env, std::path::Path::new(&config.working_dir))
}

/// Does `work` for container `c`; the report a make or a start needs (`None`: nothing to say).
/// Blocking.
pub fn work(host: &Host, c: &ContainerRecord, work: &ContainerWork) -> Option<ContainerEvent> {
    let (id, config) = config_of(host, c);
    match work {
        ContainerWork::Make => Some(
            match make_workspace(&config).and_then(|()| super::provision(host, &id, &config)) {
                Ok(_) => ContainerEvent::Made,
                Err(e) => ContainerEvent::MakeFailed(e.to_string()),
            },
        ),
        // Made again if needed (a podman container that is gone is made anew; a stopped one
        // is started).
        ContainerWork::Start => Some(match super::provision(host, &id, &config) {
            Ok(_) => ContainerEvent::Started,
            Err(e) => ContainerEvent::StartFailed(e.to_string()),
        }),
        ContainerWork::Stop => {
            if c.spec.driver == Driver::Podman {
                super::podman::stop(&id);
            }
            None
        }
        ContainerWork::Destroy => {
            super::destroy(host, &id, Some(&config.env))();
            None
        }
    }
}

fn make_workspace(config: &SessionConfig) -> Result<()> {
    std::fs::create_dir_all(&config.working_dir)
        .map_err(|e| Error::file("make the workspace", &config.working_dir, e))
}

/// `plan` as it runs in container `c`.
pub fn enter(host: &Host, c: &ContainerRecord, plan: LaunchPlan) -> Result<LaunchPlan> {
    let (id, config) = config_of(host, c);
    super::enter(host, &id, &config, plan, super::Role::Command)
}
