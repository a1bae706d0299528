//! pd-core's modules stand in layers: each imports (`crate::…`) only modules of its own layer or
//! of a layer below, and no import cycle forms, within a layer or across. Test code is left out:
//! a module's tests may drive the whole crate. A new module must be given its layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. Keep in step with the groups of `lib.rs`.
const LAYERS: &[(&str, &[&str])] = &[
    ("vocabulary and facts", &["findings", "hub_id", "manifest", "names", "pod", "release", "remote", "stand_in"]),
    ("SGLang and the Hub", &["handshake", "hub", "model", "resolve", "sglang_args"]),
    ("rules", &["bounds", "egress", "offline", "validate"]),
    ("model sources", &["model_fetch", "model_read", "model_source"]),
    ("children", &["render"]),
    ("engine dry run", &["dryrun"]),
    ("decisions and status", &["children", "plan", "planner", "pod_security", "recovery", "scaling", "sets", "sidecar", "status"]),
];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules `lib.rs` declares.
fn declared(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect()
}

/// A file's text without its test code: a `tests.rs`, or from `#[cfg(test)]` before `mod tests` on.
fn non_test(path: &Path, text: &str) -> String {
    if path.file_name().is_some_and(|f| f == "tests.rs") {
        return String::new();
    }
    let cut = text
        .match_indices("#[cfg(test)]")
        .map(|(i, _)| i)
        .find(|&i| text[i..].trim_start_matches("#[cfg(test)]").trim_start().starts_with("mod tests"));
    text[..cut.unwrap_or(text.len())].to_owned()
}

/// The crate modules `text` names through `crate::name` or `crate::{a, b::c}`.
fn imports(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => {
                group[..group.find('}').unwrap_or(group.len())].split(',').map(|s| s.trim().split("::").next().unwrap_or("")).collect()
            }
            None => vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")],
        };
        out.extend(names.into_iter().filter(|n| modules.contains(*n)).map(str::to_owned));
    }
    out
}

fn files_of(root: &Path, module: &str) -> Vec<PathBuf> {
    let mut files = vec![root.join(format!("{module}.rs"))];
    let mut dirs = vec![root.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                files.push(p);
            }
        }
    }
    files.into_iter().filter(|f| f.exists()).collect()
}

fn graph(root: &Path) -> Graph {
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    let modules: BTreeSet<String> = declared(&lib).into_iter().collect();
    let mut g = Graph::new();
    for m in &modules {
        let mut deps = BTreeSet::new();
        for f in files_of(root, m) {
            let text = std::fs::read_to_string(&f).expect("a module file");
            deps.extend(imports(&non_test(&f, &text), &modules));
        }
        deps.remove(m);
        g.insert(m.clone(), deps);
    }
    g
}

/// Edges that go up a layer, as `from -> to (layer -> layer)`.
fn upward(g: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let layer_of: BTreeMap<&str, usize> = layers.iter().enumerate().flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i))).collect();
    let mut out = Vec::new();
    for (from, deps) in g {
        for to in deps {
            let (a, b) = (layer_of[from.as_str()], layer_of[to.as_str()]);
            if b > a {
                out.push(format!("{from} -> {to} ({} -> {})", layers[a].0, layers[b].0));
            }
        }
    }
    out
}

/// One import cycle, if any, as the modules along it.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(g: &Graph, m: &str, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            return Some(path[at..].iter().cloned().chain([m.to_owned()]).collect());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for d in &g[m] {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

#[test]
fn pd_core_modules_import_only_downward_and_form_no_cycle() {
    let g = graph(Path::new(env!("CARGO_MANIFEST_DIR")));
    let placed: BTreeSet<&str> = LAYERS.iter().flat_map(|(_, ms)| ms.iter().copied()).collect();
    let unplaced: Vec<&String> = g.keys().filter(|m| !placed.contains(m.as_str())).collect();
    assert!(unplaced.is_empty(), "modules without a layer (add them to LAYERS in tests/layers.rs): {unplaced:?}");
    assert_eq!(placed.len(), g.len(), "LAYERS names a module lib.rs does not declare");
    let up = upward(&g, LAYERS);
    assert!(up.is_empty(), "imports that go up a layer:\n{}", up.join("\n"));
    assert_eq!(cycle(&g), None, "an import cycle");
}

#[test]
fn the_check_sees_an_upward_import_a_cycle_and_ignores_test_code() {
    let modules: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let text = "use crate::{a::X, b};\nfn f() { crate::c::g() }\n#[cfg(test)]\nmod tests { use crate::z; }";
    assert_eq!(imports(&non_test(Path::new("m.rs"), text), &modules), modules);
    assert_eq!(non_test(Path::new("x/tests.rs"), text), "");
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_owned()].into());
    g.insert("b".into(), BTreeSet::new());
    assert_eq!(upward(&g, &[("low", &["a"]), ("high", &["b"])]), ["a -> b (low -> high)"]);
    assert!(upward(&g, &[("low", &["b"]), ("high", &["a"])]).is_empty());
    assert_eq!(cycle(&g), None);
    g.get_mut("b").unwrap().insert("a".into());
    assert_eq!(cycle(&g), Some(vec!["a".into(), "b".into(), "a".into()]));
}
