//! Claiming a Unix socket, the same way for every paddock server (the daemon, the runner).
//!
//! Access control is the file system's: the socket's directory is created 0700 and the socket
//! is 0600, so only the owner can connect (no auth in the gRPC layer).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::UnixListener;

/// Creates the socket's directory (0700, when it does not exist) and binds the socket (0600).
/// A socket something still answers on is refused ("another `who` is already listening"); a
/// stale one (nothing answers) is replaced.
pub fn bind(path: &Path, who: &str) -> Result<UnixListener, String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create socket dir {}: {e}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
    }
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "another {who} is already listening on {}",
                    path.display()
                ))
            }
            Err(_) => {
                tracing::info!("replacing stale socket {}", path.display());
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
            }
        }
    }
    // Bind with a restrictive umask so the socket is never reachable by others, not even for a
    // moment, then make the mode explicit.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn modes_stale_sockets_and_live_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub").join("x.sock");
        let l = bind(&path, "test server").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        let err = bind(&path, "test server").unwrap_err();
        assert!(
            err.contains("another test server is already listening"),
            "{err}"
        );
        drop(l); // the file stays, nobody answers: stale
        assert!(path.exists());
        let _l = bind(&path, "test server").unwrap();
    }
}
