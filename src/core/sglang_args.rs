//! SGLang's command line as each release's argparse parser reads it (`allow_abbrev` on): which
//! option an argument names, how many values the option takes, and what argparse checks of each
//! value (its conversion and its choices). The facts come from the release's option table
//! (`sglang_flags/<release>.txt`, written by tests/parity/dump_flags.py from the release's own
//! parser; its header says what each column holds). [`read`] walks extraArgs the way argparse
//! walks an argv and names, in argparse's words, every argument it would refuse.

mod python;

use std::sync::OnceLock;

use serde_json::Value;

use crate::release::Release;
use python::{Converted, Refusal};

/// How many values an option takes (argparse's `nargs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nargs {
    /// A switch (`store_true`, `BooleanOptionalAction`, help): no value.
    Switch,
    One,
    /// `?`: one value if one follows.
    Optional,
    /// `*`: every value that follows.
    Any,
    /// `+`: at least one.
    OneOrMore,
}

/// One argparse action of `sglang serve`, a line of the option table.
#[derive(Clone, Debug, PartialEq)]
pub struct OptionSpec {
    /// Its option strings joined by `/`, as argparse names it in errors (`--attn-cp-size/--attention-context-parallel-size`).
    pub name: &'static str,
    pub dest: &'static str,
    pub nargs: Nargs,
    /// The conversion of each value: `-` (none), `str`, `int`, `float`, or SGLang's converter's name.
    pub conversion: &'static str,
    /// The values argparse accepts after conversion.
    pub choices: Option<Vec<Value>>,
    /// The choices are a Python set: argparse lists them in hash order, so not reproducibly.
    pub choice_set: bool,
    /// `help`, or SGLang's own action class; `None` for argparse's storing actions.
    pub action: Option<&'static str>,
}

impl OptionSpec {
    pub fn option_strings(&self) -> impl Iterator<Item = &'static str> + use<> {
        self.name.split('/')
    }
}

/// The release's options in the order SGLang adds them.
pub fn options(release: Release) -> &'static [OptionSpec] {
    const N: usize = Release::SUPPORTED.len();
    static TABLES: [OnceLock<Vec<OptionSpec>>; N] = [const { OnceLock::new() }; N];
    TABLES[release as usize].get_or_init(|| table_lines(release).filter_map(parse_line).collect())
}

fn table_lines(release: Release) -> impl Iterator<Item = &'static str> {
    release.option_table().lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty())
}

/// `names dest nargs type [choices=JSON | choice-set=JSON] [action=NAME]`; `None` if malformed.
fn parse_line(line: &'static str) -> Option<OptionSpec> {
    let mut cols = line.split_whitespace();
    let (name, dest, nargs, conversion) = (cols.next()?, cols.next()?, cols.next()?, cols.next()?);
    let nargs = match nargs {
        "0" => Nargs::Switch,
        "1" => Nargs::One,
        "?" => Nargs::Optional,
        "*" => Nargs::Any,
        "+" => Nargs::OneOrMore,
        _ => return None,
    };
    let mut spec = OptionSpec { name, dest, nargs, conversion, choices: None, choice_set: false, action: None };
    for col in cols {
        match col.split_once('=')? {
            ("choices", json) => spec.choices = Some(serde_json::from_str(json).ok()?),
            ("choice-set", json) => {
                spec.choices = Some(serde_json::from_str(json).ok()?);
                spec.choice_set = true;
            }
            ("action", action) => spec.action = Some(action),
            _ => return None,
        }
    }
    Some(spec)
}

fn option_strings(release: Release) -> impl Iterator<Item = (&'static str, &'static OptionSpec)> {
    options(release).iter().flat_map(|s| s.option_strings().map(move |o| (o, s)))
}

