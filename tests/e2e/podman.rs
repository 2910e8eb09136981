//! The podman driver for real: a container per session from a root directory, an image
//! archive or a root tarball the test builds (no registry is reachable here); the agent and
//! `session exec` run in it (`podman exec`); the sandbox holds (no write outside the
//! workspace, no HOME secret, no loopback or daemon socket without network, no more processes
//! than its limit); stop, forced stop, a killed daemon and delete leave nothing running; and
//! what the host cannot give is refused before anything is made.
//!
//! These need podman (Debian's `podman`, with `runc` and `catatonit`); `.ci/run` installs
//! them. Without podman they fail, they do not skip.

use std::path::{Path, PathBuf};
use std::process::Command;

use paddock_proto::obey::local::v1 as pb;

use crate::environments::{
    assert_cannot_fork_past, assert_kept_in, escaping_agent, exec_sh, first_turn_done, git,
    make_repo, processes_with, report, wait_until_gone,
};
use crate::harness::*;
use crate::latis::{cli_in, created_id};

/// Removes, when dropped, every container the daemon of `data` made (by the sessions its
/// environments directory names): a failing test leaves no container running.
pub(crate) struct Containers(pub(crate) PathBuf);

impl Drop for Containers {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.0.join("environments")) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().to_string();
            let id = id.trim_start_matches(".removing-");
            let _ = Command::new("podman")
                .args([
                    "rm",
                    "--force",
                    "--time=0",
                    "--ignore",
                    &format!("paddock-{id}"),
                ])
                .output();
        }
    }
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman").args(args).output().expect("podman");
    assert!(out.status.success(), "podman {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn container_state(id: &str) -> Option<String> {
    let out = Command::new("podman")
        .args([
            "container",
            "inspect",
            "--format",
            "{{.State.Status}}",
            &format!("paddock-{id}"),
        ])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A root directory whose `/usr` is the host's, mounted read-only by the session's podman
/// block (so the container has the host's programs, python and all, and nothing else of it).
fn skeleton_root(base: &Path) -> PathBuf {
    let root = base.join("rootfs");
    for d in ["usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    for f in ["passwd", "group"] {
        std::fs::copy(Path::new("/etc").join(f), root.join("etc").join(f)).unwrap();
    }
    root
}

/// A small root filesystem of its own: a shell, a few tools, paddock's binary's libraries (the
/// scripted agent is paddock), as a tarball.
pub(crate) fn root_tarball(base: &Path) -> PathBuf {
    let root = base.join("tiny");
    for d in ["usr/bin", "usr/lib", "usr/lib64", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    let tools = ["dash", "cat", "ls", "sleep", "id", "touch", "env"];
    let mut files: Vec<PathBuf> = tools
        .iter()
        .map(|t| Path::new("/usr/bin").join(t))
        .collect();
    for bin in files.clone().iter().chain([PathBuf::from(BIN)].iter()) {
        let out = Command::new("ldd").arg(bin).output().unwrap();
        for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.push(PathBuf::from(word));
            }
        }
    }
    for f in files {
        // Libraries land where the loader looks for them (/lib → usr/lib in the tarball).
        let real = f.canonicalize().unwrap();
        let rel = f.strip_prefix("/").unwrap();
        let rel = if rel.starts_with("usr") {
            rel.to_path_buf()
        } else {
            Path::new("usr").join(rel)
        };
        std::fs::create_dir_all(root.join(&rel).parent().unwrap()).unwrap();
        std::fs::copy(&real, root.join(&rel)).unwrap();
    }
    std::os::unix::fs::symlink("dash", root.join("usr/bin/sh")).unwrap();
    let tar = base.join("tiny.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
    tar
}

/// A session file for the podman driver with `block` as its podman block.
fn session_file(d: &Daemon, name: &str, block: &str) -> String {
    let path = d.dirs.base.join(name);
    std::fs::write(&path, format!("driver: podman\npodman:\n{block}")).unwrap();
    path.display().to_string()
}

/// Creates a podman session from `session.yaml` with `block` (after the image, a skeleton
/// root with the host's /usr) whose agent is [`escaping_agent`]; its id once the agent
/// finished its first turn.
async fn create_escaping(d: &Daemon, port: u16, marker: &str, block: &str) -> String {
    let root = skeleton_root(&d.dirs.base);
    let file = session_file(
        d,
        "session.yaml",
        &format!(
            "  image: {}\n  mounts: [\"/usr:/usr:ro\"]\n{block}",
            root.display()
        ),
    );
    let command = format!("command={}", escaping_agent(d, port, marker));
    let args = [
        "session",
        "create",
        "-c",
        &file,
        "--provider",
        "claude-code",
        "--config",
        &command,
        "--task",
        "hello",
    ];
    let o = cli_in(d, &d.dirs.root, &args).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("podman driver"), "{o:?}");
    let id = created_id(&o);
    first_turn_done(d, &id).await;
    id
}

