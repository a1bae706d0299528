//! The Hub's rules for a repository id and a revision, in one place: `validate` reports a spec
//! that breaks them, and the fetch Job checks its arguments again before it writes anything (the
//! cache directory is `<repo>/<revision>`, so an id with `..` would write into another model's
//! directory of a shared claim). The repository rules are huggingface_hub's `validate_repo_id`
//! (ASCII only); a revision is a git ref name (`git check-ref-format`) or a commit.

/// The longest repository id the Hub accepts.
pub const MAX_REPO_ID: usize = 96;
/// The longest revision accepted (git sets no limit; a Kubernetes argument should stay short).
pub const MAX_REVISION: usize = 255;

/// What a valid repository id looks like, for a fix.
pub const REPO_ID_EXAMPLE: &str = "Qwen/Qwen3-8B";
/// What a valid revision looks like, for a fix.
pub const REVISION_EXAMPLE: &str = "main, v1.0, refs/pr/1 or a 40-hex commit";

/// `Ok` when `repo` is `[namespace/]name` as the Hub accepts it; else why not.
pub fn repo_id(repo: &str) -> Result<(), String> {
    if repo.len() > MAX_REPO_ID {
        return Err(format!("{repo:?} is longer than {MAX_REPO_ID} characters"));
    }
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 {
        return Err(format!("{repo:?} has more than one `/`: a repository id is `namespace/name`"));
    }
    for part in &parts {
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !part.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
            return Err(format!("{repo:?} has a character other than letters, digits, `_`, `-` and `.`"));
        }
        if !word(part.chars().next()) || !word(part.chars().last()) {
            return Err(format!("{repo:?}: each part starts and ends with a letter, a digit or `_`"));
        }
    }
    if repo.contains("--") || repo.contains("..") {
        return Err(format!("{repo:?} contains `--` or `..`"));
    }
    if repo.ends_with(".git") {
        return Err(format!("{repo:?} ends with `.git`"));
    }
    Ok(())
}

/// Whether `revision` is a full commit id (40 hex digits).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `Ok` when `revision` is a git ref name (a branch, a tag, `refs/pr/1`) or a commit; else why
/// not. Every rule of `git check-ref-format` that keeps a name one path inside the cache holds.
pub fn revision(revision: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("{revision:?} is not a git branch, tag or commit: {why}"));
    if revision.is_empty() || revision.len() > MAX_REVISION {
        return bad(&format!("it has to have 1 to {MAX_REVISION} characters"));
    }
    if revision.chars().any(|c| c.is_control() || c == ' ' || "~^:?*[\\".contains(c)) {
        return bad("it has a control character, a space or one of ~^:?*[\\");
    }
    if revision.contains("..") || revision.contains("@{") || revision == "@" {
        return bad("it contains `..` or `@{`, or is `@`");
    }
    if revision.starts_with('/') || revision.ends_with('/') || revision.ends_with('.') || revision.contains("//") {
        return bad("it starts or ends with `/`, ends with `.`, or has an empty part");
    }
    if revision.split('/').any(|part| part.starts_with('.') || part.ends_with(".lock")) {
        return bad("a part starts with `.` or ends with `.lock`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_ids_follow_the_hubs_rules() {
        for good in ["gpt2", "Qwen/Qwen3-8B", "acme/tiny_ft.v2", "a/b", "_x/y_", &format!("a/{}", "b".repeat(94))] {
            assert_eq!(repo_id(good), Ok(()), "{good}");
        }
        let long = format!("a/{}", "b".repeat(95));
        for bad in [
            "x/../other",
            "../x",
            "x/..",
            "a/b/c",
            "/a",
            "a/",
            "",
            "-a/b",
            "a/b-",
            ".a/b",
            "a/b.",
            "a--b/c",
            "a/b..c",
            "a b/c",
            "a/b.git",
            "a/ü",
            "a\\b",
            &long,
        ] {
            assert!(repo_id(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn revisions_are_ref_names_or_commits() {
        for good in ["main", "v1.0", "refs/pr/1", "release/2024-01", &"a".repeat(40), "a@b"] {
            assert_eq!(revision(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "..",
            "../x",
            "a/../b",
            "/main",
            "main/",
            "a//b",
            ".hidden",
            "a/.b",
            "x.lock",
            "a.",
            "a b",
            "a\nb",
            "a\u{7f}",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\b",
            "@",
            "a@{1}",
            &"a".repeat(256),
        ] {
            assert!(revision(bad).is_err(), "{bad:?} accepted");
        }
        assert!(is_commit(&"0123456789abcdef".repeat(3)[..40]) && !is_commit("main") && !is_commit(&"g".repeat(40)));
    }
}
