//! Text from clients inside error messages, made safe to print in a terminal, a log or a
//! browser: control characters (and the invisible format characters that reorder text)
//! escaped, quoted input cut short, whole messages bounded.

/// Most characters of one piece of client input an error message quotes.
pub const MAX_QUOTED_CHARS: usize = 64;
/// Most characters of an error message.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// `s` in double quotes for an error message: quotes, backslashes and control characters
/// escaped, cut after [`MAX_QUOTED_CHARS`] characters (the cut says how long `s` was).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_QUOTED_CHARS * 2) + 2);
    out.push('"');
    for (i, c) in s.chars().enumerate() {
        if i == MAX_QUOTED_CHARS {
            out.push_str(&format!("\"… ({} bytes in all)", s.len()));
            return out;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => push_visible(&mut out, c),
        }
    }
    out.push('"');
    out
}

/// A whole message made safe to print: control characters escaped, cut after
/// [`MAX_MESSAGE_CHARS`] characters.
pub fn safe_message(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_MESSAGE_CHARS * 2));
    for (i, c) in s.chars().enumerate() {
        if i == MAX_MESSAGE_CHARS {
            out.push('…');
            break;
        }
        push_visible(&mut out, c);
    }
    out
}

/// Whether `c` must not reach a terminal or log as itself: control characters, and format
/// characters that hide or reorder text (zero-width, bidirectional overrides, BOM).
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c as u32, 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2069 | 0xFEFF)
}

fn push_visible(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if is_unsafe(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_escape_and_cut() {
        assert_eq!(quote("a\"b\\c\n\u{1b}[31m"), r#""a\"b\\c\n\u{001b}[31m""#);
        let long = "x".repeat(10_000);
        let q = quote(&long);
        assert!(q.starts_with(&format!("\"{}\"…", "x".repeat(MAX_QUOTED_CHARS))));
        assert!(q.ends_with("(10000 bytes in all)"), "{q}");
        assert!(q.chars().count() < 100);
        assert_eq!(quote("\u{202e}evil"), "\"\\u{202e}evil\"");
    }

    #[test]
    fn messages_stay_short_and_printable() {
        let m = safe_message(&format!("bad {}\r\n\u{7}", "y".repeat(5000)));
        assert_eq!(m.chars().count(), MAX_MESSAGE_CHARS + 1);
        assert!(!m.chars().any(is_unsafe));
        assert_eq!(safe_message("ok\r\n\u{7}"), "ok\\r\\n\\u{0007}");
    }
}