/// How SGLang's argparse parser (`allow_abbrev` on) reads one `--…` argument.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionMatch {
    /// An option string, exactly or as its unique prefix.
    Option { option: &'static str, dest: &'static str, spec: &'static OptionSpec },
    /// A prefix of several options: argparse exits with `ambiguous option`.
    Ambiguous(Vec<&'static str>),
    /// No option starts with it: argparse exits with `unrecognized arguments`.
    Unknown,
}

/// Matches an argument the way Python's argparse does: the part before `=` exactly, else as a
/// prefix. `None` for arguments that are not long options (values, `--` itself).
pub fn match_option(release: Release, arg: &str) -> Option<OptionMatch> {
    if !arg.starts_with("--") || arg == "--" {
        return None;
    }
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    if let Some((option, spec)) = option_strings(release).find(|(o, _)| *o == name) {
        return Some(OptionMatch::Option { option, dest: spec.dest, spec });
    }
    let matches: Vec<_> = option_strings(release).filter(|(o, _)| o.starts_with(name)).collect();
    Some(match matches.as_slice() {
        [] => OptionMatch::Unknown,
        [(option, spec)] => OptionMatch::Option { option, dest: spec.dest, spec },
        many => OptionMatch::Ambiguous(many.iter().map(|(o, _)| *o).collect()),
    })
}

/// The last value extraArgs give an argparse destination (argparse keeps the last), read as
/// SGLang's parser reads them; `Some("")` for a switch (or an option missing its value).
pub fn extra_value(release: Release, args: &[String], dest: &str) -> Option<String> {
    let reading = read(release, args.iter().map(String::as_str).enumerate());
    let last = reading.occurrences.iter().rev().find(|o| o.spec.dest == dest)?;
    Some(last.values.first().map(|(_, v)| (*v).to_owned()).unwrap_or_default())
}

/// Python's argparse texts, and how the engine images' Python prints them.
pub mod texts {
    /// The engine images run Python 3.12 (SGLang's `docker/Dockerfile` installs deadsnakes'
    /// `python3.12`); its argparse (3.12.8 on, like 3.13.1 on: CPython gh-86357) prints an invalid
    /// choice and the choices with `str()`: `invalid choice: 'fp4' (choose from auto, fp8_e5m2)`,
    /// `invalid choice: '3' (choose from 1, 2)`. Python 3.11 (the parity oracle's) and
    /// 3.12.0–3.12.7 print them with `repr()`: `(choose from 'auto', 'fp8_e5m2')`, `invalid choice: 3`.
    pub const CHOICES_WITH_STR: bool = true;
    pub const EXPECTED_ONE: &str = "expected one argument";
    pub const EXPECTED_AT_MOST_ONE: &str = "expected at most one argument";
    pub const EXPECTED_AT_LEAST_ONE: &str = "expected at least one argument";
    pub const IGNORED_EXPLICIT: &str = "ignored explicit argument";
    pub const UNRECOGNIZED: &str = "unrecognized arguments:";
    pub const AMBIGUOUS: &str = "ambiguous option:";
    /// What `-h/--help` does; argparse prints nothing on stderr.
    pub const HELP_EXITS: &str = "sglang serve: `--help` prints the usage and exits (status 0) without serving";
}

/// One option of extraArgs and the values argparse gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct Occurrence<'a> {
    /// Where the option is in extraArgs.
    pub index: usize,
    /// As written (`--page-si`, `--page-size=64`).
    pub written: &'a str,
    /// The option string it names.
    pub option: &'static str,
    pub spec: &'static OptionSpec,
    /// Its values, with their index in extraArgs.
    pub values: Vec<(usize, &'a str)>,
}

/// An argument SGLang's parser refuses: argparse's text (what follows `sglang serve: error: `,
/// or the exception its action raises), where, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgError {
    pub index: usize,
    /// The destination of the option concerned, if one is.
    pub dest: Option<&'static str>,
    pub message: String,
    pub fix: String,
}

/// extraArgs as argparse reads them: the options found and what it refuses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading<'a> {
    pub occurrences: Vec<Occurrence<'a>>,
    pub errors: Vec<ArgError>,
}

/// What argparse makes of one argument before it consumes any (`_parse_optional`).
#[derive(Clone, Debug, PartialEq)]
enum Token<'a> {
    Value,
    Option {
        option: &'static str,
        spec: &'static OptionSpec,
        explicit: Option<&'a str>,
    },
    Ambiguous(Vec<&'static str>),
    Unknown,
    /// `--`: what follows is positional (and `sglang serve` takes no positional argument).
    EndOfOptions,
}

fn classify(release: Release, arg: &str) -> Token<'_> {
    if arg == "--" {
        return Token::EndOfOptions;
    }
    if !arg.starts_with('-') || arg == "-" {
        return Token::Value;
    }
    if let Some((option, spec)) = option_strings(release).find(|(o, _)| *o == arg) {
        return Token::Option { option, spec, explicit: None };
    }
    match match_option(release, arg) {
        Some(OptionMatch::Option { option, spec, .. }) => {
            return Token::Option { option, spec, explicit: arg.split_once('=').map(|(_, v)| v) };
        }
        Some(OptionMatch::Ambiguous(options)) => return Token::Ambiguous(options),
        _ => {}
    }
    // `-1`, `-.5` and anything with a space are values: the parser has no option like them.
    if is_negative_number(arg) || arg.contains(' ') { Token::Value } else { Token::Unknown }
}

