//! Just enough of Rust to find every path into the crate in one file:
//! `use` trees, inline `crate::x::Y`, `super::` and `self::` paths, and
//! paths through a name a `use` bound (`decode::dns::X` after `use
//! crate::decode;`). Comments, literals and `#[cfg(test)]` items are
//! skipped.
use std::collections::HashMap;

use super::ModPath;

/// What one file refers to in the rest of the crate.
#[derive(Debug, Default)]
pub struct FileScan {
    pub refs: Vec<Reference>,
    /// Modules declared under `#[cfg(test)]` (`mod testdir;`): test code.
    pub test_modules: Vec<ModPath>,
}

/// A path into the crate, from its root (`["decode", "dns", "hickory"]`).
#[derive(Debug, PartialEq)]
pub struct Reference {
    pub line: usize,
    pub path: Vec<String>,
}

pub fn scan(src: &str, module: &ModPath) -> FileScan {
    let tokens = lex(src);
    let mut parser = Parser {
        tokens: &tokens,
        at: 0,
        file: module.clone(),
        inline: Vec::new(),
        depth: 0,
        aliases: HashMap::new(),
        found: FileScan::default(),
    };
    parser.run();
    parser.found
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

struct Token {
    tok: Tok,
    line: usize,
}

/// Identifiers, `::` and the punctuation that shapes items; comments,
/// literals, numbers and the other operators are dropped.
fn lex(src: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        chars: src.chars().collect(),
        at: 0,
        line: 1,
        tokens: Vec::new(),
    };
    lexer.run();
    lexer.tokens
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
    tokens: Vec<Token>,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn bump(&mut self) {
        if self.peek(0) == Some('\n') {
            self.line += 1;
        }
        self.at += 1;
    }

    fn push(&mut self, tok: Tok) {
        self.tokens.push(Token {
            tok,
            line: self.line,
        });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            match (c, self.peek(1)) {
                ('/', Some('/')) => self.skip_line(),
                ('/', Some('*')) => self.skip_block_comment(),
                ('"', _) => self.skip_string(),
                ('\'', _) => self.skip_char_or_lifetime(),
                (':', Some(':')) => {
                    self.push(Tok::PathSep);
                    self.at += 2;
                }
                ('{' | '}' | '(' | ')' | '[' | ']' | ';' | ',' | '*' | '#' | '<', _) => {
                    self.push(Tok::Punct(c));
                    self.at += 1;
                }
                _ if c.is_alphabetic() || c == '_' => self.word(),
                _ if c.is_ascii_digit() => self.skip_word_chars(),
                _ => self.bump(),
            }
        }
    }

    fn skip_word_chars(&mut self) {
        while self
            .peek(0)
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            self.at += 1;
        }
    }

    fn skip_line(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.at += 1;
        }
    }

    /// Block comments nest.
    fn skip_block_comment(&mut self) {
        let mut depth = 0;
        while let Some(c) = self.peek(0) {
            match (c, self.peek(1)) {
                ('/', Some('*')) => {
                    depth += 1;
                    self.at += 2;
                }
                ('*', Some('/')) => {
                    depth -= 1;
                    self.at += 2;
                    if depth == 0 {
                        return;
                    }
                }
                _ => self.bump(),
            }
        }
    }

    /// From the opening quote past the closing one.
    fn skip_string(&mut self) {
        self.bump();
        while let Some(c) = self.peek(0) {
            self.bump();
            match c {
                '\\' => self.bump(),
                '"' => return,
                _ => {}
            }
        }
    }

    /// `'x'` and `'\n'` are characters; `'a` is a lifetime or a label,
    /// whose name is lexed as an identifier.
    fn skip_char_or_lifetime(&mut self) {
        if self.peek(1) == Some('\\') {
            self.at += 2;
            self.bump();
            while self.peek(0).is_some_and(|c| c != '\'') {
                self.bump();
            }
            self.bump();
        } else if self.peek(2) == Some('\'') {
            self.at += 3;
        } else {
            self.at += 1;
        }
    }

    /// An identifier, or the prefix of a literal (`r#"…"#`, `b"…"`) or a raw
    /// identifier (`r#type`).
    fn word(&mut self) {
        let start = self.at;
        self.skip_word_chars();
        let word: String = self.chars[start..self.at].iter().collect();
        let hashes = (0..).take_while(|&n| self.peek(n) == Some('#')).count();
        match (word.as_str(), self.peek(0)) {
            ("r" | "br" | "cr", Some('"' | '#')) if self.peek(hashes) == Some('"') => {
                self.skip_raw_string(hashes)
            }
            ("r", Some('#')) => {
                self.at += 1;
                self.word();
            }
            ("b" | "c", Some('"')) => self.skip_string(),
            _ => self.push(Tok::Ident(word)),
        }
    }

    /// From the `#`s before the opening quote past the closing quote and as
    /// many `#`s.
    fn skip_raw_string(&mut self, hashes: usize) {
        self.at += hashes + 1;
        while let Some(c) = self.peek(0) {
            if c == '"' && (1..=hashes).all(|n| self.peek(n) == Some('#')) {
                self.at += hashes + 1;
                return;
            }
            self.bump();
        }
    }
}

