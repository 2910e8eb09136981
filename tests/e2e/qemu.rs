//! The qemu driver for real: a VM per session, booted by QEMU under software emulation (no
//! KVM needed) from a qcow2 image's overlay, reached over ssh, paddock copied in and a runner
//! started there, whole turns run in it; its delete stops the VM and removes its disk.
//!
//! The VM is built by the test from this machine's own files (`vm/make-initramfs.sh`: Debian's
//! kernel, busybox, sshd, the virtio network modules) and booted with the qemu block's flags
//! (`-kernel`, `-initrd`): its image is an empty qcow2 disk, since the system lives in RAM. A
//! user's image would boot from its own disk; the driver is the same. `.ci/run` installs
//! `qemu-system-x86`, `linux-image-amd64`, `busybox-static`, `cpio` and `kmod`; without them
//! these tests fail, they do not skip.
//!
//! They are `#[ignore]`d in `cargo test --workspace`: an emulated VM keeps a core busy for
//! seconds, which starves the timing-sensitive tests running beside it on a 2-core machine.
//! `.ci/run` runs them right after, one at a time:
//! `cargo test -p paddock --test e2e qemu:: -- --include-ignored --test-threads 1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;

use crate::environments::processes_with;
use crate::harness::*;

/// The test VM's files.
struct Vm {
    /// The test's directory: every VM the test's daemon starts names it (the disk, the pid
    /// file), and whatever still runs when the test ends is stopped.
    base: PathBuf,
    kernel: PathBuf,
    initrd: PathBuf,
    image: PathBuf,
    key: PathBuf,
}

