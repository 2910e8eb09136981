//! A spawn that fails leaves no control group behind, and the spawning thread does not wait
//! for the group to empty. Its own test binary: the owner is set once per process.

use std::path::PathBuf;
use std::time::Instant;

use paddock_sys::contain::{self, Role};

/// The tree groups under this program's base group.
fn groups(base: &PathBuf) -> Vec<String> {
    std::fs::read_dir(base)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_failed_spawn_leaves_no_control_group() {
    let data = tempfile::tempdir().unwrap();
    contain::set_owner(data.path(), Role::Daemon);
    let root = nix::unistd::geteuid().is_root();
    // As root on a cgroup2 machine (CI) the groups are made; elsewhere there is nothing to leave.
    if root && std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        assert!(
            contain::has_cgroups(),
            "root on cgroup2 makes control groups"
        );
    }
    // A script whose interpreter does not exist: fork succeeds, exec fails after the child
    // moved itself into its group.
    let script = data.path().join("agent");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let t0 = Instant::now();
    for _ in 0..20 {
        let cmd = tokio::process::Command::new(&script);
        let spawned = paddock_sys::proc::spawn(cmd, false, contain::new_tag());
        assert!(spawned.is_err(), "the interpreter does not exist");
    }
    let took = t0.elapsed();
    if contain::has_cgroups() {
        let base =
            PathBuf::from(std::fs::read_to_string(data.path().join("cgroup-daemon")).unwrap());
        // Removed at once, or by the thread that waits for the group to empty.
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while !groups(&base).is_empty() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            groups(&base),
            Vec::<String>::new(),
            "no group left in {}",
            base.display()
        );
    }
    eprintln!(
        "20 failed spawns in {took:?} (control groups: {})",
        contain::has_cgroups()
    );
    contain::release();
}
