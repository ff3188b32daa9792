//! Text that leaves kbind (conditions, Events, logs) carries no credentials and stays small:
//! URL userinfo (`user:pass@`) is removed, and text from a remote response is capped and marked
//! as cut, so an Event is never rejected for size and a status stays readable.

/// The most characters of a remote response kbind repeats.
pub const MAX_REMOTE: usize = 1024;

/// `text` with the userinfo of every URL in it removed: `https://user:pass@host/` → `https://host/`.
pub fn strip_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        // The authority ends at the first of these; userinfo is what precedes its last '@'.
        let end = after
            .find(|c: char| {
                matches!(c, '/' | '?' | '#')
                    || c.is_whitespace()
                    || matches!(c, '"' | '\'' | '<' | '>' | ',' | ';' | ')')
            })
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(userinfo_end) => out.push_str(&authority[userinfo_end + 1..]),
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Remote text made safe to repeat: userinfo stripped, control characters turned into spaces,
/// and cut to [`MAX_REMOTE`] characters (an ellipsis marks the cut).
pub fn remote(text: &str) -> String {
    let clean: String = strip_userinfo(text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::conditions::bounded(clean.trim(), MAX_REMOTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_never_survives() {
        let cases = [
            (
                "dial https://alice:s3cret@proxy:3128/x failed",
                "dial https://proxy:3128/x failed",
            ),
            ("http://token@host", "http://host"),
            (
                "two: http://a:b@one/ and socks5://c:d@two:1080",
                "two: http://one/ and socks5://two:1080",
            ),
            ("no url here", "no url here"),
            (
                "https://host/path@notuserinfo",
                "https://host/path@notuserinfo",
            ),
            ("weird://a@b@c/d", "weird://c/d"),
            ("", ""),
            ("trailing ://", "trailing ://"),
        ];
        for (input, want) in cases {
            assert_eq!(strip_userinfo(input), want, "{input}");
        }
    }

    #[test]
    fn remote_text_is_bounded_single_line_and_clean() {
        let page = format!("<html>{}</html>", "x".repeat(2 * 1024 * 1024));
        let out = remote(&page);
        assert!(out.chars().count() <= MAX_REMOTE + 1);
        assert!(out.ends_with('…'));
        assert_eq!(remote("a\nb\tc"), "a b c");
        assert_eq!(remote("see https://u:p@h/"), "see https://h/");
    }
}