impl Vm {
    fn build(base: &Path) -> Vm {
        let dir = base.join("vm");
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        crate::ssh::keygen(&key);
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/vm/make-initramfs.sh");
        let out = Command::new("sh")
            .arg(&script)
            .arg(&dir)
            .arg(dir.join("key.pub"))
            .arg(BIN)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "make-initramfs.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let image = dir.join("base.qcow2");
        let st = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&image)
            .arg("64M")
            .status()
            .expect("qemu-img (qemu-utils)");
        assert!(st.success());
        Vm {
            base: base.to_path_buf(),
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            image,
            key,
        }
    }

    /// A session's environment on this VM's image, logging in with `key`.
    fn spec(&self, key: &Path) -> pb::SessionEnvironment {
        pb::SessionEnvironment {
            driver: "qemu".into(),
            image: self.image.display().to_string(),
            memory_bytes: 1 << 30,
            qemu: Some(pb::QemuOptions {
                cpus: 1,
                flags: vec![
                    "-kernel".into(),
                    self.kernel.display().to_string(),
                    "-initrd".into(),
                    self.initrd.display().to_string(),
                    "-append".into(),
                    "console=ttyS0 quiet".into(),
                ],
            }),
            ssh: Some(pb::SshTarget {
                user: "root".into(),
                key_file: key.display().to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        for pid in qemus_under(&self.base) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The QEMU processes whose command line names `dir`.
fn qemus_under(dir: &Path) -> Vec<u32> {
    qemus_with(&dir.display().to_string())
}

/// The QEMU processes whose command line contains `needle`.
fn qemus_with(needle: &str) -> Vec<u32> {
    processes_with(needle)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("qemu-system")
        })
        .collect()
}

/// The VMs of session `id` that run (QEMU carries `-name paddock-<id>`).
fn vms_of(id: &str) -> Vec<u32> {
    qemus_with(&format!("paddock-{id}"))
}

/// A daemon whose start-up timeout leaves room for an emulated boot and the copy of a debug
/// build of paddock into the VM.
async fn daemon() -> Daemon {
    Daemon::start_with(Dirs::new(), &["--startup-timeout-secs", "240"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots an emulated VM: .ci/run runs it after the other tests, alone"]
async fn a_session_runs_in_a_vm_of_its_own_and_its_delete_removes_the_vm() {
    let mut d = daemon().await;
    let vm = Vm::build(&d.dirs.base);
    let image_before = std::fs::read(&vm.image).unwrap();
    let mut req = d.request(None).await;
    req.environment_spec = Some(vm.spec(&vm.key));
    let s = within_boot(d.create(req)).await;
    let id = s.id.clone();
    assert_eq!(status_name(s.status), "RUNNING", "{s:?}");
    let env_root = d.dirs.data.join("environments").join(&id);
    let log = std::fs::read_to_string(env_root.join("environment.log")).unwrap();
    for want in [
        "qemu: disk",
        "an overlay of qcow2 image",
        "VM paddock-",
        "the VM answers ssh",
        "copied paddock",
        "runner on",
    ] {
        assert!(log.contains(want), "{want}: {log}");
    }
    assert_eq!(vms_of(&id).len(), 1, "one VM for the session");
    // The image is never written: the session's disk is an overlay.
    assert!(env_root.join("disk.qcow2").is_file());

    // A turn, and a command: both run in the VM (its kernel is the test's, not the host's).
    let acts = d.send(&id, "hello").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");
    let o = crate::environments::exec_sh(
        &d,
        &id,
        "uname -r; cat /proc/cmdline; cat /proc/sys/kernel/random/boot_id",
    )
    .await;
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert!(
        !o.stdout.contains(host_boot.trim()),
        "ran on the host: {o:?}"
    );
    assert_eq!(o.code, 0, "{o:?}");
    let kver = std::fs::read_dir("/boot")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("vmlinuz-")
                .map(str::to_string)
        })
        .max()
        .unwrap();
    assert!(o.stdout.contains(&kver), "{o:?}");
    assert!(o.stdout.contains("console=ttyS0"), "{o:?}");

    // The daemon killed: the VM runs on (nobody's child), the restarted daemon takes the
    // session back, and a turn runs in the same VM.
    let vm_pids = vms_of(&id);
    d.kill9();
    d.launch().await;
    assert_eq!(status_name(d.get(&id).await.status), "RUNNING");
    assert_eq!(vms_of(&id), vm_pids, "the same VM");
    let acts = d.send(&id, "again").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");

    // What status and logs say of it.
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "status", &id]).await;
    assert!(o.stdout.contains("qemu (VM from"), "{o:?}");
    let o =
        crate::latis::cli_in(&d, &d.dirs.root, &["session", "logs", "--environment", &id]).await;
    assert!(o.stdout.contains("paddock test VM: sshd started"), "{o:?}");

    assert!(
        std::fs::read(&vm.image).unwrap() == image_before,
        "the image was written"
    );

    // Deleted: the VM stops and its directory goes.
    let o = crate::latis::cli_in(&d, &d.dirs.root, &["session", "delete", "--yes", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    within(async {
        while !vms_of(&id).is_empty() || env_root.exists() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "boots an emulated VM: .ci/run runs it after the other tests, alone"]
async fn bad_qemu_configurations_refuse_the_create_and_leave_no_vm() {
    let mut d = daemon().await;
    let vm = Vm::build(&d.dirs.base);
    // Refused before anything is made.
    let cases: Vec<(pb::SessionEnvironment, &str)> = vec![
        (
            pb::SessionEnvironment {
                image: String::new(),
                ..vm.spec(&vm.key)
            },
            "needs an image",
        ),
        (
            pb::SessionEnvironment {
                image: d.dirs.base.join("nope.qcow2").display().to_string(),
                ..vm.spec(&vm.key)
            },
            "is not a file",
        ),
        (
            pb::SessionEnvironment {
                worktree: true,
                ..vm.spec(&vm.key)
            },
            "not for the qemu driver",
        ),
    ];
    for (spec, reason) in cases {
        let mut req = d.request(None).await;
        req.environment_spec = Some(spec);
        crate::ssh::assert_refused(&d, req, reason).await;
    }
    // A key the VM does not take: it boots, refuses the login, and is stopped again.
    let stranger = d.dirs.base.join("stranger");
    crate::ssh::keygen(&stranger);
    let mut req = d.request(None).await;
    req.environment_spec = Some(vm.spec(&stranger));
    let e = within_boot(d.client().await.create_session(req))
        .await
        .expect_err("refused");
    assert!(e.message().contains("Permission denied"), "{e:?}");
    assert!(d.all_sessions().await.is_empty());
    // Its VM (QEMU's -pidfile names this daemon's data dir) is gone with it.
    within(async {
        while !qemus_under(&d.dirs.data).is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// An emulated boot and a copy of the debug binary take their time.
async fn within_boot<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(240), f)
        .await
        .expect("the VM did not come up within 240 s")
}
