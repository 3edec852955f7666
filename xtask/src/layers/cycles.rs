//! Loops in the module graph. Each import is lifted to the two sibling
//! modules it joins (`commands::trace` -> `probes` is `commands` -> `probes`,
//! `decode::dns` -> `decode::wire` stays), so a loop is one among siblings:
//! two parts of the tree that need each other, through whichever of their
//! files. An import between a module and its own ancestor is the ordinary
//! parent/child relation and left out.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
};

use super::{Import, ModPath, Site};

/// A loop of two modules or more, each with where it imports the next (the
/// last the first).
#[derive(Debug)]
pub struct Cycle(Vec<(ModPath, Site)>);

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let modules: Vec<String> = self.0.iter().map(|(m, _)| m.to_string()).collect();
        let sites: Vec<String> = self.0.iter().map(|(_, s)| s.to_string()).collect();
        let (round, back) = (modules.join(" -> "), &modules[0]);
        write!(f, "cycle: {round} -> {back} ({})", sites.join(", "))
    }
}

/// The lifted graph: each edge with where it is first seen.
type Graph = BTreeMap<ModPath, BTreeMap<ModPath, Site>>;

/// Loops, each once, that show every edge on a loop: for each edge not
/// shown yet, the shortest loop through it.
pub fn find(imports: &[Import]) -> Vec<Cycle> {
    let graph = lift(imports);
    let mut loops = BTreeSet::new();
    let mut shown = BTreeSet::new();
    for (from, tos) in &graph {
        for to in tos.keys() {
            if shown.contains(&(from.clone(), to.clone())) {
                continue;
            }
            if let Some(mut path) = shortest_path(&graph, to, from) {
                // [to, …, from] becomes [from, to, …].
                path.rotate_right(1);
                shown.extend(edges(&path).map(|(a, b)| (a.clone(), b.clone())));
                loops.insert(from_smallest(path));
            }
        }
    }
    loops
        .into_iter()
        .map(|path| with_sites(&graph, path))
        .collect()
}

fn lift(imports: &[Import]) -> Graph {
    let mut graph = Graph::new();
    for import in imports {
        if let Some((from, to)) = siblings(&import.from, &import.to) {
            let tos = graph.entry(from).or_default();
            tos.entry(to).or_insert_with(|| import.site.clone());
        }
    }
    graph
}

/// The children of `a` and `b`'s deepest common ancestor that hold them;
/// None when one is the other's ancestor.
fn siblings(a: &ModPath, b: &ModPath) -> Option<(ModPath, ModPath)> {
    let (a, b) = (a.segments(), b.segments());
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common == a.len() || common == b.len() {
        return None;
    }
    Some((
        ModPath::new(a[..=common].to_vec()),
        ModPath::new(b[..=common].to_vec()),
    ))
}

/// Breadth first: the path `[start, …, goal]` with the fewest edges.
fn shortest_path(graph: &Graph, start: &ModPath, goal: &ModPath) -> Option<Vec<ModPath>> {
    let mut came_from: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(at) = queue.pop_front() {
        if at == goal {
            let mut path = vec![at.clone()];
            while let Some(prev) = came_from.get(path.last()?) {
                path.push((*prev).clone());
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(at).into_iter().flat_map(|tos| tos.keys()) {
            if next != start && !came_from.contains_key(next) {
                came_from.insert(next, at);
                queue.push_back(next);
            }
        }
    }
    None
}

/// The same loop always starts at its smallest module, so it is found once.
fn from_smallest(mut path: Vec<ModPath>) -> Vec<ModPath> {
    let smallest = (0..path.len()).min_by_key(|&i| &path[i]).unwrap_or(0);
    path.rotate_left(smallest);
    path
}

/// A loop's edges, the last back to the first module.
fn edges(path: &[ModPath]) -> impl Iterator<Item = (&ModPath, &ModPath)> {
    path.iter().zip(path.iter().cycle().skip(1))
}

fn with_sites(graph: &Graph, path: Vec<ModPath>) -> Cycle {
    let sites: Vec<Site> = edges(&path).map(|(a, b)| graph[a][b].clone()).collect();
    Cycle(path.into_iter().zip(sites).collect())
}
