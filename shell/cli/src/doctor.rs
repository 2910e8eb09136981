//! `paddock doctor`: can each agent run here, and if not, what to do.
//!
//! For each agent CLI: found on PATH, its version (`--version`, bounded in time), and whether
//! it has credentials (an API key in the environment or the CLI's own login file). For the
//! built-in agents: the openai-api loop's key and whether its endpoint answers. Then the daemon
//! (answers on its socket?) and the drivers (can this machine make their environments?). Every
//! line that is not `ok` says what to do.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::view::table;
use super::{print_json, Ctx, Result};
use crate::providers::credentials;

/// How long a CLI's `--version` may take.
const VERSION_WAIT: Duration = Duration::from_secs(10);
/// How long the openai-api endpoint may take to accept a connection.
const CONNECT_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    /// Works, with a caveat (no key found: the CLI may still have another way in).
    Warn,
    /// Cannot work as things are.
    Missing,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Missing => "missing",
        }
    }
}

/// One line of the report.
#[derive(Debug)]
struct Check {
    what: String,
    level: Level,
    detail: String,
    /// What to do about it (empty when ok).
    fix: String,
}

/// An agent CLI paddock drives, and how one gets in.
struct AgentCli {
    provider: &'static str,
    program: &'static str,
    install: &'static str,
    keys: &'static [&'static str],
    login_hint: &'static str,
}

const AGENTS: &[AgentCli] = &[
    AgentCli {
        provider: "claude-code",
        program: "claude",
        install: "npm install -g @anthropic-ai/claude-code",
        keys: credentials::CLAUDE_KEYS,
        login_hint: "run `claude` once and /login, or set ANTHROPIC_API_KEY \
                     (sessions get it with --env ANTHROPIC_API_KEY=…)",
    },
    AgentCli {
        provider: "codex",
        program: "codex",
        install: "npm install -g @openai/codex",
        keys: credentials::CODEX_KEYS,
        login_hint: "run `codex login`, or set OPENAI_API_KEY",
    },
    AgentCli {
        provider: "gemini",
        program: "gemini",
        install: "npm install -g @google/gemini-cli",
        keys: credentials::GEMINI_KEYS,
        login_hint: "run `gemini` once to sign in, or set GEMINI_API_KEY",
    },
    AgentCli {
        provider: "openclaw",
        program: "openclaw",
        install: "npm install -g openclaw (then: --provider openclaw)",
        keys: &[],
        login_hint: "",
    },
];

/// The first line `program --version` prints, or why there is none.
async fn version(program: &Path) -> std::result::Result<String, String> {
    let run = tokio::process::Command::new(program)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(VERSION_WAIT, run).await {
        Err(_) => Err(format!(
            "`{} --version` did not answer within {}s",
            program.display(),
            VERSION_WAIT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("cannot run {}: {e}", program.display())),
        Ok(Ok(out)) if !out.status.success() => {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "`{} --version` failed ({}): {}",
                program.display(),
                out.status,
                crate::text::truncate(err.lines().next().unwrap_or("").trim(), 200)
            ))
        }
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string()),
    }
}

/// Where the agent's credentials are, if anywhere (the rule `session create` applies).
fn credentials_of(a: &AgentCli) -> Option<String> {
    let env = credentials::own_env;
    let cwd = std::env::current_dir().unwrap_or_default();
    match a.provider {
        "claude-code" => credentials::claude(&env, &cwd),
        "codex" => credentials::codex(&env, &Default::default()),
        "gemini" => credentials::gemini(&env),
        _ => None,
    }
}

async fn agent(a: &AgentCli) -> Check {
    let what = format!("{} ({})", a.provider, a.program);
    let Some(program) = crate::paths::find_on_own_path(a.program) else {
        return Check {
            what,
            level: Level::Missing,
            detail: format!("`{}` is not on PATH", a.program),
            fix: format!(
                "{}, or point a session at it: --config command=/path/to/{}",
                a.install, a.program
            ),
        };
    };
    let version = match version(&program).await {
        Ok(v) => v,
        Err(e) => {
            return Check {
                what,
                level: Level::Missing,
                detail: e,
                fix: format!("reinstall it ({})", a.install),
            }
        }
    };
    let creds = credentials_of(a);
    match (creds, a.keys.is_empty()) {
        (Some(c), _) => Check {
            what,
            level: Level::Ok,
            detail: format!("{version} at {}; {c}", program.display()),
            fix: String::new(),
        },
        (None, true) => Check {
            what,
            level: Level::Ok,
            detail: format!("{version} at {}", program.display()),
            fix: String::new(),
        },
        (None, false) => Check {
            what,
            level: Level::Warn,
            detail: format!(
                "{version} at {}; no key ({}) and no login found",
                program.display(),
                a.keys.join(", ")
            ),
            fix: a.login_hint.to_string(),
        },
    }
}

