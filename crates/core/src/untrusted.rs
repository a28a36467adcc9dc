//! Text from files and requests made safe to print: every message that quotes bytes Tessera
//! did not write (GGUF keys and strings, tokenizer files, `config.json`, adapter files, chat
//! templates) goes through [`quote`] or [`sanitize`], so a crafted model file cannot send
//! terminal escape sequences, fake log lines or megabytes of text to whoever reads the error.
//!
//! Escaped: C0 and C1 control characters (ESC, CR, LF, BEL, DEL, ...), and the invisible
//! format characters that reorder or hide text (bidirectional overrides and isolates,
//! zero-width characters, the BOM). They are written `\n`, `\t`, `\r` or `\u{1b}`, as Rust's
//! `{:?}` writes them. Long text is cut at a character boundary and the cut is said
//! (`…(+1234 bytes)`), so a message stays short whatever the file holds.

use std::fmt::Write;

/// Most characters of untrusted text [`quote`] keeps.
pub const QUOTE_CHARS: usize = 80;

/// Most characters [`sanitize`] keeps by default in a whole message ([`MESSAGE_CHARS`]).
pub const MESSAGE_CHARS: usize = 2000;

/// Whether `c` must not reach a terminal as is.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{061C}'              // Arabic letter mark
            | '\u{180E}'            // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}' // zero-width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings/overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}'            // BOM / zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}' // interlinear annotation
        )
}

fn push_escaped(out: &mut String, c: char, quoted: bool) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '"' if quoted => out.push_str("\\\""),
        '\\' if quoted => out.push_str("\\\\"),
        c if is_unsafe(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// `s` escaped and cut to `max_chars` characters; `beyond` more bytes followed `s` in the
/// original and count as cut too.
fn escape(s: &str, max_chars: usize, quoted: bool, beyond: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars * 2) + 2);
    if quoted {
        out.push('"');
    }
    let mut cut = None;
    for (n, (i, c)) in s.char_indices().enumerate() {
        if n == max_chars {
            cut = Some(i);
            break;
        }
        push_escaped(&mut out, c, quoted);
    }
    if quoted {
        out.push('"');
    }
    let cut = cut.map_or(0, |i| s.len() - i) + beyond;
    if cut > 0 {
        let _ = write!(out, "…(+{cut} bytes)");
    }
    out
}

/// `s` in double quotes, escaped and cut to [`QUOTE_CHARS`] characters: for a name or
/// value read from a file, inside a message of ours.
pub fn quote(s: &str) -> String {
    escape(s, QUOTE_CHARS, true, 0)
}

/// [`quote`] of bytes that may not be UTF-8 (invalid sequences become U+FFFD).
pub fn quote_bytes(b: &[u8]) -> String {
    // Only the head is ever shown; do not convert a whole large buffer.
    let head = &b[..b.len().min(QUOTE_CHARS * 4)];
    escape(
        &String::from_utf8_lossy(head),
        QUOTE_CHARS,
        true,
        b.len() - head.len(),
    )
}

/// `s` escaped and cut to `max_chars` characters, without quotes: for whole messages that
/// may carry untrusted text (another library's error about a file, a message built
/// elsewhere). Text already escaped passes unchanged.
pub fn sanitize(s: &str, max_chars: usize) -> String {
    if s.len() <= max_chars && !s.chars().any(is_unsafe) {
        return s.to_string();
    }
    escape(s, max_chars, false, 0)
}

/// `Display` of a name from a file (a tensor's, an architecture's) through [`sanitize`]
/// with [`QUOTE_CHARS`], unquoted.
pub struct Name<'a>(pub &'a str);

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&sanitize(self.0, QUOTE_CHARS))
    }
}

/// `Display` of a message through [`sanitize`] with [`MESSAGE_CHARS`].
pub struct Safe<'a>(pub &'a str);

impl std::fmt::Display for Safe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&sanitize(self.0, MESSAGE_CHARS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls_and_invisible_characters() {
        assert_eq!(quote("a\x1b[31mb"), r#""a\u{1b}[31mb""#);
        assert_eq!(quote("x\ny\r\t\"\\"), r#""x\ny\r\t\"\\""#);
        assert_eq!(
            quote("\u{202e}evil\u{7f}\u{9b}"),
            r#""\u{202e}evil\u{7f}\u{9b}""#
        );
        assert_eq!(sanitize("plain text, été", 100), "plain text, été");
        assert_eq!(sanitize("bell\x07", 100), r"bell\u{7}");
        // Idempotent on escaped text.
        let once = sanitize("a\x1bb", 100);
        assert_eq!(sanitize(&once, 100), once);
    }

    #[test]
    fn cuts_long_text_at_a_character_boundary() {
        let long = "é".repeat(1000);
        let q = quote(&long);
        assert!(
            q.starts_with(&format!("\"{}\"", "é".repeat(QUOTE_CHARS))),
            "{q}"
        );
        assert!(
            q.ends_with(&format!("…(+{} bytes)", 2 * (1000 - QUOTE_CHARS))),
            "{q}"
        );
        assert!(sanitize(&"x".repeat(10_000), 50).len() < 80);
        let b = quote_bytes(&[b'a'; 10_000]);
        assert!(
            b.ends_with(&format!("…(+{} bytes)", 10_000 - QUOTE_CHARS)),
            "{b}"
        );
        assert_eq!(quote_bytes(b"ok\xff"), "\"ok\u{FFFD}\"");
    }
}