/// `#[cfg(test)]`, as tokens.
const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    file: ModPath,
    /// Inline modules (`mod x { … }`) open here, each with the brace depth
    /// it opened at.
    inline: Vec<(String, usize)>,
    depth: usize,
    /// Names a `use` bound to paths in the crate (`decode` after `use
    /// crate::decode;`), file-wide: scopes are not worth following here.
    aliases: HashMap<String, Vec<String>>,
    found: FileScan,
}

/// One path a use tree names, and the name it binds (none for a glob or `_`).
struct UseLeaf {
    path: Vec<String>,
    line: usize,
    binding: Option<String>,
}

impl<'a> Parser<'a> {
    fn tok(&self, ahead: usize) -> Option<&'a Tok> {
        self.tokens.get(self.at + ahead).map(|t| &t.tok)
    }

    fn ident(&self, ahead: usize) -> Option<&'a str> {
        match self.tok(ahead) {
            Some(Tok::Ident(name)) => Some(name),
            _ => None,
        }
    }

    fn is(&self, ahead: usize, tok: &Tok) -> bool {
        self.tok(ahead) == Some(tok)
    }

    fn line(&self) -> usize {
        self.tokens.get(self.at).map_or(0, |t| t.line)
    }

    /// The module the parser is in: the file's, and the inline ones open.
    fn module(&self) -> Vec<String> {
        let mut path = self.file.segments().to_vec();
        path.extend(self.inline.iter().map(|(name, _)| name.clone()));
        path
    }

    fn run(&mut self) {
        while let Some(tok) = self.tok(0) {
            match tok {
                Tok::Punct('#') if self.at_cfg_test() => self.skip_test_item(),
                Tok::Punct('{') => {
                    self.depth += 1;
                    self.at += 1;
                }
                Tok::Punct('}') => self.close_brace(),
                Tok::Ident(word) if word == "use" => self.use_declaration(),
                Tok::Ident(word) if word == "mod" => self.module_declaration(),
                Tok::Ident(_) if !self.after_path_sep() => self.inline_path(),
                _ => self.at += 1,
            }
        }
    }

    fn after_path_sep(&self) -> bool {
        self.at > 0 && self.tokens[self.at - 1].tok == Tok::PathSep
    }

    fn at_cfg_test(&self) -> bool {
        CFG_TEST
            .iter()
            .enumerate()
            .all(|(n, want)| match self.tok(n) {
                Some(Tok::Ident(name)) => name == want,
                Some(Tok::Punct(c)) => want.starts_with(*c),
                _ => false,
            })
    }

    /// Skips `#[cfg(test)]` and the item it gates, to its `;` or its closing
    /// brace. A gated `mod x;` makes file x test code.
    fn skip_test_item(&mut self) {
        self.at += CFG_TEST.len();
        let mut depth = 0;
        while let Some(tok) = self.tok(0) {
            match tok {
                Tok::Punct('{' | '(' | '[') => depth += 1,
                // The enclosing block ends: the gated thing was its last.
                Tok::Punct('}' | ')' | ']') if depth == 0 => return,
                Tok::Punct('}') if depth == 1 => {
                    self.at += 1;
                    return;
                }
                Tok::Punct('}' | ')' | ']') => depth -= 1,
                Tok::Punct(';') if depth == 0 => {
                    self.at += 1;
                    self.note_test_module();
                    return;
                }
                _ => {}
            }
            self.at += 1;
        }
    }

    /// After a gated item ending in `;`: `mod x;` declares a test module.
    fn note_test_module(&mut self) {
        if self.at < 3 || !matches!(&self.tokens[self.at - 3].tok, Tok::Ident(w) if w == "mod") {
            return;
        }
        if let Tok::Ident(name) = &self.tokens[self.at - 2].tok {
            let module = ModPath::new(self.module()).child(name);
            self.found.test_modules.push(module);
        }
    }

    fn close_brace(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        if self.inline.last().is_some_and(|(_, d)| *d == self.depth) {
            self.inline.pop();
        }
        self.at += 1;
    }

    /// `mod x { … }` opens an inline module; `mod x;` is only a name here.
    fn module_declaration(&mut self) {
        if let (Some(name), true) = (self.ident(1), self.is(2, &Tok::Punct('{'))) {
            self.inline.push((name.to_owned(), self.depth));
            self.at += 2;
        } else {
            self.at += 1;
        }
    }

    fn use_declaration(&mut self) {
        // `impl Trait + use<'a>` captures lifetimes: no use tree.
        if self.is(1, &Tok::Punct('<')) {
            self.at += 1;
            return;
        }
        self.at += 1;
        for leaf in self.use_tree(Vec::new()) {
            self.note_use(leaf);
        }
        while self.tok(0).is_some_and(|t| *t != Tok::Punct(';')) {
            self.at += 1;
        }
    }

    /// One use tree under `path`, to the paths it names.
    fn use_tree(&mut self, mut path: Vec<String>) -> Vec<UseLeaf> {
        loop {
            let line = self.line();
            match self.tok(0) {
                Some(Tok::Ident(name)) => {
                    path.push(name.clone());
                    self.at += 1;
                    if !self.is(0, &Tok::PathSep) {
                        return vec![self.use_leaf(path, line)];
                    }
                    self.at += 1;
                }
                // A leading `::`: an external crate, which resolves nowhere.
                Some(Tok::PathSep) => {
                    path.push(String::new());
                    self.at += 1;
                }
                Some(Tok::Punct('*')) => {
                    self.at += 1;
                    let binding = None;
                    return vec![UseLeaf {
                        path,
                        line,
                        binding,
                    }];
                }
                Some(Tok::Punct('{')) => {
                    self.at += 1;
                    return self.use_group(&path);
                }
                _ => return Vec::new(),
            }
        }
    }

    /// The trees of `{ a, b::{c, d} }`, after its `{`.
    fn use_group(&mut self, prefix: &[String]) -> Vec<UseLeaf> {
        let mut leaves = Vec::new();
        loop {
            match self.tok(0) {
                Some(Tok::Punct('}')) => {
                    self.at += 1;
                    return leaves;
                }
                Some(Tok::Punct(';')) | None => return leaves,
                Some(Tok::Punct(',')) => self.at += 1,
                Some(_) => {
                    let before = self.at;
                    leaves.extend(self.use_tree(prefix.to_vec()));
                    if self.at == before {
                        self.at += 1;
                    }
                }
            }
        }
    }

    /// The end of a use path: `x`, `x as y`, `x::{self}`.
    fn use_leaf(&mut self, mut path: Vec<String>, line: usize) -> UseLeaf {
        if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let mut binding = path.last().cloned();
        if self.ident(0) == Some("as") {
            binding = self.ident(1).filter(|n| *n != "_").map(str::to_owned);
            self.at += 2;
        }
        UseLeaf {
            path,
            line,
            binding,
        }
    }

    fn note_use(&mut self, leaf: UseLeaf) {
        let Some(path) = self.resolve(&leaf.path) else {
            return;
        };
        // Only a module's name (snake case): a type's `Ring::new` adds
        // nothing to the `use` of `Ring`.
        let module_name = |name: &String| name.starts_with(|c: char| c.is_lowercase());
        if let Some(name) = leaf.binding.filter(module_name) {
            self.aliases.insert(name, path.clone());
        }
        let line = leaf.line;
        self.found.refs.push(Reference { line, path });
    }

    /// A path in code (`crate::x::Y`, `super::x`, `decode::dns::X` through
    /// a `use` name); a lone name refers to nothing new.
    fn inline_path(&mut self) {
        let mut path = Vec::new();
        let mut line = self.line();
        while let Some(name) = self.ident(0) {
            path.push(name.to_owned());
            line = self.line();
            if !(self.is(1, &Tok::PathSep) && self.ident(2).is_some()) {
                self.at += 1;
                break;
            }
            self.at += 2;
        }
        if path.len() < 2 {
            return;
        }
        if let Some(path) = self.resolve(&path) {
            self.found.refs.push(Reference { line, path });
        }
    }

    /// A path as written here, from the crate root; None outside the crate.
    fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let (mut resolved, rest) = match first.as_str() {
            "crate" => (Vec::new(), rest),
            "self" | "super" => (self.module(), path),
            name => (self.aliases.get(name)?.clone(), rest),
        };
        for segment in rest {
            match segment.as_str() {
                "self" => {}
                "super" => {
                    resolved.pop()?;
                }
                _ => resolved.push(segment.clone()),
            }
        }
        Some(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(src: &str, module: &[&str]) -> Vec<(usize, String)> {
        let module = ModPath::new(module.iter().map(|s| s.to_string()).collect());
        scan(src, &module)
            .refs
            .into_iter()
            .map(|r| (r.line, r.path.join("::")))
            .collect()
    }

    #[test]
    fn a_use_tree_names_every_leaf() {
        let src = "use crate::{\n    a::{b, c as d, self},\n    e::*,\n};\nuse std::fmt;\n";
        assert_eq!(
            paths(src, &["x"]),
            [
                (2, "a::b".into()),
                (2, "a::c".into()),
                (2, "a".into()),
                (3, "e".into())
            ]
        );
    }

    #[test]
    fn super_self_and_use_names_resolve_from_the_module() {
        let src = "use super::super::y;\nfn f() { self::g::h(); y::z::W; super::q(); }\nmod inner {\n    use super::k;\n}\n";
        assert_eq!(
            paths(src, &["a", "b", "c"]),
            [
                (1, "a::y".into()),
                (2, "a::b::c::g::h".into()),
                (2, "a::y::z::W".into()),
                (2, "a::b::q".into()),
                (4, "a::b::c::k".into())
            ]
        );
    }

    #[test]
    fn literals_comments_and_lifetimes_hide_nothing_else() {
        let src = "/* crate::a /* nested */ crate::b */\nfn f<'a>(x: &'a str) -> char { let _ = (r#\"crate::c\"#, b\"crate::d\", '\"', '\\'');\n crate::e::F }\n";
        assert_eq!(paths(src, &[]), [(3, "e::F".into())]);
    }
}
