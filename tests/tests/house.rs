//! The house's shape, read from its sources: no two modules of one crate
//! import each other (directly or round a longer circle), and no crate's
//! tests or examples depend on a crate built on it, but for the public
//! suites (`idem-conformance`), which every store's tests run, and the
//! memory store, which the core's runnable rustdoc examples run on.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crate every crate's tests may use, whatever it is built on.
const SUITES: &str = "idem-conformance";

/// The one other arrow allowed up: the core's rustdoc examples run on the
/// in-memory store, so that every example a user reads is run.
const EXAMPLES_STORE: (&str, &str) = ("idem-core", "idem-memory");

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the conformance crate")
        .to_path_buf()
}

/// The workspace's member directories, from its manifest.
fn members(root: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").expect("a members list");
    let end = start + manifest[start..].find(']').expect("its end");
    manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|member| root.join(member))
        .collect()
}

/// A member's package name and its `idem-*` dependencies: (normal,
/// dev-only).
fn dependencies(member: &Path) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let manifest = fs::read_to_string(member.join("Cargo.toml")).unwrap();
    let mut name = String::new();
    let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_end_matches(".workspace").to_string();
        match section.as_str() {
            "[package]" if key == "name" => name = value.trim().trim_matches('"').to_string(),
            "[dependencies]" if key.starts_with("idem-") => {
                normal.insert(key);
            }
            "[dev-dependencies]" if key.starts_with("idem-") => {
                dev.insert(key);
            }
            _ => {}
        }
    }
    dev.remove(&name);
    (name, normal, dev)
}

#[test]
fn no_crate_is_used_by_the_tests_or_examples_of_a_crate_below_it() {
    let root = workspace();
    let mut normal: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dev: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for member in members(&root) {
        let (name, n, d) = dependencies(&member);
        normal.insert(name.clone(), n);
        dev.insert(name, d);
    }
    // Everything a crate is built on, through normal dependencies.
    let below = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(next) = todo.pop() {
            for dep in normal.get(&next).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen
    };
    let mut upward = Vec::new();
    for (name, devs) in &dev {
        let allowed = |used: &str| used == SUITES || (name.as_str(), used) == EXAMPLES_STORE;
        for used in devs.iter().filter(|used| !allowed(used)) {
            if below(used).contains(name) {
                upward.push(format!(
                    "{name}'s tests use {used}, which is built on {name}"
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "arrows running up:\n{}",
        upward.join("\n")
    );
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file under `src` (`inbound::runner`; the
/// crate root is empty).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of `text` without comments and without its `#[cfg(test)] mod
/// tests` (a module's tests may use whatever they test).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::a::b::...` paths in `code`, each as its segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(found) = code[at..].find("crate::") {
        let start = at + found;
        at = start + "crate::".len();
        let before = start.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
            continue;
        }
        let tail = &code[at..];
        let path: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        paths.push(
            path.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        );
    }
    paths
}

/// The modules of one crate and, for each, the modules it imports.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .into_iter()
        .map(|file| (module_of(src, &file), file))
        .collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = code(&fs::read_to_string(file).unwrap());
        let mut imports = BTreeSet::new();
        for path in crate_paths(&text) {
            let target = (1..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate));
            let Some(target) = target else {
                continue;
            };
            let inside = module.starts_with(&format!("{target}::"));
            if &target != module && !inside {
                imports.insert(target);
            }
        }
        graph.insert(module.clone(), imports);
    }
    graph
}

/// A circle of `graph`, if it has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut found = stack[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(_) => {}
                None => {
                    if let Some(found) = visit(next, graph, state, stack) {
                        return Some(found);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(found) = visit(node, graph, &mut state, &mut stack) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut circles = Vec::new();
    for member in members(&workspace()) {
        let src = member.join("src");
        if let Some(found) = circle(&module_graph(&src)) {
            circles.push(format!("{}: {}", member.display(), found.join(" -> ")));
        }
    }
    assert!(circles.is_empty(), "circles:\n{}", circles.join("\n"));
}

#[test]
fn the_reading_finds_a_circle_where_there_is_one() {
    let dir = std::env::temp_dir().join(format!("idem-house-{}", uuid::Uuid::new_v4()));
    fs::create_dir_all(dir.join("part")).unwrap();
    fs::write(dir.join("lib.rs"), "mod part;\n").unwrap();
    fs::write(dir.join("part/mod.rs"), "mod a;\nmod b;\n").unwrap();
    fs::write(
        dir.join("part/a.rs"),
        "use crate::part::b::B;\npub struct A;\n",
    )
    .unwrap();
    fs::write(
        dir.join("part/b.rs"),
        "// use crate::part::a::A; (a comment is no import)\npub struct B(crate::part::a::A);\n",
    )
    .unwrap();
    let found = circle(&module_graph(&dir));
    assert_eq!(
        found,
        Some(vec![
            "part::a".to_string(),
            "part::b".to_string(),
            "part::a".to_string()
        ])
    );
    fs::write(
        dir.join("part/b.rs"),
        "// crate::part::a::A\npub struct B;\n",
    )
    .unwrap();
    assert_eq!(circle(&module_graph(&dir)), None);
    fs::remove_dir_all(&dir).unwrap();
}
