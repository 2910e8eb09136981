//! How the CLI names and lays out what the daemon reports: status, provider and activity names,
//! latis' session states, times, ages, one-line cells and the one table renderer every command
//! prints with. A leaf: `output` (JSON and lines), `latis`, `attach` and the commands use it,
//! and it uses none of them.

use paddock_core::{ActivityKind, Provider, Status};
use paddock_proto::obey::local::v1 as pb;

pub fn status_name(n: i32) -> &'static str {
    Status::from_number(n)
        .map(|s| s.name())
        .unwrap_or("UNSPECIFIED")
}

pub fn provider_name(n: i32) -> &'static str {
    Provider::from_number(n)
        .map(|p| p.name())
        .unwrap_or("unspecified")
}

pub fn activity_name(n: i32) -> &'static str {
    ActivityKind::from_number(n)
        .map(|k| k.name())
        .unwrap_or("UNSPECIFIED")
}

/// RFC 3339 in UTC, millisecond precision: prost-types' own formatting of a protobuf
/// `Timestamp` (already a dependency), cut to milliseconds.
pub fn rfc3339(seconds: i64, nanos: i32) -> String {
    let ms = nanos.clamp(0, 999_999_999) / 1_000_000 * 1_000_000;
    prost_types::Timestamp { seconds, nanos: ms }.to_string()
}

/// The most columns a table cell takes; a longer value (the daemon accepts names of any
/// length) is cut with `…` (`--json` has it whole).
pub const CELL_WIDTH_MAX: usize = 200;

/// `text` cut to `width` terminal columns (display width: a CJK character or an emoji takes
/// two), the cut marked with `…`.
pub fn fit(text: &str, width: usize) -> std::borrow::Cow<'_, str> {
    use unicode_truncate::UnicodeTruncateStr;
    if columns(text) <= width {
        return text.into();
    }
    let (kept, _) = text.unicode_truncate(width.saturating_sub(1));
    format!("{}…", kept.trim_end()).into()
}

/// How many terminal columns `text` takes: one a byte for printable ASCII (ids, names,
/// numbers: most of a table, measured without a lookup a character), else its display width.
pub fn columns(text: &str) -> usize {
    use unicode_width::UnicodeWidthStr;
    match text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        true => text.len(),
        false => text.width(),
    }
}

/// A cell's text as a table shows it: at most [`CELL_WIDTH_MAX`] columns.
fn cell(c: &str) -> std::borrow::Cow<'_, str> {
    fit(c, CELL_WIDTH_MAX)
}

