//! The Python that argparse runs on a value: `int()`, `float()`, `json.loads`, `repr()` of a
//! string, and SGLang's own converter functions, each as far as its verdict (accept or refuse)
//! and its error text go. Where Python accepts more than is modelled here (digits of other
//! scripts, JSON's `NaN`), the value is accepted: a false refusal costs as much as a false
//! admission.

use serde_json::Value;

/// A value after argparse's conversion, as far as `choices` compares it.
#[derive(Clone, Debug, PartialEq)]
pub enum Converted {
    /// A Python `int`; `None` when its value is not modelled (beyond i128, or non-ASCII digits).
    Int(Option<i128>),
    Text(String),
    /// Converted, but nothing to compare (a float, JSON, a converter's result).
    Other,
}

/// Why a conversion refused a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `ValueError`/`TypeError`: argparse prints `invalid <type> value: <repr>`.
    Invalid,
    /// `argparse.ArgumentTypeError`: argparse prints its text.
    Text(String),
}

/// Python's `str.isspace()` (what `int()`, `float()` and `str.strip()` strip).
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Digits with single underscores between them, as `int()` and `float()` take them. `None` when
/// the underscores are misplaced; the digits otherwise.
fn without_underscores(digits: &str) -> Option<String> {
    let chars: Vec<char> = digits.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        let between = i > 0 && i + 1 < chars.len() && chars[i - 1].is_numeric() && chars[i + 1].is_numeric();
        if *c == '_' && !between {
            return None;
        }
    }
    Some(chars.into_iter().filter(|c| *c != '_').collect())
}

/// `int(s)`: surrounding whitespace, a sign, decimal digits (`_` between them).
pub fn int(s: &str) -> Option<Converted> {
    let t = strip(s);
    let (negative, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let digits = without_underscores(digits)?;
    if digits.is_empty() || !digits.chars().all(char::is_numeric) {
        return None;
    }
    let value = digits.parse::<i128>().ok().map(|v| if negative { -v } else { v });
    Some(Converted::Int(value))
}

/// `float(s)`: what `int()` takes, decimals, exponents, `inf`, `infinity`, `nan` (any case).
pub fn float(s: &str) -> bool {
    let t = strip(s);
    if !t.is_ascii() {
        // digits of other scripts: Python takes them, this model does not know them all
        return t.chars().any(char::is_numeric);
    }
    without_underscores(t).is_some_and(|plain| plain.parse::<f64>().is_ok())
}

/// `json.loads(s)`; `Err` carries what refused it. Python also takes `NaN`, `Infinity`, numbers
/// beyond f64 and lone surrogates: those are accepted unchecked.
pub fn json(s: &str) -> Result<Option<Value>, String> {
    match serde_json::from_str::<Value>(s) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            let lenient = ["NaN", "Infinity"].iter().any(|t| s.contains(t))
                || ["out of range", "surrogate", "recursion"].iter().any(|t| e.to_string().contains(t));
            if lenient { Ok(None) } else { Err(e.to_string()) }
        }
    }
}

/// Python's `type(v).__name__` of a parsed JSON value.
pub fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `repr()` of a string.
pub fn repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => out.push_str(&escape(c)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `str.isprintable()` for one character: not a control, format, separator (but space),
/// private-use or surrogate character (the common ones; unassigned code points are kept).
fn printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_control()
        || matches!(u, 0xa0 | 0xad | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x3000 | 0xfeff)
        || matches!(u, 0xe000..=0xf8ff | 0xfff9..=0xfffb | 0xf0000..=0x10ffff))
}

fn escape(c: char) -> String {
    match c as u32 {
        u @ 0..=0xff => format!("\\x{u:02x}"),
        u @ 0x100..=0xffff => format!("\\u{u:04x}"),
        u => format!("\\U{u:08x}"),
    }
}

/// SGLang's `human_readable_int` (`srt/utils/common.py`, the same in 0.5.21–0.5.23): an integer,
/// or decimal digits with an SI (k, M, G, T) or IEC (Ki, Mi, Gi, Ti) suffix, decimals with SI only.
pub fn human_readable_int(s: &str) -> Result<Converted, Refusal> {
    let value = strip(s);
    if let Some((number, suffix)) = suffixed(value) {
        if suffix.ends_with('i') && number.contains('.') {
            let whole = number.split('.').next().unwrap_or(number);
            let whole = whole.trim_start_matches('0');
            let whole = if whole.is_empty() { "0" } else { whole };
            let si = &suffix[..1];
            return Err(Refusal::Text(format!(
                "Decimals are not allowed with IEC suffixes like '{suffix}'. Use an integer IEC value such as '{whole}{suffix}', or an SI value such as '{number}{si}'."
            )));
        }
        return Ok(Converted::Other);
    }
    int(value).ok_or_else(|| {
        Refusal::Text(format!(
            "Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        ))
    })
}

/// `(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)` matching all of `value`: the number and the suffix.
fn suffixed(value: &str) -> Option<(&str, &str)> {
    let suffix = ["Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"].into_iter().find(|s| value.ends_with(s))?;
    let number = &value[..value.len() - suffix.len()];
    let mut parts = number.splitn(2, '.');
    let digits = |p: &str| !p.is_empty() && p.chars().all(char::is_numeric);
    let ok = parts.next().is_some_and(digits) && parts.next().is_none_or(digits);
    ok.then_some((number, suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_takes_what_python_takes() {
        for ok in ["7", " 7 ", "+7", "-7", "1_000", "007", "\u{0663}", "0_1"] {
            assert!(int(ok).is_some(), "{ok:?}");
        }
        for bad in ["", "x", "1.5", "0x10", "1__0", "_1", "1_", "--1", "1e3", "- 1"] {
            assert!(int(bad).is_none(), "{bad:?}");
        }
        assert_eq!(int(" 02 "), Some(Converted::Int(Some(2))));
    }

    #[test]
    fn float_takes_what_python_takes() {
        for ok in ["1", "1.", ".5", "1e5", "-1E-5", " 2.5 ", "inf", "-Infinity", "nan", "1_0.5"] {
            assert!(float(ok), "{ok:?}");
        }
        for bad in ["", "x", "1e", ".", "1_.5", "0x1", "+-1", "1,5"] {
            assert!(!float(bad), "{bad:?}");
        }
    }

    #[test]
    fn repr_quotes_as_python_does() {
        assert_eq!(repr("x"), "'x'");
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a\"b'c"), "'a\"b\\'c'");
        assert_eq!(repr("a\\b\n"), "'a\\\\b\\n'");
        assert_eq!(repr("\u{7f}\u{a0}é"), "'\\x7f\\xa0é'");
    }

    #[test]
    fn human_readable_int_is_sglang_s() {
        assert!(human_readable_int("4k").is_ok() && human_readable_int("1Mi").is_ok() && human_readable_int("25.6k").is_ok());
        assert!(human_readable_int(" 4096 ").is_ok());
        let Err(Refusal::Text(t)) = human_readable_int("1.5Ki") else { panic!() };
        assert_eq!(
            t,
            "Decimals are not allowed with IEC suffixes like 'Ki'. Use an integer IEC value such as '1Ki', or an SI value such as '1.5K'."
        );
        let Err(Refusal::Text(t)) = human_readable_int("4K") else { panic!() };
        assert!(t.starts_with("Invalid integer value: '4K'. "), "{t}");
    }
}
