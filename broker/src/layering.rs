//! The crate's modules import one another without cycles (see the map in the crate root):
//! this test reads `src/` and fails, naming the cycle, if a module reaches back up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The top-level module of every `crate::<module>` path used outside comments and test
/// modules, by importing top-level module.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                files.push(e.unwrap().path());
            }
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if ["lib", "main", "test_support", "layering"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // A file's tests may use anything; the code before them is what is layered.
        let code = match text.find("#[cfg(test)]\nmod ") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let deps = graph.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let rest = &line[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            if graph.contains_key(d) {
                if let Some(c) = visit(d, graph, path, done) {
                    return Some(c);
                }
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_of_the_broker_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = imports(&src);
    // The reading works: the composition root reaches the services and the adapters.
    let node = &graph["node"];
    for m in ["api", "node_rpc", "app", "delivery", "ingest", "wal"] {
        assert!(node.contains(m), "node does not import {m}: {node:?}");
    }
    if let Some(c) = cycle(&graph) {
        panic!("import cycle between modules: {}", c.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        cycle(&g(&[("a", "b"), ("b", "c"), ("c", "b")])),
        Some(vec!["b".into(), "c".into(), "b".into()])
    );
}
