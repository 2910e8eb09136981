//! The scripted agent's built-in tools, run for real: `LS` and `Read` (see the module docs of
//! [`super`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// At most this many directory entries are listed.
pub const LIST_MAX: usize = 200;
/// `Read` returns at most this many bytes of a file.
pub const READ_MAX: usize = 256 * 1024;

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        "entry"
    } else {
        "entries"
    }
}

/// (number of entries, the first [`LIST_MAX`] names sorted, directories with a trailing `/`).
pub fn list_dir(path: &Path) -> io::Result<(usize, Vec<String>)> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = match entry.file_type() {
            Ok(t) if t.is_symlink() => fs::metadata(entry.path())
                .map(|m| m.is_dir())
                .unwrap_or(false),
            Ok(t) => t.is_dir(),
            Err(_) => false,
        };
        if is_dir {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    let total = names.len();
    names.truncate(LIST_MAX);
    Ok((total, names))
}

pub fn listing_text(total: usize, names: &[String]) -> String {
    let mut s = names.join("\n");
    if total > names.len() {
        s.push_str(&format!("\n… and {} more", total - names.len()));
    }
    s
}

/// Runs a tool for real: (result text, is_error).
pub fn run_tool(name: &str, input: &Value, cwd: &Path) -> (String, bool) {
    let resolve = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        }
    };
    match name {
        "LS" => {
            let path = input
                .get("path")
                .and_then(Value::as_str)
                .map(resolve)
                .unwrap_or_else(|| cwd.to_path_buf());
            match list_dir(&path) {
                Ok((total, names)) => (listing_text(total, &names), false),
                Err(e) => (format!("{}: {e}", path.display()), true),
            }
        }
        "Read" => {
            let Some(p) = input.get("file_path").and_then(Value::as_str) else {
                return ("Read needs \"file_path\"".into(), true);
            };
            let path = resolve(p);
            match fs::read(&path) {
                Ok(bytes) => {
                    let cut = bytes.len().min(READ_MAX);
                    let mut s = String::from_utf8_lossy(&bytes[..cut]).into_owned();
                    if bytes.len() > cut {
                        s.push_str(&format!("\n… [{} more bytes]", bytes.len() - cut));
                    }
                    (s, false)
                }
                Err(e) => (format!("{}: {e}", path.display()), true),
            }
        }
        other => (
            format!("the scripted agent cannot run tool {other:?}"),
            true,
        ),
    }
}
