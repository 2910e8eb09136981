//! Reading a file a request names (a scripted agent's `script`, …): only a regular file inside
//! the campaign root, never more than a limit, and never blocking on what is not a file.
//!
//! A request must not be able to make the daemon read a FIFO (it would wait forever), a device
//! (`/dev/zero` never ends), or anything outside the root it was given (`..`, an absolute path,
//! or a symlink that leads out). The file is opened `O_NONBLOCK` and checked with `fstat` on the
//! descriptor it will read, so a path swapped between the check and the read cannot slip by.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0:?} must be a path relative to the campaign root, without ..")]
    NotRelative(String),
    #[error("{} leads outside the campaign root {}", path.display(), root.display())]
    Outside { path: PathBuf, root: PathBuf },
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    #[error("{} is {size} bytes; at most {max} are read", path.display())]
    TooBig { path: PathBuf, size: u64, max: u64 },
    #[error("{} is not UTF-8 text", .0.display())]
    NotText(PathBuf),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The text of `root/rel`, at most `max_bytes`, when it is a regular file inside `root`.
pub fn read(root: &Path, rel: &str, max_bytes: u64) -> Result<String, ReadError> {
    let relative = Path::new(rel);
    if rel.is_empty()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(ReadError::NotRelative(rel.to_string()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReadError::Io { path, source }
    };
    let root = root.canonicalize().map_err(io(root))?;
    let joined = root.join(relative);
    // Symlinks resolved: the file itself must still be under the root.
    let path = joined.canonicalize().map_err(io(&joined))?;
    if !path.starts_with(&root) {
        return Err(ReadError::Outside { path, root });
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(io(&path))?;
    let meta = file.metadata().map_err(io(&path))?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile(path));
    }
    if meta.len() > max_bytes {
        return Err(ReadError::TooBig {
            path,
            size: meta.len(),
            max: max_bytes,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded even if the file grows after the check.
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io(&path))?;
    if bytes.len() as u64 > max_bytes {
        return Err(ReadError::TooBig {
            path,
            size: bytes.len() as u64,
            max: max_bytes,
        });
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotText(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_inside_the_root_within_the_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/ok.json"), "{}").unwrap();
        std::fs::write(tmp.path().join("outside.json"), "{}").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("outside.json"), root.join("link.json"))
            .unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::write(root.join("big"), vec![b'x'; 100]).unwrap();

        assert_eq!(read(&root, "sub/ok.json", 10).unwrap(), "{}");
        assert_eq!(read(&root, "./sub/ok.json", 10).unwrap(), "{}");
        for bad in [
            "../outside.json",
            "/etc/passwd",
            "sub/../../outside.json",
            "",
        ] {
            assert!(
                matches!(read(&root, bad, 10), Err(ReadError::NotRelative(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            read(&root, "link.json", 10),
            Err(ReadError::Outside { .. })
        ));
        // A FIFO nobody writes to: refused at once, not waited on.
        let started = std::time::Instant::now();
        assert!(matches!(
            read(&root, "fifo", 10),
            Err(ReadError::NotAFile(_))
        ));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(matches!(
            read(&root, "big", 10),
            Err(ReadError::TooBig { size: 100, .. })
        ));
        assert!(matches!(
            read(&root, "missing", 10),
            Err(ReadError::Io { .. })
        ));
    }

    #[test]
    fn a_device_is_not_a_file() {
        // /dev/zero through a symlink inside the root: outside, and not a file either.
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", tmp.path().join("zero")).unwrap();
        assert!(read(tmp.path(), "zero", 10).is_err());
    }
}
