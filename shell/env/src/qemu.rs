//! The `qemu` driver: a virtual machine of the session's own, reached over ssh like the `ssh`
//! driver's machine (the same provisioning, runner and relay: [`super::ssh`]).
//!
//! - Made at create (and again at a start that finds it gone, a host reboot): an overlay disk
//!   `disk.qcow2` over the session's image (the image itself is never written), then
//!   `qemu-system-x86_64 -daemonize` with the block's memory (default 1 GiB), processors and
//!   flags, the console in `console.log`, and user-mode networking whose only way in is the
//!   VM's ssh port forwarded to a free port on 127.0.0.1 (`restrict=on` unless the session
//!   asked for network: then the VM reaches out through the host's NAT). The VM outlives the
//!   daemon (it is nobody's child), so a daemon restart finds it, like a podman container.
//! - Reached: ssh to that port as the block's user with its key; the VM's host key is taken at
//!   its first boot and held to for the session's life (a known_hosts of the session's own).
//!   Then paddock is copied in and a runner started there, as for `ssh`.
//! - Removed with the session: the VM is stopped (TERM, KILL after `STOP_WAIT`) and its
//!   directory (overlay, console, known_hosts) removed; a daemon start stops the VMs of
//!   sessions the store no longer has.
//!
//! KVM is not asked for by default (`-enable-kvm` in the flags asks; without it QEMU emulates
//! the processor, which works everywhere and is slower).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use paddock_core::{EnvSpec, SshTarget};

use super::{Error, Made, Result};

/// How long a booting VM may take to answer ssh (the session's start-up timeout bounds the
/// whole making too).
const BOOT_WAIT: Duration = Duration::from_secs(300);
/// How long a stopped VM is given after TERM before it is killed: the one grace (QEMU ends at
/// once on TERM; only a hung one waits it out).
const STOP_WAIT: Duration = Duration::from_millis(paddock_core::process::KILL_GRACE.millis());
/// A VM's memory unless the block says.
const DEFAULT_MEMORY: u64 = 1 << 30;

/// QEMU's `qemu-system-x86_64`.
const QEMU: (&str, &str) = ("qemu-system-x86_64", "the `qemu-system-x86` package");
/// `qemu-img`.
const QEMU_IMG: (&str, &str) = ("qemu-img", "the `qemu-utils` package");

/// `program` (its name, and what to install for it), or what to install.
fn program((program, install): (&'static str, &'static str)) -> Result<PathBuf> {
    paddock_sys::paths::find_on_own_path(program).ok_or(Error::NotInstalled {
        needed_by: "the qemu driver",
        program,
        install,
    })
}

/// What the host lacks for a qemu session: QEMU itself, `qemu-img`, the image.
pub fn check_host(image: &str) -> Result<()> {
    program(QEMU)?;
    program(QEMU_IMG)?;
    if !Path::new(image).is_file() {
        return Err(Error::Refused(format!(
            "the qemu image {image} is not a file"
        )));
    }
    Ok(())
}

/// How paddock reaches the VM of the environment at `root`: ssh to its forwarded port, as the
/// block's user, its host key pinned at first sight in the session's own known_hosts.
pub fn target(spec: &EnvSpec, root: &Path, made: &Made) -> SshTarget {
    SshTarget {
        host: "127.0.0.1".into(),
        port: made.vm_port.unwrap_or(0),
        known_hosts: root.join("known_hosts").display().to_string(),
        accept_new_host_key: true,
        ..spec.ssh().clone()
    }
}

/// The session id an environment directory belongs to (a directory being removed included).
fn session_of(root: &Path) -> String {
    let name = root
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    name.strip_prefix(super::TRASH).unwrap_or(&name).to_string()
}

/// The pid of the environment's VM, if it runs: the pid file's process, if it is a QEMU
/// that carries the session's name (a recycled pid is not taken for it).
pub fn vm_pid(root: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(root.join("qemu.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline);
    let name = format!("paddock-{}", session_of(root));
    (cmdline.contains("qemu") && cmdline.split('\0').any(|a| a == name)).then_some(pid)
}

/// Whether the environment's VM runs.
pub fn running(root: &Path) -> bool {
    vm_pid(root).is_some()
}

/// Stops VM `pid` (TERM, KILL after `STOP_WAIT`). Blocking: call it off the event loop.
/// The KILL goes only to a QEMU still: a pid freed in between is not another's to kill.
pub fn kill(pid: i32) {
    use nix::sys::signal::{kill, Signal};
    let is_qemu = || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("qemu"))
    };
    let p = nix::unistd::Pid::from_raw(pid);
    if !is_qemu() || kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + STOP_WAIT;
    while Instant::now() < deadline {
        if !is_qemu() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if is_qemu() {
        let _ = kill(p, Signal::SIGKILL);
    }
}

/// A free TCP port on 127.0.0.1 (for the VM's ssh).
fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::Failed(format!("cannot find a free port on 127.0.0.1: {e}")))
}