/// Renders rows as an aligned table.
pub fn table<S: AsRef<str>>(headers: &[&str], rows: &[Vec<S>]) -> String {
    use std::borrow::Cow;
    // How many cells each line has: the header's, then each row's.
    let lines = || std::iter::once(headers.len()).chain(rows.iter().map(Vec::len));
    // Each cell cut and measured once.
    let mut cells: Vec<(Cow<'_, str>, usize)> = Vec::with_capacity(lines().sum());
    let texts = headers
        .iter()
        .copied()
        .chain(rows.iter().flat_map(|r| r.iter().map(AsRef::as_ref)));
    cells.extend(texts.map(|t| {
        let c = cell(t);
        let w = columns(&c);
        (c, w)
    }));
    let mut widths = vec![0; lines().max().unwrap_or(0)];
    let mut rest = cells.as_slice();
    for n in lines() {
        let (line, after) = rest.split_at(n);
        for (width, (_, w)) in widths.iter_mut().zip(line) {
            *width = (*width).max(*w);
        }
        rest = after;
    }
    // Padded by hand: `format!`'s width is a u16 and panics past 65,535.
    let line_max = widths.iter().map(|w| w + 2).sum::<usize>() + 1;
    let mut out = String::with_capacity(line_max.saturating_mul(rows.len() + 1));
    let mut rest = cells.as_slice();
    for (l, n) in lines().enumerate() {
        if l > 0 {
            out.push('\n');
        }
        let (line, after) = rest.split_at(n);
        let start = out.len();
        for (i, (c, w)) in line.iter().enumerate() {
            out.push_str(c);
            if i + 1 < n {
                pad(&mut out, widths[i] - w + 2);
            }
        }
        let kept = out[start..].trim_end().len();
        out.truncate(start + kept);
        rest = after;
    }
    out
}

/// `n` spaces onto `out`.
fn pad(out: &mut String, mut n: usize) {
    const SPACES: &str = "                                                                ";
    while n > 0 {
        let k = n.min(SPACES.len());
        out.push_str(&SPACES[..k]);
        n -= k;
    }
}

/// "3s", "5m", "2h", "4d": how long ago `t` was.
pub fn age(t: &Option<prost_types::Timestamp>, now_ms: u64) -> String {
    let Some(t) = t else { return "-".into() };
    let then = (t.seconds.max(0) as u64) * 1000;
    let s = now_ms.saturating_sub(then) / 1000;
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The drivers paddock has (the core's [`paddock_core::Driver`]s), by name: `local` (the
/// host), `bubblewrap` (a sandbox on the host), `podman` (a container per session), `ssh`
/// (another machine), `qemu` (a VM per session) and `kubernetes` (a pod per session).
pub const DRIVERS: &[&str] = &["local", "bubblewrap", "podman", "ssh", "qemu", "kubernetes"];

/// The driver a session runs under, as the daemon reports it (`local` for a daemon that does
/// not say).
pub fn driver_of(s: &pb::SessionInfo) -> &str {
    match s.environment_spec.as_ref().map(|e| e.driver.as_str()) {
        Some(d) if !d.is_empty() => d,
        _ => DRIVERS[0],
    }
}

/// latis' name for a session's state: `creating`, `starting`, `working`, `waiting`, `ready`,
/// `complete`, `stopping`, `stopped` or `failed`.
///
/// `RUNNING` (idle) is `complete` once the session has finished a turn (its task, or a later
/// message), else `ready` (created without a task, nothing asked yet). `FAILED` is latis'
/// "complete, unsuccessfully": its own word here, with the error shown by `session status`; a
/// live session whose last turn ended in an ERROR (a provider not logged in, a refused key, an
/// interrupted turn) is `failed` too, never `complete`.
pub fn latis_state(status: Status, turns_completed: i64, last_turn_failed: bool) -> &'static str {
    match status {
        Status::Running if turns_completed > 0 && last_turn_failed => "failed",
        Status::Created => "creating",
        Status::Starting => "starting",
        Status::Working => "working",
        Status::Waiting => "waiting",
        Status::Running if turns_completed > 0 => "complete",
        Status::Running => "ready",
        Status::Stopping => "stopping",
        Status::Stopped => "stopped",
        Status::Failed => "failed",
    }
}

/// [`latis_state`] of a session as the daemon reports it (`unknown` for a status this CLI
/// does not know, from a newer daemon).
pub fn state_of(s: &pb::SessionInfo) -> &'static str {
    match Status::from_number(s.status) {
        Some(st) => latis_state(st, s.turns_completed, s.last_turn_failed),
        None => "unknown",
    }
}

/// `text` on one line, at most `max` columns wide, the cut marked with `…`.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    fit(&flat, max).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_render() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_771_425_000, 5_000_000),
            "2026-02-18T14:30:00.005Z"
        );
    }

    #[test]
    fn cells_past_any_width_are_cut_and_never_panic() {
        let long = "n".repeat(70_000);
        let t = table(&["NAME", "STATUS"], &[vec![long.as_str(), "RUNNING"]]);
        let row = t.lines().nth(1).unwrap();
        assert!(row.starts_with(&format!("{}…", "n".repeat(CELL_WIDTH_MAX - 1))));
        assert!(row.ends_with("RUNNING"));
        assert_eq!(cell("héllo"), "héllo");
    }

    #[test]
    fn wide_characters_keep_columns_aligned() {
        let t = table(
            &["NAME", "STATUS"],
            &[vec!["修正", "RUNNING"], vec!["ab", "FAILED"]],
        );
        // 修正 takes four cells on a terminal, as "NAME" does.
        assert_eq!(t, "NAME  STATUS\n修正  RUNNING\nab    FAILED");
    }

    #[test]
    fn cuts_count_columns_not_characters() {
        use unicode_width::UnicodeWidthStr;
        // Ten CJK characters are twenty columns: cut to eight, the mark included.
        let cut = one_line("修正修正修正修正修正", 8);
        assert_eq!(cut, "修正修…");
        assert!(cut.width() <= 8);
        // An emoji is never split, and what fits is whole.
        assert_eq!(one_line("ok 🦀🦀🦀", 6), "ok 🦀…");
        assert_eq!(one_line("a  b\nc", 10), "a b c");
        assert_eq!(fit("short", 10), "short");
    }

    #[test]
    fn printable_ascii_takes_a_column_a_byte_and_the_rest_its_display_width() {
        use unicode_width::UnicodeWidthStr;
        for s in [
            "",
            "sess_01ABC",
            "a b~",
            "修正",
            "ok 🦀",
            "tab\there",
            "e\u{301}",
        ] {
            assert_eq!(columns(s), s.width(), "{s:?}");
        }
    }

    #[test]
    fn tables_align() {
        let t = table(&["ID", "STATUS"], &[vec!["a", "RUNNING"]]);
        assert_eq!(t, "ID  STATUS\na   RUNNING");
        // A line with nothing to show is still a line.
        let t = table(&["", ""], &[vec!["", ""], vec!["a", "b"]]);
        assert_eq!(t, "\n\na  b");
        // Padding past what one push holds; a wide character takes two columns.
        let long = "x".repeat(100);
        let t = table(&["A", "B"], &[vec![long.as_str(), "1"], vec!["y", "2"]]);
        assert_eq!(
            t.lines().nth(2),
            Some(format!("y{}2", " ".repeat(101)).as_str())
        );
        let t = table(&["N", "M"], &[vec!["修正", "1"]]);
        assert_eq!(t, "N     M\n修正  1");
    }
}