/// The openai-api loop: built in; it needs a key (unless the endpoint is local) and an endpoint
/// that answers.
async fn openai_api() -> Check {
    let base = std::env::var("OPENAI_BASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "https://api.openai.com/v1".into());
    let key = std::env::var_os("OPENAI_API_KEY").is_some_and(|k| !k.is_empty());
    let what = "openai-api (built in)".to_string();
    let Some((host, port)) = host_port(&base) else {
        return Check {
            what,
            level: Level::Missing,
            detail: format!("OPENAI_BASE_URL {base:?} is not an http(s) URL"),
            fix: "set OPENAI_BASE_URL (or --config base_url=…) to e.g. http://localhost:11434/v1"
                .into(),
        };
    };
    let reach = tokio::time::timeout(
        CONNECT_WAIT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await;
    let reachable = matches!(reach, Ok(Ok(_)));
    let local = matches!(host.as_str(), "localhost" | "127.0.0.1" | "::1");
    let (level, fix) = match (reachable, key || local) {
        (true, true) => (Level::Ok, String::new()),
        (true, false) => (
            Level::Warn,
            "set OPENAI_API_KEY (or --config api_key=…)".to_string(),
        ),
        (false, _) => (
            Level::Warn,
            format!("{base} does not answer: check the network, or point --config base_url= at a server that runs"),
        ),
    };
    Check {
        what,
        level,
        detail: format!(
            "{base} {}; {}",
            if reachable {
                "answers"
            } else {
                "does not answer"
            },
            if key {
                "$OPENAI_API_KEY is set"
            } else {
                "no $OPENAI_API_KEY"
            }
        ),
        fix,
    }
}

/// `http(s)://host[:port]/…` → (host, port).
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, tail) = v6.split_once(']')?;
        let port = tail
            .strip_prefix(':')
            .map_or(Some(default), |p| p.parse().ok())?;
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

async fn daemon(ctx: &Ctx) -> Check {
    let what = "daemon".to_string();
    match crate::transport::conn_within(&ctx.socket, Duration::from_secs(3)).await {
        Ok(_) => Check {
            what,
            level: Level::Ok,
            detail: format!("answers on {}", ctx.socket.display()),
            fix: String::new(),
        },
        Err(e) => Check {
            what,
            level: Level::Warn,
            detail: format!("not running on {} ({e})", ctx.socket.display()),
            fix: "the next paddock command starts one (or run `paddock daemon`)".into(),
        },
    }
}

/// The drivers beyond `local`: whether this machine can make their environments (what
/// `session create` would check), each a warning when it cannot (they are optional).
fn drivers() -> Vec<Check> {
    use paddock_core::{Driver, EnvSpec};
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let check = |driver: Driver, spec: EnvSpec, ok: &str, fix: &str| -> Check {
        let what = format!("driver {driver}");
        match crate::env::check_host(&spec, &cwd) {
            Ok(()) => Check {
                what,
                level: Level::Ok,
                detail: ok.to_string(),
                fix: String::new(),
            },
            Err(e) => Check {
                what,
                level: Level::Warn,
                detail: e.to_string(),
                fix: fix.to_string(),
            },
        }
    };
    let spec = |driver| EnvSpec {
        driver,
        ..EnvSpec::default()
    };
    let mut out = vec![
        check(
            Driver::Bubblewrap,
            spec(Driver::Bubblewrap),
            "bwrap makes sandboxes here",
            "apt install bubblewrap (or your system's package), for --driver bubblewrap",
        ),
        check(
            Driver::Ssh,
            spec(Driver::Ssh),
            "the OpenSSH client is here (the host is checked at create)",
            "apt install openssh-client, for --driver ssh",
        ),
        check(
            Driver::Kubernetes,
            spec(Driver::Kubernetes),
            "a kubeconfig with a current context is here (the cluster is reached at create)",
            "point KUBECONFIG at your cluster's kubeconfig, for --driver kubernetes",
        ),
    ];
    let podman = crate::paths::find_on_own_path("podman");
    out.push(Check {
        what: "driver podman".into(),
        level: if podman.is_some() {
            Level::Ok
        } else {
            Level::Warn
        },
        detail: match &podman {
            Some(p) => format!("podman at {} (the image is checked at create)", p.display()),
            None => "podman is not on PATH".into(),
        },
        fix: if podman.is_some() {
            String::new()
        } else {
            "apt install runc podman, for --driver podman".into()
        },
    });
    let qemu = ["qemu-system-x86_64", "qemu-img"]
        .iter()
        .find(|p| crate::paths::find_on_own_path(p).is_none());
    let kvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    out.push(Check {
        what: "driver qemu".into(),
        level: if qemu.is_none() {
            Level::Ok
        } else {
            Level::Warn
        },
        detail: match qemu {
            None if kvm => "QEMU is here; /dev/kvm is usable (add -enable-kvm to the flags)".into(),
            None => "QEMU is here; no usable /dev/kvm: VMs are emulated (slower)".into(),
            Some(p) => format!("{p} is not on PATH"),
        },
        fix: if qemu.is_none() {
            String::new()
        } else {
            "apt install qemu-system-x86 qemu-utils, for --driver qemu".into()
        },
    });
    out
}

/// `paddock doctor`.
pub async fn run(ctx: &Ctx) -> Result<()> {
    let mut checks = Vec::new();
    for a in AGENTS {
        checks.push(agent(a).await);
    }
    checks.push(openai_api().await);
    checks.push(Check {
        what: "scripted (built in)".into(),
        level: Level::Ok,
        detail: "always available (no key, no network): `paddock demo`".into(),
        fix: String::new(),
    });
    checks.push(daemon(ctx).await);
    checks.push(Check {
        what: "driver local".into(),
        level: Level::Ok,
        detail: "agents run as supervised processes on this machine".into(),
        fix: String::new(),
    });
    checks.extend(
        tokio::task::spawn_blocking(drivers)
            .await
            .unwrap_or_default(),
    );
    let ready: Vec<&str> = checks
        .iter()
        .take(AGENTS.len() + 1)
        .filter(|c| c.level == Level::Ok)
        .map(|c| c.what.split(' ').next().unwrap_or(""))
        .collect();
    if ctx.json {
        let list: Vec<Value> = checks
            .iter()
            .map(|c| {
                json!({"check": c.what, "status": c.level.name(), "detail": c.detail, "fix": c.fix})
            })
            .collect();
        print_json(&json!({"checks": list, "ready_agents": ready}))?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| vec![c.what.clone(), c.level.name().to_string(), c.detail.clone()])
        .collect();
    outln!("{}", table(&["CHECK", "STATUS", "DETAIL"], &rows))?;
    let fixes: Vec<&Check> = checks.iter().filter(|c| !c.fix.is_empty()).collect();
    if !fixes.is_empty() {
        outln!()?;
        for c in fixes {
            outln!("{}: {}", c.what, c.fix)?;
        }
    }
    outln!()?;
    if ready.is_empty() {
        outln!("No real agent is ready here; `paddock demo` runs the built-in scripted agent.")?;
    } else {
        outln!("Ready: {}.", ready.join(", "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_and_port() {
        assert_eq!(
            host_port("https://api.openai.com/v1"),
            Some(("api.openai.com".into(), 443))
        );
        assert_eq!(
            host_port("http://localhost:11434/v1"),
            Some(("localhost".into(), 11434))
        );
        assert_eq!(host_port("http://[::1]:8080/"), Some(("::1".into(), 8080)));
        assert_eq!(host_port("http://u:p@h/"), Some(("h".into(), 80)));
        assert_eq!(host_port("ftp://h/"), None);
        assert_eq!(host_port("localhost:8080"), None);
    }
}