/// Runs a program to its end; its stdout, or its stderr as the error.
fn run(program: &Path, args: &[String]) -> Result<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::spawn(program, e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(Error::Failed(format!(
            "{} failed ({}): {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Makes the session's VM run (its overlay disk first, once); [`wait_ready`] waits for it.
/// Returns the port on 127.0.0.1 that reaches its ssh. A VM that runs already is kept.
pub fn start(spec: &EnvSpec, root: &Path, log: &dyn Fn(&str)) -> Result<u16> {
    if running(root) {
        if let Some(port) = Made::read(root).and_then(|m| m.vm_port) {
            return Ok(port);
        }
    }
    let image = std::path::absolute(&spec.image)
        .map_err(|e| Error::Refused(format!("the qemu image {}: {e}", spec.image)))?;
    let disk = root.join("disk.qcow2");
    if !disk.exists() {
        let img = program(QEMU_IMG)?;
        let info = run(
            &img,
            &[
                "info".into(),
                "--output=json".into(),
                image.display().to_string(),
            ],
        )?;
        let format = serde_json::from_str::<serde_json::Value>(&info)
            .ok()
            .and_then(|v| v.get("format")?.as_str().map(str::to_string))
            .unwrap_or_else(|| "qcow2".into());
        run(
            &img,
            &[
                "create".into(),
                "-q".into(),
                "-f".into(),
                "qcow2".into(),
                "-F".into(),
                format.clone(),
                "-b".into(),
                image.display().to_string(),
                disk.display().to_string(),
            ],
        )?;
        log(&format!(
            "qemu: disk {} (an overlay of {} image {}: the image is never written)",
            disk.display(),
            format,
            image.display()
        ));
    }
    let port = free_port()?;
    let guest_port = if spec.ssh().port > 0 {
        spec.ssh().port
    } else {
        22
    };
    let memory = if spec.memory_bytes > 0 {
        spec.memory_bytes
    } else {
        DEFAULT_MEMORY
    };
    let cpus = spec.qemu().cpus.max(1);
    let mut args: Vec<String> = vec![
        "-name".into(),
        format!("paddock-{}", session_of(root)),
        "-m".into(),
        format!("{}M", (memory >> 20).max(64)),
        "-smp".into(),
        cpus.to_string(),
        "-display".into(),
        "none".into(),
        "-daemonize".into(),
        "-pidfile".into(),
        root.join("qemu.pid").display().to_string(),
        "-serial".into(),
        format!("file:{}", root.join("console.log").display()),
        "-drive".into(),
        format!("file={},if=virtio,format=qcow2", disk.display()),
        "-netdev".into(),
        format!(
            "user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:{guest_port}{}",
            if spec.network { "" } else { ",restrict=on" }
        ),
        "-device".into(),
        "virtio-net-pci,netdev=net0".into(),
    ];
    args.extend(spec.qemu().flags.iter().cloned());
    let qemu = program(QEMU)?;
    // Kept: a VM found stopped (a host reboot) is started again the same way, same port.
    let saved = serde_json::to_string(&args).expect("a list of strings is JSON");
    std::fs::write(root.join("qemu.args"), saved)
        .map_err(|e| Error::file("write", root.join("qemu.args"), e))?;
    // -daemonize: QEMU answers once the VM is set up, and the VM is nobody's child.
    run(&qemu, &args)?;
    log(&format!(
        "qemu: VM paddock-{} started (pid {}): {} MiB, {cpus} cpu(s), network {}, ssh on \
         127.0.0.1:{port}; its console is {}",
        session_of(root),
        vm_pid(root).map_or("?".to_string(), |p| p.to_string()),
        memory >> 20,
        if spec.network { "on" } else { "off" },
        root.join("console.log").display()
    ));
    Ok(port)
}

/// Starts the environment's VM again as [`start`] first started it (same disk, same port),
/// if it is not running: a host reboot stopped it. Its ssh is then waited for by whoever
/// connects (the relay retries).
pub fn restart(root: &Path) -> Result<()> {
    if running(root) {
        return Ok(());
    }
    let file = root.join("qemu.args");
    let args: Vec<String> = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| {
            Error::Failed(format!(
                "the VM's command line ({}) is gone",
                file.display()
            ))
        })?;
    let qemu = program(QEMU)?;
    run(&qemu, &args).map_err(|e| e.during("cannot start the session's VM again"))?;
    Ok(())
}

/// Waits until the VM that [`start`] started answers ssh: a refused or reset connection is a
/// VM still booting; a refused login is an error at once.
pub fn wait_ready(spec: &EnvSpec, root: &Path, made: &Made, log: &dyn Fn(&str)) -> Result<()> {
    wait_for_ssh(&target(spec, root, made), root)?;
    log("qemu: the VM answers ssh");
    Ok(())
}

fn wait_for_ssh(t: &SshTarget, root: &Path) -> Result<()> {
    let deadline = Instant::now() + BOOT_WAIT;
    loop {
        match super::ssh::run(t, "true", None) {
            Ok(_) => return Ok(()),
            // A refused login is not a VM still booting (ssh's own words).
            Err(e) if matches!(&e, Error::Unreachable { said, .. } if said.contains("Permission denied")) => {
                return Err(e)
            }
            Err(e) => {
                if !running(root) {
                    return Err(Error::Failed(format!(
                        "the VM stopped while it booted; its console ends with:\n{}",
                        console_tail(root, 20)
                    )));
                }
                if Instant::now() >= deadline {
                    return Err(Error::Failed(format!(
                        "the VM did not answer ssh within {} s ({e}); its console ends with:\n{}",
                        BOOT_WAIT.as_secs(),
                        console_tail(root, 20)
                    )));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The last `n` lines of the VM's console.
pub fn console_tail(root: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(root.join("console.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