/// `^-\d+$|^-\d*\.\d+$`
fn is_negative_number(arg: &str) -> bool {
    let digits = |s: &str| s.chars().all(char::is_numeric);
    let Some(rest) = arg.strip_prefix('-') else { return false };
    match rest.split_once('.') {
        None => !rest.is_empty() && digits(rest),
        Some((whole, frac)) => digits(whole) && !frac.is_empty() && digits(frac),
    }
}

/// Reads `args` (each with its index in extraArgs) as SGLang `release`'s parser reads what
/// follows the flags pd-operator renders (each of which has all its values).
pub fn read<'a>(release: Release, args: impl IntoIterator<Item = (usize, &'a str)>) -> Reading<'a> {
    let args: Vec<(usize, &str)> = args.into_iter().collect();
    let tokens: Vec<Token> = args.iter().map(|(_, a)| classify(release, a)).collect();
    let mut reading = Reading::default();
    let mut strays: Vec<usize> = Vec::new();
    let values_after = |i: usize| tokens[i + 1..].iter().take_while(|t| **t == Token::Value).count();
    let mut i = 0;
    while i < args.len() {
        let (index, arg) = args[i];
        i += match &tokens[i] {
            Token::Value | Token::Unknown => {
                strays.push(i);
                1
            }
            Token::EndOfOptions => {
                strays.extend(i..args.len());
                args.len() - i
            }
            Token::Ambiguous(options) => {
                // argparse stops at it; the values after it are its own, not strays.
                reading.errors.push(ambiguous(index, arg, options));
                1 + values_after(i)
            }
            Token::Option { option, spec, explicit } => {
                let following = &args[i + 1..i + 1 + values_after(i)];
                let (occurrence, taken, error) = consume(args[i], option, spec, *explicit, following);
                reading.errors.extend(error.or_else(|| check_values(&occurrence)));
                reading.occurrences.push(occurrence);
                1 + taken
            }
        };
    }
    if !strays.is_empty() {
        reading.errors.push(unrecognized(release, &args, &strays, &reading.occurrences));
    }
    reading.errors.extend(log_level(&reading.occurrences));
    reading
}

/// `prepare_server_args` (0.5.21–0.5.23) sets up logging right after parsing, with
/// `getattr(logging, log_level.upper())`: a name that is no level of Python's `logging` ends
/// start-up with an `AttributeError` (`BASIC_FORMAT`, a string, with a `ValueError`).
fn log_level(found: &[Occurrence]) -> Option<ArgError> {
    const LEVELS: [&str; 8] = ["CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET"];
    let o = found.iter().rev().find(|o| o.spec.dest == "log_level")?;
    let (index, value) = *o.values.first()?;
    let name = value.to_uppercase();
    let message = match name.as_str() {
        n if LEVELS.contains(&n) => return None,
        "BASIC_FORMAT" => "ValueError: Unknown level: '%(levelname)s:%(name)s:%(message)s'".to_owned(),
        n => format!("AttributeError: module 'logging' has no attribute {}", python::repr(n)),
    };
    let fix = format!("give `{}` a level of Python's logging: critical, error, warning, info or debug", o.option);
    Some(ArgError { index, dest: Some(o.spec.dest), message, fix })
}

