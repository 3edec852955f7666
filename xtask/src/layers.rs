//! `cargo xtask layers [--graph]`: dnstrace's user-space modules depend one
//! way. Each top-level module of dnstrace/src sits in a layer of LAYERS and
//! imports only from its own layer and those below, and no modules need
//! each other round a loop (see cycles.rs). Test code is left out: a test
//! may reach anything. ARCHITECTURE.md says why the layers are these.
mod cycles;
mod scan;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    path::Path,
};

use anyhow::{bail, Context as _, Result};

use crate::workspace_root;

/// A layer: its name and its top-level modules.
struct Layer {
    name: &'static str,
    modules: &'static [&'static str],
}

/// The layers, low to high; the crate root (lib.rs, main.rs) is above them
/// all. A module may import from its own layer and those below it, never
/// above. Keep ARCHITECTURE.md's table alike. Modules not written yet may
/// be named already.
const LAYERS: &[Layer] = &[
    Layer {
        name: "base",
        modules: &["clock", "logging", "mounts", "netns", "netlink"],
    },
    Layer {
        name: "kernel",
        modules: &["probes"],
    },
    Layer {
        name: "decode",
        modules: &["decode"],
    },
    Layer {
        name: "ingest",
        modules: &["ingest"],
    },
    Layer {
        name: "context",
        modules: &["conntrack", "naming", "pods", "target", "links", "routes"],
    },
    Layer {
        name: "correlate",
        modules: &["correlate"],
    },
    Layer {
        name: "diagnose",
        modules: &["diagnose"],
    },
    Layer {
        name: "pipeline",
        modules: &["pipeline"],
    },
    Layer {
        name: "sinks",
        modules: &["output", "record", "view", "metrics", "otlp"],
    },
    Layer {
        name: "commands",
        modules: &["commands", "lab"],
    },
    Layer {
        name: "cli",
        modules: &["cli", "bench", "fuzz", "harness"],
    },
];

/// The crate checked, from the workspace root.
const SRC: &str = "dnstrace/src";

pub fn run(args: &[String]) -> Result<()> {
    match args {
        [] => check(),
        [flag] if flag == "--graph" => graph(),
        _ => bail!("usage: cargo xtask layers [--graph]"),
    }
}

/// Prints every import from a layer above, every cycle and every module in
/// no layer; fails if there is any.
pub fn check() -> Result<()> {
    let krate = Crate::read(&workspace_root().join(SRC))?;
    let problems = krate.problems();
    for problem in &problems {
        println!("{problem}");
    }
    if !problems.is_empty() {
        bail!(
            "{}; ARCHITECTURE.md says which layer each module is in and why",
            summary(&problems)
        );
    }
    println!(
        "layers: {} modules, {} imports, all one way",
        krate.modules.len(),
        krate.imports.len()
    );
    Ok(())
}

/// `layers: 3 imports from a layer above, 1 cycle, 0 modules in no layer`.
fn summary(problems: &[Problem]) -> String {
    let (mut upward, mut cycles, mut unlisted) = (0, 0, 0);
    for problem in problems {
        match problem {
            Problem::Upward { .. } => upward += 1,
            Problem::Cycle(_) => cycles += 1,
            Problem::Unlisted(_) => unlisted += 1,
        }
    }
    format!(
        "layers: {}, {}, {}",
        counted(
            upward,
            "import from a layer above",
            "imports from a layer above"
        ),
        counted(cycles, "cycle", "cycles"),
        counted(unlisted, "module in no layer", "modules in no layer"),
    )
}

