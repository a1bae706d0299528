//! SGLang's command line as each release's argparse parser reads it (`allow_abbrev` on): which
//! option an argument names, and the value extraArgs give an option.

use crate::release::Release;

/// How SGLang's argparse parser (`allow_abbrev` on) reads one `--…` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionMatch {
    /// An option string, exactly or as its unique prefix.
    Option { option: &'static str, dest: &'static str },
    /// A prefix of several options: argparse exits with `ambiguous option`.
    Ambiguous(Vec<&'static str>),
    /// No option starts with it: argparse exits with `unrecognized arguments`.
    Unknown,
}

fn sglang_options(release: Release) -> impl Iterator<Item = (&'static str, &'static str)> {
    release.option_table().lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_once(' '))
}

/// Matches an argument the way Python 3.11's argparse does: the part before `=` exactly, else
/// as a prefix. `None` for arguments that are not long options (values, `--` itself).
pub fn match_option(release: Release, arg: &str) -> Option<OptionMatch> {
    if !arg.starts_with("--") || arg == "--" {
        return None;
    }
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    if let Some((option, dest)) = sglang_options(release).find(|(o, _)| *o == name) {
        return Some(OptionMatch::Option { option, dest });
    }
    let matches: Vec<_> = sglang_options(release).filter(|(o, _)| o.starts_with(name)).collect();
    Some(match matches.as_slice() {
        [] => OptionMatch::Unknown,
        [(option, dest)] => OptionMatch::Option { option, dest },
        many => OptionMatch::Ambiguous(many.iter().map(|(o, _)| *o).collect()),
    })
}

/// The last value extraArgs give an argparse destination (argparse keeps the last), matching
/// options as SGLang's parser does; `Some("")` for a bare switch.
pub fn extra_value(release: Release, args: &[String], dest: &str) -> Option<String> {
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        if let Some(OptionMatch::Option { dest: d, .. }) = match_option(release, arg)
            && d == dest
        {
            found = Some(match arg.split_once('=') {
                Some((_, v)) => v.to_owned(),
                None => args.get(i + 1).filter(|v| !v.starts_with("--")).cloned().unwrap_or_default(),
            });
        }
    }
    found
}