/// `session create --driver podman --image <image>` of the scripted agent.
async fn create_from(d: &Daemon, image: &str) -> crate::cli::Out {
    let args = [
        "session",
        "create",
        "--driver",
        "podman",
        "--image",
        image,
        "--provider",
        "scripted",
        "--task",
        "hello",
    ];
    cli_in(d, &d.dirs.root, &args).await
}

/// `session create -c <file>` of the scripted agent.
async fn create_scripted_from_file(d: &Daemon, file: &str) -> crate::cli::Out {
    let args = [
        "session",
        "create",
        "-c",
        file,
        "--provider",
        "scripted",
        "--task",
        "hi",
    ];
    cli_in(d, &d.dirs.root, &args).await
}

/// Waits until session `id`'s container is gone.
async fn wait_container_gone(id: &str) {
    for _ in 0..200 {
        if container_state(id).is_none() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!(
        "container paddock-{id} is still there: {:?}",
        container_state(id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_keeps_the_agent_in_its_container_and_ends_all_it_started() {
    let d = Daemon::start().await;
    let _cleanup = Containers(d.dirs.data.clone());
    std::fs::create_dir_all(d.dirs.home.join(".ssh")).unwrap();
    std::fs::write(d.dirs.home.join(".ssh/id_rsa"), "PRIVATE KEY").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("{}", 700_000 + std::process::id() % 90_000);
    let id = create_escaping(
        &d,
        port,
        &marker,
        "  env:\n    FROM_BLOCK: yes-it-is\n  pids: 32\n  memory: 256m\n",
    )
    .await;
    let info = d.get(&id).await;
    let env = info.environment_spec.as_ref().unwrap();
    assert_eq!(
        (env.driver.as_str(), env.pids_limit, env.memory_bytes),
        ("podman", 32, 256 << 20)
    );
    assert_eq!(info.environment_state, "ready");
    assert_eq!(container_state(&id).as_deref(), Some("running"));

    assert_kept_in(&d, &marker);

    // `session exec` runs in the same container: the block's variable, the limits.
    let o = exec_sh(
        &d,
        &id,
        "echo v=$FROM_BLOCK; cat ~/.ssh/id_rsa; echo in=$(pwd); cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null; true",
    )
    .await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("v=yes-it-is"), "{o:?}");
    assert!(!o.stdout.contains("PRIVATE KEY"), "{o:?}");
    assert!(
        o.stdout.contains(&format!("in={}", d.dirs.root.display())),
        "{o:?}"
    );
    assert!(o.stdout.lines().any(|l| l.trim() == "32"), "{o:?}");
    // No more processes than the limit: the 33rd fork fails.
    assert_cannot_fork_past(&d, &id, 32).await;
    let o = exec_sh(&d, &id, "exit 7").await;
    assert_eq!(o.code, 7, "exec exits with the command's code: {o:?}");

    // list and logs say what the driver did.
    let o = cli_in(&d, &d.dirs.root, &["session", "list"]).await;
    assert!(
        o.stdout
            .lines()
            .any(|l| l.contains(&id) && l.contains("podman")),
        "{o:?}"
    );
    let o = cli_in(&d, &d.dirs.root, &["session", "status", &id]).await;
    assert!(
        o.stdout
            .contains(&format!("podman (container paddock-{id} from "))
            && o.stdout.contains("memory 256 MiB; at most 32 processes"),
        "{o:?}"
    );
    let o = cli_in(&d, &d.dirs.root, &["session", "logs", "--environment", &id]).await;
    assert!(
        o.stdout.contains(&format!("podman container paddock-{id}"))
            && o.stdout
                .contains(&format!("container paddock-{id}: running"))
            && o.stdout.contains(&format!("podman logs paddock-{id}:")),
        "{o:?}"
    );

    // A forced stop ends everything the agent started, its setsid'ed job included.
    let o = cli_in(&d, &d.dirs.root, &["session", "stop", "--force", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_until_gone(&format!("sleep {marker}")).await;

    // Delete removes the container and the environment.
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_container_gone(&id).await;
    assert!(!d.dirs.data.join("environments").join(&id).exists());
    assert!(processes_with("sleep 30").iter().all(|p| {
        // The fork test's sleeps were in the container: gone with it.
        !std::fs::read_to_string(format!("/proc/{p}/environ")).is_ok_and(|e| e.contains(&id))
    }));
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_outlives_a_killed_daemon_and_goes_with_its_delete() {
    let mut d = Daemon::start().await;
    let _cleanup = Containers(d.dirs.data.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("{}", 600_000 + std::process::id() % 90_000);
    let published = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let block = format!("  network: true\n  ports: [\"127.0.0.1:{published}:8080\"]\n");
    let id = create_escaping(&d, port, &marker, &block).await;
    // With network, the container has podman's network: the host's loopback is still not
    // reachable (it is the container's own), nor the daemon's socket.
    let r = report(&d);
    assert!(
        r.contains("reach-loopback: no") && r.contains("reach-daemon: no"),
        "{r}"
    );
    // The block's port: a server in the container answers on the host's published port.
    let o = cli_in(
        &d,
        &d.dirs.root,
        &[
            "task",
            "launch",
            "--session",
            &id,
            "--",
            "python3",
            "-m",
            "http.server",
            "8080",
        ],
    )
    .await;
    assert_eq!(o.code, 0, "{o:?}");
    let mut answered = String::new();
    for _ in 0..100 {
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", published)) {
            let _ = c.write_all(b"GET / HTTP/1.0\r\n\r\n");
            let _ = c.read_to_string(&mut answered);
            if answered.starts_with("HTTP/1.0 200") {
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(answered.starts_with("HTTP/1.0 200"), "{answered:?}");

    d.kill9();
    d.launch().await;
    let info = d.get(&id).await;
    assert_eq!(
        info.status,
        pb::SessionStatus::Running as i32,
        "adopted after the restart"
    );
    assert_eq!(container_state(&id).as_deref(), Some("running"));
    assert!(!processes_with(&format!("sleep {marker}")).is_empty());
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_until_gone(&format!("sleep {marker}")).await;
    wait_container_gone(&id).await;
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_archives_root_tarballs_or_references_and_bad_ones_are_refused() {
    let d = Daemon::start().await;
    let _cleanup = Containers(d.dirs.data.clone());
    let tarball = root_tarball(&d.dirs.base);
    // An image archive (what `podman save` writes), loaded by the daemon.
    let tag = format!("localhost/paddock-e2e:{}", std::process::id());
    podman(&["import", "-q", &tarball.display().to_string(), &tag]);
    let archive = d.dirs.base.join("image.tar");
    podman(&["save", "-q", "-o", &archive.display().to_string(), &tag]);
    podman(&["rmi", &tag]);
    let id = {
        let o = create_from(&d, &archive.display().to_string()).await;
        assert_eq!(o.code, 0, "{o:?}");
        created_id(&o)
    };
    first_turn_done(&d, &id).await;
    let o = exec_sh(&d, &id, "ls /usr/bin; id -u").await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("cat"),
        "the tiny image's own /usr/bin: {o:?}"
    );
    // A plain root tarball is imported; the same image by reference needs nothing loaded.
    let o = create_from(&d, &tarball.display().to_string()).await;
    assert_eq!(o.code, 0, "{o:?}");
    first_turn_done(&d, &created_id(&o)).await;
    let o = create_from(&d, &tag).await;
    assert_eq!(o.code, 0, "the archive's image is there now: {o:?}");
    first_turn_done(&d, &created_id(&o)).await;
    let before = d.all_sessions().await.len();

    // Refused before anything is made: no image, a missing one (nothing to pull from here),
    // a directory that is no root, an image with another driver, limits on the host.
    for (args, says) in [
        (vec!["--driver", "podman"], "needs an image"),
        (
            vec!["--driver", "podman", "--image", "localhost/no-such-image:0"],
            "cannot pull image",
        ),
        (
            vec!["--driver", "podman", "--image", "./"],
            "not a root directory",
        ),
        (vec!["--image", "x"], "an image is for containers"),
        (vec!["--pids", "5"], "limits need an isolating driver"),
    ] {
        let mut all = vec!["session", "create", "--provider", "scripted", "--task", "x"];
        all.extend(args.iter());
        let o = cli_in(&d, &d.dirs.root, &all).await;
        assert_ne!(o.code, 0, "{args:?}: {o:?}");
        assert!(o.stderr.contains(says), "{args:?}: {says:?} not in {o:?}");
    }
    // A mount that would undo the container: refused, nothing made.
    let file = session_file(
        &d,
        "home.yaml",
        &format!(
            "  image: {}\n  mounts: [\"{}:/h:ro\"]\n",
            tarball.display(),
            d.dirs.home.display()
        ),
    );
    let o = create_scripted_from_file(&d, &file).await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("holds your home directory"), "{o:?}");
    assert_eq!(d.all_sessions().await.len(), before, "no half-made session");
    drop(d);
    drop(_cleanup);
    // The images this test made (the archive's, and the tarball's import).
    let imported = podman(&[
        "images",
        "--quiet",
        "--filter",
        "reference=localhost/paddock-import",
    ]);
    for image in [tag.as_str()].into_iter().chain(imported.lines()) {
        let _ = Command::new("podman")
            .args(["rmi", "--force", image])
            .output();
    }

    // podman missing on the host: said, with what to install.
    let d = Daemon::start_with_env(Dirs::new(), &[], &[("PATH", "/nonexistent")]).await;
    let o = create_from(&d, &tarball.display().to_string()).await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("OBEY-2005") && o.stderr.contains("install the `podman` package"),
        "{o:?}"
    );
    assert!(d.all_sessions().await.is_empty());
}

/// A worktree in a container: the agent commits on its own branch from inside, `session diff`
/// on the host shows it, and the repository's other branches stay out of its reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_works_in_its_own_worktree() {
    let d = Daemon::start().await;
    let _cleanup = Containers(d.dirs.data.clone());
    std::fs::write(d.dirs.root.join("README.md"), "hello\n").unwrap();
    make_repo(&d.dirs.root);
    let root = skeleton_root(&d.dirs.base);
    let file = session_file(
        &d,
        "wt.yaml",
        &format!(
            "  image: {}\n  mounts: [\"/usr:/usr:ro\"]\nworktree: true\nname: boxed\n",
            root.display()
        ),
    );
    let id = {
        let o = create_scripted_from_file(&d, &file).await;
        assert_eq!(o.code, 0, "{o:?}");
        created_id(&o)
    };
    first_turn_done(&d, &id).await;
    let o = exec_sh(
        &d,
        &id,
        "echo more >> README.md && git -c user.email=a@b -c user.name=agent commit -qam 'from the container' && git branch --show-current; git update-ref refs/heads/main HEAD || echo main-is-read-only",
    )
    .await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("paddock/boxed"), "{o:?}");
    assert!(o.stdout.contains("main-is-read-only"), "{o:?}");
    let o = cli_in(&d, &d.dirs.root, &["session", "diff", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("+more"), "{o:?}");
    assert_eq!(
        git(&d.dirs.root, &["log", "-1", "--format=%s", "paddock/boxed"]),
        "from the container"
    );
    assert_eq!(
        git(&d.dirs.root, &["log", "-1", "--format=%s", "main"]),
        "initial"
    );
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
}