fn counted(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// Each layer's modules and what each imports, marking imports from above.
fn graph() -> Result<()> {
    let krate = Crate::read(&workspace_root().join(SRC))?;
    let imports = krate.top_level_imports();
    let tops = krate.top_level_modules();
    for layer in LAYERS {
        println!("{}:", layer.name);
        for module in layer.modules.iter().filter(|m| tops.contains(*m)) {
            println!("  {}", imports_line(module, &imports));
        }
    }
    let unlisted: Vec<&str> = tops.into_iter().filter(|m| level_of(m).is_none()).collect();
    if !unlisted.is_empty() {
        println!("in no layer:");
        for module in unlisted {
            println!("  {}", imports_line(module, &imports));
        }
    }
    Ok(())
}

/// `ingest -> decode, correlate (above)`.
fn imports_line(module: &str, imports: &BTreeMap<&str, BTreeSet<&str>>) -> String {
    let Some(targets) = imports.get(module) else {
        return module.to_owned();
    };
    let named: Vec<String> = targets
        .iter()
        .map(|to| match (level_of(module), level_of(to)) {
            (Some(from), Some(to_level)) if to_level > from => format!("{to} (above)"),
            _ => (*to).to_owned(),
        })
        .collect();
    format!("{module} -> {}", named.join(", "))
}

/// Where a module sits: in a layer (its index in LAYERS), or the crate
/// root, above every layer.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
enum Level {
    Layer(usize),
    Root,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Level::Layer(i) => write!(f, "layer {}", LAYERS[*i].name),
            Level::Root => write!(f, "the crate root"),
        }
    }
}

/// The level of a top-level module; None for one in no layer.
fn level_of(top: &str) -> Option<Level> {
    LAYERS
        .iter()
        .position(|layer| layer.modules.contains(&top))
        .map(Level::Layer)
}

fn level(module: &ModPath) -> Option<Level> {
    module.top().map_or(Some(Level::Root), level_of)
}

/// A module of the crate, by its path from the root (`decode::dns`); the
/// root's is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct ModPath(Vec<String>);

impl ModPath {
    fn new(segments: Vec<String>) -> Self {
        Self(segments)
    }

    fn segments(&self) -> &[String] {
        &self.0
    }

    fn child(&self, name: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(name.to_owned());
        Self(segments)
    }

    fn top(&self) -> Option<&str> {
        self.0.first().map(String::as_str)
    }

    /// The top-level module this one is in (the root stays the root).
    fn top_level(&self) -> Self {
        Self(self.0.iter().take(1).cloned().collect())
    }

    /// `decode/dns.rs` is `decode::dns`, `decode/mod.rs` and `decode.rs`
    /// are `decode`, lib.rs, main.rs and the other binaries' entry points
    /// (`bin/*.rs`) are the root.
    fn of_file(file: &str) -> Self {
        let file = file.strip_suffix(".rs").unwrap_or(file);
        let mut segments: Vec<String> = file.split('/').map(str::to_owned).collect();
        let entry = match segments.as_slice() {
            [only] => only == "lib" || only == "main",
            [dir, _] => dir == "bin",
            _ => false,
        };
        if entry {
            segments.clear();
        }
        if segments.last().is_some_and(|s| s == "mod") {
            segments.pop();
        }
        Self(segments)
    }
}

impl fmt::Display for ModPath {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.0.is_empty() {
            true => write!(f, "crate"),
            false => write!(f, "{}", self.0.join("::")),
        }
    }
}

/// A line of a file, the file relative to dnstrace/src.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// One module naming another (never itself), outside test code.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    site: Site,
    from: ModPath,
    to: ModPath,
}

#[derive(Debug)]
enum Problem {
    /// Top-level modules, `to` above `from`.
    Upward {
        site: Site,
        from: (ModPath, Level),
        to: (ModPath, Level),
    },
    Cycle(cycles::Cycle),
    /// A top-level module in no layer.
    Unlisted(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Problem::Upward { site, from, to } => write!(
                f,
                "{SRC}/{site}: {} ({}) imports {} ({}, above it)",
                from.0, from.1, to.0, to.1
            ),
            Problem::Cycle(cycle) => write!(f, "{cycle}"),
            Problem::Unlisted(module) => write!(
                f,
                "module {module} is in no layer: add it to the table in xtask/src/layers.rs and ARCHITECTURE.md"
            ),
        }
    }
}

/// The crate as the checks see it.
struct Crate {
    /// Every module with a file of its own, test code left out.
    modules: BTreeSet<ModPath>,
    /// In file and line order.
    imports: Vec<Import>,
}

/// One file, read.
struct Scanned {
    file: String,
    module: ModPath,
    scan: scan::FileScan,
}

