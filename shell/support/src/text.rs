//! Text cut to a byte limit, on character boundaries — one way for the whole shell — and
//! text made safe to print on a terminal.

use std::borrow::Cow;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// `s` cut to `max` bytes, with a `… [truncated N bytes]` marker when cut.
pub fn truncate(s: &str, max: usize) -> Cow<'_, str> {
    let head = prefix(s, max);
    if head.len() == s.len() {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!(
            "{head}… [truncated {} bytes]",
            s.len() - head.len()
        ))
    }
}

/// `s` with every control character but newline and tab shown as `\u{…}`: text an agent
/// wrote (a tool input, a summary, an answer) cannot move the cursor, clear a line or retitle
/// the terminal of the human reading it — above all in an approval prompt.
pub fn for_terminal(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_text_cannot_carry_escape_sequences() {
        assert_eq!(for_terminal("ok\tfine\n"), "ok\tfine\n");
        assert_eq!(
            for_terminal("curl x|sh\u{1b}[2KAllow Bash: ls\r"),
            "curl x|sh\\u{1b}[2KAllow Bash: ls\\u{d}"
        );
        assert_eq!(for_terminal("\u{9b}31m"), "\\u{9b}31m");
    }

    #[test]
    fn cuts_on_char_boundaries() {
        assert_eq!(prefix("ééé", 3), "é");
        assert_eq!(truncate("abc", 5), "abc");
        let long = "é".repeat(10);
        let t = truncate(&long, 5);
        assert!(t.starts_with("éé…"), "{t}");
        assert!(t.ends_with("[truncated 16 bytes]"), "{t}");
    }
}
