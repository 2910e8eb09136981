//! The one Markdown renderer for the core's transition tables (the session table, the run
//! table, and the simulator's coverage of the session table): one row per state, one column
//! per input, each cell what the caller says.

/// A Markdown table with `corner` over the row names, a column per `cols` entry.
pub fn render<R: Copy, C: Copy>(
    corner: &str,
    rows: &[R],
    cols: &[C],
    row_name: impl Fn(R) -> &'static str,
    col_name: impl Fn(C) -> &'static str,
    cell: impl Fn(R, C) -> String,
) -> String {
    let mut out = format!("| {corner} |");
    for &c in cols {
        out.push_str(&format!(" {} |", col_name(c)));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(cols.len()));
    out.push('\n');
    for &r in rows {
        out.push_str(&format!("| {} |", row_name(r)));
        for &c in cols {
            out.push_str(&format!(" {} |", cell(r, c)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_row_per_state_one_column_per_input() {
        let t = super::render(
            "s",
            &[1, 2],
            &['a', 'b'],
            |r| if r == 1 { "one" } else { "two" },
            |c| if c == 'a' { "A" } else { "B" },
            |r, c| format!("{r}{c}"),
        );
        assert_eq!(
            t,
            "| s | A | B |\n|---|---|---|\n| one | 1a | 1b |\n| two | 2a | 2b |\n"
        );
    }
}