/// argparse's `consume_optional`: the occurrence, how many following values it took, and the
/// error if the option's value count is not met.
fn consume<'a>(
    (index, written): (usize, &'a str),
    option: &'static str,
    spec: &'static OptionSpec,
    explicit: Option<&'a str>,
    following: &[(usize, &'a str)],
) -> (Occurrence<'a>, usize, Option<ArgError>) {
    let mut occurrence = Occurrence { index, written, option, spec, values: Vec::new() };
    let error = |message: String, fix: String| Some(ArgError { index, dest: Some(spec.dest), message, fix });
    if let Some(value) = explicit {
        if spec.nargs == Nargs::Switch {
            let message = format!("argument {}: {} {}", spec.name, texts::IGNORED_EXPLICIT, python::repr(value));
            return (occurrence, 0, error(message, switch_fix(spec, written)));
        }
        occurrence.values.push((index, value));
        return (occurrence, 0, None);
    }
    let (taken, missing) = match spec.nargs {
        Nargs::Switch => (0, None),
        Nargs::One => (following.len().min(1), following.is_empty().then_some(texts::EXPECTED_ONE)),
        Nargs::Optional => (following.len().min(1), None),
        Nargs::Any => (following.len(), None),
        Nargs::OneOrMore => (following.len(), following.is_empty().then_some(texts::EXPECTED_AT_LEAST_ONE)),
    };
    occurrence.values.extend_from_slice(&following[..taken]);
    let flag = written.split_once('=').map_or(written, |(f, _)| f);
    let fix = format!("give `{flag}` {} (`{flag} VALUE` or `{flag}=VALUE`), or remove it", expected_value(spec));
    let error = missing.and_then(|m| error(format!("argument {}: {m}", spec.name), fix));
    (occurrence, taken, error)
}

fn switch_fix(spec: &OptionSpec, written: &str) -> String {
    let flag = written.split_once('=').map_or(written, |(f, _)| f);
    let negated = spec.option_strings().find(|o| o.starts_with("--no-"));
    match negated {
        Some(no) if no != flag => format!("`{flag}` is a switch and takes no value: write `{flag}` alone (or `{no}`), or remove it"),
        _ => format!("`{flag}` is a switch and takes no value: write `{flag}` alone, or remove it"),
    }
}

/// What a value of `spec` has to be, for a fix: `an integer`, `one of auto, fp8_e5m2`, ...
fn expected_value(spec: &OptionSpec) -> String {
    if let Some(choices) = &spec.choices {
        return format!("one of {}", choices.iter().map(python_str).collect::<Vec<_>>().join(", "));
    }
    match spec.conversion {
        "int" => "an integer".into(),
        "float" => "a number".into(),
        "human_readable_int" => "an integer, optionally with an SI (1k, 1M) or IEC (1Ki, 1Mi) suffix".into(),
        "loads" => "a JSON value".into(),
        "json_list_type" => "a JSON list".into(),
        "parse_cuda_graph_config_arg" => "a JSON object of phases (decode, prefill) and their settings".into(),
        _ => "a value".into(),
    }
}

/// Python's `str()` of a choice.
fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Python's `repr()` of a choice.
fn python_repr(v: &Value) -> String {
    match v {
        Value::String(s) => python::repr(s),
        other => other.to_string(),
    }
}

/// argparse's conversion and choices check of each value of an occurrence (it stops at the
/// first value refused), then what SGLang's own action checks.
fn check_values(o: &Occurrence) -> Option<ArgError> {
    let spec = o.spec;
    if spec.action == Some("help") {
        let fix = format!("remove `{}`", o.written);
        return Some(ArgError { index: o.index, dest: Some(spec.dest), message: texts::HELP_EXITS.into(), fix });
    }
    for (index, value) in &o.values {
        let error = |message: String| {
            let fix = format!("give `{}` {}, or remove it", o.option, expected_value(spec));
            Some(ArgError { index: *index, dest: Some(spec.dest), message: format!("argument {}: {message}", spec.name), fix })
        };
        match convert(spec.conversion, value) {
            Err(Refusal::Invalid) => return error(format!("invalid {} value: {}", spec.conversion, python::repr(value))),
            Err(Refusal::Text(text)) => return error(text),
            Ok(converted) => {
                if let Some(message) = invalid_choice(spec, &converted) {
                    return error(message);
                }
            }
        }
    }
    (spec.action == Some("LoRAPathAction")).then(|| lora_paths(o)).flatten()
}

/// argparse's `type=` conversion; a converter this model does not know accepts every value.
fn convert(conversion: &str, value: &str) -> Result<Converted, Refusal> {
    match conversion {
        "-" | "str" | "nullable_str" => Ok(Converted::Text(value.to_owned())),
        "int" => python::int(value).ok_or(Refusal::Invalid),
        "float" => python::float(value).then_some(Converted::Other).ok_or(Refusal::Invalid),
        "loads" => python::json(value).map(|_| Converted::Other).map_err(|_| Refusal::Invalid),
        "json_list_type" => python::json(value)
            .map(|_| Converted::Other)
            .map_err(|_| Refusal::Text(format!("Invalid JSON list: {value}. Please provide a valid JSON list."))),
        "human_readable_int" => python::human_readable_int(value),
        "parse_cuda_graph_backend_arg" => cuda_graph_backend(value).map(|()| Converted::Text(value.to_owned())),
        "parse_cuda_graph_config_arg" => cuda_graph_config(value).map(|()| Converted::Other),
        _ => Ok(Converted::Other),
    }
}

/// SGLang's `parse_cuda_graph_backend_arg` (0.5.22 on).
fn cuda_graph_backend(value: &str) -> Result<(), Refusal> {
    if value == "tc_piecewise" {
        return Err(Refusal::Text("tc_piecewise was removed; select breakable, full, or disabled".into()));
    }
    Ok(())
}

/// SGLang's `parse_cuda_graph_config_arg`, up to the phases (the keys each phase allows differ
/// by release and are not in the option table: not checked). Python's JSON error is worded
/// differently from ours.
fn cuda_graph_config(value: &str) -> Result<(), Refusal> {
    const OPTION: &str = "--cuda-graph-config";
    let parsed = match python::json(value) {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(()),
        Err(e) => return Err(Refusal::Text(format!("{OPTION} must be JSON: {e}"))),
    };
    let Value::Object(phases) = &parsed else {
        return Err(Refusal::Text(format!("{OPTION} must be a JSON object, got {}", python::json_type_name(&parsed))));
    };
    for (phase, settings) in phases {
        if !["decode", "prefill"].contains(&phase.as_str()) {
            return Err(Refusal::Text(format!("{OPTION}: unknown phase '{phase}', expected one of ('decode', 'prefill')")));
        }
        if !settings.is_object() {
            let got = python::json_type_name(settings);
            return Err(Refusal::Text(format!("{OPTION}['{phase}'] must be a JSON object, got {got}")));
        }
    }
    Ok(())
}

/// `invalid choice: ...` if the converted value is not one of the option's choices.
fn invalid_choice(spec: &OptionSpec, converted: &Converted) -> Option<String> {
    let choices = spec.choices.as_ref()?;
    let (shown, found) = match converted {
        Converted::Int(Some(v)) => (v.to_string(), choices.iter().any(|c| c.as_i64().is_some_and(|c| i128::from(c) == *v))),
        Converted::Text(s) => (s.clone(), choices.iter().any(|c| c.as_str() == Some(s))),
        Converted::Int(None) | Converted::Other => return None,
    };
    if found {
        return None;
    }
    let value = match converted {
        Converted::Int(_) if !texts::CHOICES_WITH_STR => shown,
        _ => python::repr(&shown),
    };
    let listed: Vec<String> = choices.iter().map(|c| if texts::CHOICES_WITH_STR { python_str(c) } else { python_repr(c) }).collect();
    Some(format!("invalid choice: {value} (choose from {})", listed.join(", ")))
}

/// SGLang's `LoRAPathAction`: an entry written as a JSON object must be one, with `lora_name`
/// and `lora_path`. It raises outside argparse's error handling: start-up ends with the exception.
fn lora_paths(o: &Occurrence) -> Option<ArgError> {
    o.values.iter().find_map(|(index, value)| {
        let entry = python::strip(value);
        if !(entry.starts_with('{') && entry.ends_with('}')) {
            return None;
        }
        let message = match python::json(entry) {
            Err(e) => format!("json.decoder.JSONDecodeError: {e}"),
            Ok(Some(Value::Object(obj))) if !(obj.contains_key("lora_path") && obj.contains_key("lora_name")) => format!(
                "AssertionError: {} looks like a JSON str, but it does not contain 'lora_name' and 'lora_path' keys.",
                python::repr(entry)
            ),
            Ok(_) => return None,
        };
        let fix = format!("write each JSON entry of `{}` as {{\"lora_name\": ..., \"lora_path\": ...}}", o.option);
        Some(ArgError { index: *index, dest: Some(o.spec.dest), message, fix })
    })
}

fn ambiguous(index: usize, arg: &str, options: &[&str]) -> ArgError {
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    ArgError {
        index,
        dest: None,
        message: format!("{} {arg} could match {}", texts::AMBIGUOUS, options.join(", ")),
        fix: format!("spell `{flag}` out in full (one of {})", options.join(", ")),
    }
}

/// argparse's closing error: every argument no option took, in order.
fn unrecognized(release: Release, args: &[(usize, &str)], strays: &[usize], found: &[Occurrence]) -> ArgError {
    let shown: Vec<&str> = strays.iter().map(|&i| args[i].1).collect();
    let (index, first) = args[strays[0]];
    let before = found.iter().rev().find(|o| o.index < index);
    let fix = match classify(release, first) {
        Token::EndOfOptions => "remove `--` and what follows it: `sglang serve` takes no positional argument".to_owned(),
        Token::Unknown => {
            let flag = first.split_once('=').map_or(first, |(f, _)| f);
            format!("`{flag}` is not an option of SGLang {release}'s `sglang serve`; check the spelling, or remove it")
        }
        _ if first.starts_with("--") => {
            format!("`{first}` is one argument: split the option and its value into two extraArgs entries, or write `--option=value`")
        }
        _ => match before {
            Some(o) => format!("`{}` takes {}: remove `{first}` or give it to the option it belongs to", o.option, takes(o.spec.nargs)),
            None => format!("remove `{first}`, or put it after the option it is a value of"),
        },
    };
    ArgError { index, dest: None, message: format!("{} {}", texts::UNRECOGNIZED, shown.join(" ")), fix }
}

fn takes(nargs: Nargs) -> &'static str {
    match nargs {
        Nargs::Switch => "no value",
        Nargs::One => "one value",
        Nargs::Optional => "at most one value",
        Nargs::Any | Nargs::OneOrMore => "the values that follow it",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(release: Release, args: &[&str]) -> Vec<String> {
        read(release, args.iter().copied().enumerate()).errors.into_iter().map(|e| e.message).collect()
    }

    #[test]
    fn every_table_line_is_read() {
        for r in Release::SUPPORTED {
            assert_eq!(options(r).len(), table_lines(r).count(), "{r}: a line of the option table does not parse");
            assert!(options(r).iter().any(|o| o.action == Some("help")), "{r}");
        }
        assert_eq!(Release::SUPPORTED.map(|r| r as usize), [0, 1, 2], "options() indexes its tables by release");
    }

    #[test]
    fn values_are_judged_as_argparse_judges_them() {
        let r = Release::V0_5_23;
        assert!(errors(r, &["--chunked-prefill-size", "8192", "--mem-fraction-static=0.85", "--disable-radix-cache"]).is_empty());
        assert_eq!(errors(r, &["--chunked-prefill-size", "x"]), ["argument --chunked-prefill-size: invalid int value: 'x'"]);
        assert_eq!(errors(r, &["--chunked-prefill-size"]), ["argument --chunked-prefill-size: expected one argument"]);
        assert_eq!(errors(r, &["--disable-radix-cache=1"]), ["argument --disable-radix-cache: ignored explicit argument '1'"]);
        assert_eq!(errors(r, &["--disable-radix-cache", "1"]), ["unrecognized arguments: 1"]);
        assert_eq!(errors(r, &["--chunked-prefill-size", "-1"]), Vec::<String>::new(), "-1 is a value");
        assert_eq!(errors(r, &["--fuseep-mode", "3"]), ["argument --fuseep-mode: invalid choice: '3' (choose from 1, 2)"]);
        assert_eq!(
            errors(r, &["--attn-cp-size", "two"]),
            ["argument --attn-cp-size/--attention-context-parallel-size: invalid int value: 'two'"]
        );
        assert_eq!(errors(r, &["--", "x"]), ["unrecognized arguments: -- x"]);
        assert_eq!(errors(r, &["--attn", "2"]), ["ambiguous option: --attn could match --attn-dp-size, --attn-cp-size"]);
        assert_eq!(errors(r, &["--log-level", "Debug"]), Vec::<String>::new());
        assert_eq!(errors(r, &["--log-level=verbose"]), ["AttributeError: module 'logging' has no attribute 'VERBOSE'"]);
    }

    #[test]
    fn the_last_value_of_a_destination_is_the_one_kept() {
        let args: Vec<String> =
            ["--attention-backend", "fa3", "--attention-backend=triton", "--disable-radix-cache"].map(Into::into).into();
        assert_eq!(extra_value(Release::V0_5_23, &args, "attention_backend").as_deref(), Some("triton"));
        assert_eq!(extra_value(Release::V0_5_23, &args, "disable_radix_cache").as_deref(), Some(""));
        assert_eq!(extra_value(Release::V0_5_23, &args, "page_size"), None);
    }
}