impl Crate {
    fn read(src: &Path) -> Result<Self> {
        let scanned = rust_files(src)?
            .into_iter()
            .map(|file| {
                let text = fs::read_to_string(src.join(&file))
                    .with_context(|| format!("reading {SRC}/{file}"))?;
                let module = ModPath::of_file(&file);
                let scan = scan::scan(&text, &module);
                Ok(Scanned { file, module, scan })
            })
            .collect::<Result<Vec<_>>>()?;
        let tests = TestCode::of(&scanned);
        let modules: BTreeSet<ModPath> = scanned.iter().map(|s| s.module.clone()).collect();
        let imports = imports(&scanned, &modules, &tests);
        let modules = modules.into_iter().filter(|m| !tests.has(m)).collect();
        Ok(Self { modules, imports })
    }

    fn problems(&self) -> Vec<Problem> {
        let mut problems = self.upward();
        let cycles = cycles::find(&self.imports);
        problems.extend(cycles.into_iter().map(Problem::Cycle));
        problems.extend(self.unlisted().map(|m| Problem::Unlisted(m.to_owned())));
        problems
    }

    /// Imports from a layer above, once per line and module imported.
    fn upward(&self) -> Vec<Problem> {
        let mut seen = BTreeSet::new();
        let mut upward = Vec::new();
        for import in &self.imports {
            let (from, to) = (import.from.top_level(), import.to.top_level());
            let (Some(from_level), Some(to_level)) = (level(&from), level(&to)) else {
                continue;
            };
            if to_level > from_level && seen.insert((&import.site, to.clone())) {
                upward.push(Problem::Upward {
                    site: import.site.clone(),
                    from: (from, from_level),
                    to: (to, to_level),
                });
            }
        }
        upward
    }

    fn top_level_modules(&self) -> BTreeSet<&str> {
        self.modules.iter().filter_map(ModPath::top).collect()
    }

    fn unlisted(&self) -> impl Iterator<Item = &str> {
        let tops = self.top_level_modules();
        tops.into_iter().filter(|m| level_of(m).is_none())
    }

    /// Which top-level modules each imports, the root left out.
    fn top_level_imports(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut imports: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for import in &self.imports {
            if let (Some(from), Some(to)) = (import.from.top(), import.to.top()) {
                if from != to {
                    imports.entry(from).or_default().insert(to);
                }
            }
        }
        imports
    }
}

/// Modules that are test code: a `tests` module (tests.rs, tests/), and
/// modules declared under `#[cfg(test)]`, with all they hold.
struct TestCode(Vec<ModPath>);

impl TestCode {
    fn of(scanned: &[Scanned]) -> Self {
        let gated = scanned.iter().flat_map(|s| s.scan.test_modules.iter());
        Self(gated.cloned().collect())
    }

    fn has(&self, module: &ModPath) -> bool {
        module.segments().iter().any(|s| s == "tests")
            || self.0.iter().any(|gated| module.0.starts_with(&gated.0))
    }
}

/// Every reference out of non-test code, as an import of the deepest module
/// its path reaches (`decode::dns::hickory` is of `decode::dns`).
fn imports(scanned: &[Scanned], modules: &BTreeSet<ModPath>, tests: &TestCode) -> Vec<Import> {
    let mut imports = Vec::new();
    for file in scanned.iter().filter(|s| !tests.has(&s.module)) {
        for reference in &file.scan.refs {
            let to = deepest(modules, &reference.path);
            if to != file.module {
                let site = Site {
                    file: file.file.clone(),
                    line: reference.line,
                };
                let from = file.module.clone();
                imports.push(Import { site, from, to });
            }
        }
    }
    imports.sort();
    imports.dedup();
    imports
}

fn deepest(modules: &BTreeSet<ModPath>, path: &[String]) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| ModPath(path[..n].to_vec()))
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

/// The `.rs` files under `src`, relative to it, sorted.
fn rust_files(src: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src)?.to_string_lossy().into_owned();
                files.push(relative);
            }
        }
    }
    files.sort();
    Ok(files)
}
