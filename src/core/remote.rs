//! What a remote system said, as status, Events and logs may show it: the HTTP status and a
//! short, printable excerpt, never the answer itself. A tenant can point the operator at a page
//! it could not read on its own (a Prometheus URL, a Hub endpoint); whatever that page holds must
//! not come back to the tenant through a status message. The one place such text is made.

/// The most characters of a remote text shown.
pub const EXCERPT_CHARS: usize = 64;
/// What stands for an answer that looks like markup: its content is never shown.
pub const HTML_PAGE: &str = "an HTML page";

/// `HTTP <status>` and an excerpt of `body`: what a status message says of an answer.
pub fn answer(status: u16, body: &[u8]) -> String {
    let text = excerpt(&String::from_utf8_lossy(body));
    if text.is_empty() { format!("HTTP {status} (empty body)") } else { format!("HTTP {status}: {text}") }
}

/// At most `EXCERPT_CHARS` printable characters of `text` (see `excerpt_within`).
pub fn excerpt(text: &str) -> String {
    excerpt_within(text, EXCERPT_CHARS)
}

/// At most `max` characters of `text`, `printable`, `…` where it was cut. Text that looks like
/// markup is `HTML_PAGE` instead: a page's title or scripts are its content.
pub fn excerpt_within(text: &str, max: usize) -> String {
    if looks_like_markup(text) {
        return HTML_PAGE.to_owned();
    }
    let clean = printable(text);
    if clean.chars().count() <= max {
        return clean;
    }
    let mut cut: String = clean.chars().take(max).collect::<String>().trim_end().to_owned();
    cut.push('…');
    cut
}

/// The last `max` characters of a log or traceback, `printable`, `…` where it was cut: the end
/// of such text names the error.
pub fn tail_within(text: &str, max: usize) -> String {
    let clean = printable(text);
    let count = clean.chars().count();
    if count <= max {
        return clean;
    }
    let kept: String = clean.chars().skip(count - max).collect();
    format!("…{}", kept.trim_start())
}

/// Printable ASCII only: control characters, escapes and anything beyond ASCII dropped, runs of
/// whitespace as one space, none at either end.
pub fn printable(text: &str) -> String {
    let mut out = String::new();
    let mut space = false;
    for c in text.chars() {
        if c.is_ascii_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if !c.is_ascii_graphic() {
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
    out
}

/// Whether `text` reads as HTML or XML: it opens with a tag, or holds an HTML document's tags.
fn looks_like_markup(text: &str) -> bool {
    let start = text.trim_start();
    if start.starts_with('<') {
        return true;
    }
    let lower = text.to_ascii_lowercase();
    ["<html", "<!doctype", "<head", "<body", "<script", "<title", "<div", "<?xml"].iter().any(|tag| lower.contains(tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_page_is_named_never_shown() {
        let page = b"<!DOCTYPE html><html><title>Vault</title><body>AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG</body></html>";
        assert_eq!(answer(200, page), "HTTP 200: an HTML page");
        let late = b"Welcome\n<html><body>token=abc</body></html>";
        assert_eq!(answer(200, late), "HTTP 200: an HTML page");
    }

    #[test]
    fn plain_text_is_cut_and_cleaned() {
        assert_eq!(answer(500, b"boom"), "HTTP 500: boom");
        assert_eq!(answer(204, b""), "HTTP 204 (empty body)");
        assert_eq!(excerpt("a\u{1b}[31mred\u{7}\n\n  b\u{202e}c"), "a[31mred bc");
        let long = "x".repeat(200);
        let cut = excerpt(&long);
        assert_eq!(cut.chars().count(), EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
        let known = "Prefill server not fully registered yet (1 workers registered).";
        assert_eq!(excerpt_within(known, 200), known, "a short text stays whole");
        assert_eq!(excerpt_within("ab cd", 3), "ab…", "no space before the cut mark");
    }

    #[test]
    fn a_tail_keeps_the_end_and_drops_escapes() {
        let log = "loading\n\u{1b}]0;owned\u{7}Traceback:\n  File \"x.py\"\nValueError: bad\r\n";
        assert_eq!(tail_within(log, 200), "loading ]0;ownedTraceback: File \"x.py\" ValueError: bad");
        assert_eq!(tail_within(log, 15), "…ValueError: bad");
    }

    proptest! {
        #[test]
        fn an_excerpt_is_short_and_printable(text in ".{0,400}", max in 1usize..100) {
            let e = excerpt_within(&text, max);
            prop_assert!(e.chars().count() <= max.max(HTML_PAGE.len()) + 1);
            prop_assert!(e.chars().all(|c| c == '…' || c == ' ' || c.is_ascii_graphic()));
            let t = tail_within(&text, max);
            prop_assert!(t.chars().count() <= max + 1);
            prop_assert!(t.chars().all(|c| c == '…' || c == ' ' || c.is_ascii_graphic()));
        }
    }
}
