//! Text cut to a byte limit, on character boundaries — one way for the whole shell.

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

#[cfg(test)]
mod tests {
    use super::*;

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
