//! The checks on small crates written to a scratch directory.
use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use super::*;

/// A scratch `src/` tree, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new(files: &[(&str, &str)]) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "xtask-layers-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        for (file, text) in files {
            let path = root.join(file);
            fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
            fs::write(path, text).expect("a file");
        }
        Self(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The problems found in a crate of these files, as the check prints them.
fn problems(files: &[(&str, &str)]) -> Vec<String> {
    let tree = Tree::new(files);
    let krate = Crate::read(&tree.0).expect("the tree reads");
    krate.problems().iter().map(|p| p.to_string()).collect()
}

const LIB: (&str, &str) = ("lib.rs", "mod correlate;\nmod ingest;\n");

#[test]
fn a_clean_crate_has_no_problem() {
    let found = problems(&[
        LIB,
        ("ingest.rs", "mod reader;\nuse crate::decode::Packet;\n"),
        ("ingest/reader.rs", "use super::Thing;\n"),
        ("decode/mod.rs", "pub use self::dns::Packet;\nmod dns;\n"),
        ("decode/dns.rs", "pub struct Packet;\n"),
        ("correlate.rs", "use crate::{decode, ingest::reader};\n"),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn an_import_from_a_layer_above_is_named_with_its_line() {
    let found = problems(&[
        LIB,
        ("ingest.rs", "mod reader;\n"),
        (
            "ingest/reader.rs",
            "//! Reads.\nuse std::fmt;\n\nuse crate::correlate::X;\n",
        ),
        ("correlate.rs", "pub struct X;\n"),
    ]);
    assert_eq!(
        found,
        ["dnstrace/src/ingest/reader.rs:4: ingest (layer ingest) imports correlate (layer correlate, above it)"]
    );
}

#[test]
fn super_super_and_inline_crate_paths_are_imports() {
    let found = problems(&[
        LIB,
        ("decode/mod.rs", "mod frag;\n"),
        ("decode/frag/mod.rs", "mod reasm;\n"),
        (
            "decode/frag/reasm.rs",
            "fn f() {\n    super::super::super::ingest::read();\n}\n",
        ),
        ("ingest.rs", ""),
        (
            "naming.rs",
            "fn model() -> crate::view::Model {\n    todo!()\n}\n",
        ),
        ("view/mod.rs", "pub struct Model;\n"),
    ]);
    assert_eq!(
        found,
        [
            "dnstrace/src/decode/frag/reasm.rs:2: decode (layer decode) imports ingest (layer ingest, above it)",
            "dnstrace/src/naming.rs:1: naming (layer context) imports view (layer sinks, above it)",
        ]
    );
}

#[test]
fn an_item_of_the_root_is_above_every_layer() {
    let found = problems(&[
        ("lib.rs", "mod netns;\nfn helper() {}\n"),
        ("netns.rs", "fn f() { crate::helper() }\n"),
    ]);
    assert_eq!(
        found,
        ["dnstrace/src/netns.rs:1: netns (layer base) imports crate (the crate root, above it)"]
    );
}

#[test]
fn comments_strings_and_tests_do_not_count() {
    let naming = r###"//! Names, as crate::view shows them.
/// See [`crate::view::Model`].
fn f() -> &'static str {
    /* crate::view::Model */
    let _ = r#"crate::view"#;
    "crate::view::Model"
}

#[cfg(test)]
mod tests {
    use crate::view::Model;
    fn g() { if true { crate::view::draw() } }
}

fn after() {
    crate::view::draw();
}
"###;
    let found = problems(&[
        LIB,
        ("naming.rs", naming),
        ("naming/tests.rs", "use crate::view::Model;\n"),
        ("view/mod.rs", "pub struct Model;\n"),
    ]);
    assert_eq!(
        found,
        ["dnstrace/src/naming.rs:16: naming (layer context) imports view (layer sinks, above it)"]
    );
}

#[test]
fn a_module_declared_for_tests_is_test_code() {
    let found = problems(&[
        LIB,
        ("pods/mod.rs", "#[cfg(test)]\npub mod testdir;\n"),
        ("pods/testdir.rs", "use crate::record::Recorder;\n"),
        ("record.rs", "pub struct Recorder;\n"),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn a_cycle_through_a_nested_use_group_is_found_once() {
    let found = problems(&[
        LIB,
        ("pods.rs", "use crate::{\n    conntrack,\n    target::{\n        report::{self, Row},\n    },\n};\n"),
        ("target.rs", "mod report;\n"),
        ("target/report.rs", "use crate::pods::Pod;\n"),
        ("conntrack.rs", ""),
    ]);
    assert_eq!(
        found,
        ["cycle: pods -> target -> pods (pods.rs:4, target/report.rs:1)"]
    );
}

#[test]
fn a_cycle_between_siblings_through_super() {
    let found = problems(&[
        LIB,
        ("decode/mod.rs", "mod dns;\nmod wire;\npub struct Error;\n"),
        (
            "decode/dns.rs",
            "use super::Error;\n\nfn f() {\n    super::wire::read();\n}\n",
        ),
        (
            "decode/wire.rs",
            "use super::dns;\n\nfn g() { dns::name(); }\n",
        ),
    ]);
    assert_eq!(
        found,
        ["cycle: decode::dns -> decode::wire -> decode::dns (decode/dns.rs:4, decode/wire.rs:1)"]
    );
}

#[test]
fn a_module_in_no_layer_is_named() {
    let found = problems(&[LIB, ("capture.rs", ""), ("capture/check.rs", "")]);
    assert_eq!(
        found,
        ["module capture is in no layer: add it to the table in xtask/src/layers.rs and ARCHITECTURE.md"]
    );
}

#[test]
fn another_binary_s_entry_point_is_the_root() {
    let found = problems(&[
        LIB,
        (
            "bin/probe.rs",
            "fn main() { dnstrace::run() }
",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn every_module_is_in_one_layer_only() {
    let mut seen = BTreeSet::new();
    for module in LAYERS.iter().flat_map(|l| l.modules) {
        assert!(seen.insert(module), "{module} is in two layers");
    }
}

#[test]
fn a_longer_loop_is_one_cycle() {
    let found = problems(&[
        LIB,
        ("pods.rs", "use crate::naming::Names;\n"),
        ("naming.rs", "fn f() { crate::target::g() }\n"),
        ("target.rs", "use crate::pods;\n"),
    ]);
    assert_eq!(
        found,
        ["cycle: naming -> target -> pods -> naming (naming.rs:1, target.rs:1, pods.rs:1)"]
    );
}

#[test]
fn re_exports_and_globs_are_imports() {
    let found = problems(&[
        LIB,
        ("netns.rs", "pub use crate::probes::Attach;\n"),
        ("netlink.rs", "use crate::probes::*;\n"),
        ("probes.rs", "pub struct Attach;\n"),
    ]);
    assert_eq!(
        found,
        [
            "dnstrace/src/netlink.rs:1: netlink (layer base) imports probes (layer kernel, above it)",
            "dnstrace/src/netns.rs:1: netns (layer base) imports probes (layer kernel, above it)",
        ]
    );
}
