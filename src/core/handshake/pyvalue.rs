//! Python semantics over JSON values, as SGLang's decode applies them to a topology body:
//! `int()`, `bool()`, `str()` and `==`. Only what the handshake needs.

use serde_json::Value;

/// Python's type name of a JSON value after `json.loads`.
pub fn type_name(v: &Value) -> &'static str {
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

/// Python's `int(v)`; the error is the exception as Python prints it (`TypeError: ...`).
pub fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i)
            } else if let Some(f) = n.as_f64() {
                let t = f.trunc();
                if t.abs() < 9.2e18 { Ok(t as i64) } else { Err("OverflowError: integer out of range".into()) }
            } else {
                Err("OverflowError: integer out of range".into())
            }
        }
        Value::String(s) => {
            let t = s.trim();
            let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
            let well_formed = !digits.is_empty()
                && !digits.starts_with('_')
                && !digits.ends_with('_')
                && !digits.contains("__")
                && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
            let parsed = well_formed.then(|| t.replace('_', "").parse::<i64>().ok()).flatten();
            parsed.ok_or_else(|| format!("ValueError: invalid literal for int() with base 10: {}", repr(v)))
        }
        other => {
            Err(format!("TypeError: int() argument must be a string, a bytes-like object or a real number, not '{}'", type_name(other)))
        }
    }
}

/// Python truthiness.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits; lay them out as Python's repr does.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let m = if rest.is_empty() { first.to_owned() } else { format!("{first}.{rest}") };
        return format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let point = exp + 1;
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}

fn number_text(n: &serde_json::Number) -> String {
    if n.is_f64() { float_repr(n.as_f64().unwrap_or(0.0)) } else { n.to_string() }
}

fn quote(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `repr()` of the value `json.loads` would produce.
pub fn repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => number_text(n),
        Value::String(s) => quote(s),
        Value::Array(a) => format!("[{}]", a.iter().map(repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!("{{{}}}", o.iter().map(|(k, v)| format!("{}: {}", quote(k), repr(v))).collect::<Vec<_>>().join(", ")),
    }
}

/// Python's `json.dumps(v)` with default settings: `", "`/`": "` separators, non-ASCII as
/// `\uXXXX` escapes, floats in `repr` form. aiohttp's `json_response` writes exactly this.
pub fn dumps(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_text(n)),
        Value::String(s) => write_json_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, item)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json_string(k, out);
                out.push_str(": ");
                write_json(item, out);
            }
            out.push('}');
        }
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Python's `str()`: like `repr()` except that a string prints bare.
pub fn str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Python's `==` between two decoded JSON values (`1 == 1.0 == True`).
pub fn eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_i64() && y.is_i64() => x.as_i64() == y.as_i64(),
        (Value::Number(x), Value::Number(y)) if x.is_u64() && y.is_u64() => x.as_u64() == y.as_u64(),
        (x, y) if as_number(x).is_some() && as_number(y).is_some() => as_number(x) == as_number(y),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| eq(p, q)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| eq(v, w))),
        (x, y) => x == y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn int_matches_python() {
        assert_eq!(int(&json!(3)), Ok(3));
        assert_eq!(int(&json!(2.9)), Ok(2));
        assert_eq!(int(&json!(-2.9)), Ok(-2));
        assert_eq!(int(&json!(true)), Ok(1));
        assert_eq!(int(&json!(" +1_0 ")), Ok(10));
        assert_eq!(int(&json!("2.0")), Err("ValueError: invalid literal for int() with base 10: '2.0'".into()));
        assert_eq!(
            int(&json!(null)),
            Err("TypeError: int() argument must be a string, a bytes-like object or a real number, not 'NoneType'".into())
        );
    }

    #[test]
    fn str_and_repr_match_python() {
        assert_eq!(str(&json!("bf16")), "bf16");
        assert_eq!(str(&json!(1.0)), "1.0");
        assert_eq!(str(&json!(1e16)), "1e+16");
        assert_eq!(str(&json!(0.0001)), "0.0001");
        assert_eq!(str(&json!(0.00001)), "1e-05");
        assert_eq!(str(&json!(123.5)), "123.5");
        assert_eq!(str(&json!([1, "a", null, true])), "[1, 'a', None, True]");
        assert_eq!(str(&json!({"k": "it's"})), "{'k': \"it's\"}");
    }

    #[test]
    fn dumps_matches_python_json_dumps() {
        assert_eq!(dumps(&json!({"a": 1, "b": [1.0, null, true], "c": "x"})), r#"{"a": 1, "b": [1.0, null, true], "c": "x"}"#);
        assert_eq!(dumps(&json!("é\u{1F600}\"\\\n\u{7f}")), r#""\u00e9\ud83d\ude00\"\\\n\u007f""#);
        assert_eq!(dumps(&json!(1e16)), "1e+16");
    }

    #[test]
    fn eq_and_truthiness_match_python() {
        assert!(eq(&json!(1), &json!(1.0)));
        assert!(eq(&json!(true), &json!(1)));
        assert!(eq(&json!({"a": [1, 2]}), &json!({"a": [1.0, 2]})));
        assert!(!eq(&json!("1"), &json!(1)));
        assert!(!truthy(&json!("")) && !truthy(&json!(0.0)) && truthy(&json!("0")));
    }
}
