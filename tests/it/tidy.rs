//! Tidy tests, in rust-analyzer's manner: the source tree itself holds the
//! structure `ARCHITECTURE.md` declares.
//!
//! [`tidy_layers_have_no_back_edges`] reads every `crate::`, `super::`,
//! `self::` and child-module path of every file in `src/` (in `use`
//! trees, `pub use` re-exports and expressions alike; `#[cfg(test)]` items
//! and test-only files left out) and fails on an import that runs up the
//! layer order; [`tidy_files_form_no_circles`] fails on files that use each
//! other in a circle. A path is followed through the re-exports of the
//! module it names, to the file that defines the item. A file may use its
//! own ancestors (a module's `mod.rs` is the face its files share); every
//! other edge counts.
//!
//! The order is [`LAYERS`], which must match the table under `## Layers` in
//! `ARCHITECTURE.md` ([`tidy_layer_order_matches_architecture_md`]).
//!
//! The reader is a small tokenizer, not a Rust parser: good enough for this
//! code base (comments, strings, raw strings, char literals and lifetimes,
//! attributes, `use a::{b, c::{d, e as f}}` groups, inline modules).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// The layers, top first: a module may use only the modules listed below
/// it. The same list, with what each layer owns, heads `ARCHITECTURE.md`.
const LAYERS: &[&str] = &[
    "main",
    "wiring",
    "config",
    "transport",
    "http",
    "engine",
    "runner",
    "access",
    "agent",
    "worktree",
    "schedule",
    "tools",
    "delivery",
    "media",
    "adapter",
    "reply",
    "systemd",
    "journal",
    "limits",
    "clock",
    "store",
    "metrics",
    "listener",
    "instance_lock",
    "secrets",
    "private_fs",
    "memory",
    "vocab",
];

/// The crate's name: `main.rs` reaches the library through it.
const CRATE: &str = "telegate";

#[test]
fn tidy_layers_have_no_back_edges() {
    let tree = SourceTree::read(&repo().join("src"));
    let layers = Layers::new(LAYERS);
    let docs = layer_docs();
    let back_edges = tree.back_edges(&layers);
    let mut report = String::new();
    for edge in &back_edges {
        report.push_str(&edge.explain(&layers, &docs));
    }
    assert!(
        back_edges.is_empty(),
        "{} import(s) run up the layer order (ARCHITECTURE.md, `## Layers`):\n\n{report}",
        back_edges.len()
    );
}

#[test]
fn tidy_files_form_no_circles() {
    let tree = SourceTree::read(&repo().join("src"));
    let circles = tree.circles();
    let report: String = circles.iter().map(Circle::explain).collect();
    assert!(
        circles.is_empty(),
        "{} circle(s) of files using each other:\n\n{report}",
        circles.len()
    );
}

#[test]
fn tidy_layer_order_matches_architecture_md() {
    let documented: Vec<String> = layer_docs().into_iter().map(|(name, _)| name).collect();
    let declared: Vec<String> = LAYERS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        documented, declared,
        "the layer table under `## Layers` in ARCHITECTURE.md and LAYERS in tests/it/tidy.rs \
         must list the same modules in the same order (top first)"
    );
    let tree = SourceTree::read(&repo().join("src"));
    let mut top: BTreeSet<String> = tree.top_level_modules();
    top.remove("lib");
    let missing: Vec<&String> = top
        .iter()
        .filter(|m| !LAYERS.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "top-level modules without a layer: {missing:?}; add each to LAYERS (tests/it/tidy.rs) \
         and to the table under `## Layers` in ARCHITECTURE.md, above everything it uses and \
         below everything that uses it"
    );
}

#[test]
fn tidy_imports_are_named() {
    let tree = SourceTree::read(&repo().join("src"));
    let globs: Vec<String> = tree
        .files
        .iter()
        .flat_map(|file| {
            file.paths
                .iter()
                .filter(|p| p.glob && tree.absolute(file, &p.segments).is_some())
                .map(move |p| format!("  {}:{}: `{}::*`\n", file.path, p.line, p.text()))
        })
        .collect();
    assert!(
        globs.is_empty(),
        "glob imports of crate items outside `mod tests` (name what you use):\n{}",
        globs.join("")
    );
}

/// Who may name the whole [`Store`](telegate::store::Store) outside
/// `src/store/` and `src/wiring/` (which builds every layer's narrow
/// handles from it, in `wiring::tables`), each with its reason.
const STORE_HOLDERS: &[(&str, &str)] = &[(
    "src/transport/telegram/mod.rs",
    "the running TelegramBot owns the one store: it closes it at shutdown",
)];

/// Each layer holds only the store handles of the tables it touches
/// (`Inbox`, `Transcripts`, ... or a layer's own `*Tables` of them), so a
/// file's imports say which tables it can change: nobody else names the
/// whole `Store` (tests and `mod tests` may).
#[test]
fn tidy_only_the_wiring_holds_the_whole_store() {
    let tree = SourceTree::read(&repo().join("src"));
    let report = whole_store_users(&tree);
    assert!(
        report.is_empty(),
        "files outside src/store and src/wiring that name the whole Store (take the handles \
         of the tables you use, built in wiring::tables; or list the file in STORE_HOLDERS \
         with its reason):\n{}",
        report.join("")
    );
}

/// The store checker sees a planted holder and passes a narrow handle.
#[test]
fn tidy_store_checker_sees_a_planted_holder() {
    let files = [
        (
            "src/lib.rs",
            "pub mod store;\npub mod runner;\npub mod wiring;\n",
        ),
        ("src/store/mod.rs", "pub struct Store;\npub struct Inbox;\n"),
        ("src/wiring/mod.rs", "use crate::store::Store;\n"),
        (
            "src/runner/mod.rs",
            "use crate::store::{Inbox, Store};\nfn f(_: crate::store::Store) {}\n\
             #[cfg(test)]\nmod tests { use crate::store::Store; }\n",
        ),
    ];
    let tree = SourceTree::from_files(files.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    let report = whole_store_users(&tree);
    assert_eq!(
        report.len(),
        2,
        "the import and the path in runner: {report:?}"
    );
    assert!(report.iter().all(|line| line.contains("src/runner/mod.rs")));
}

fn whole_store_users(tree: &SourceTree) -> Vec<String> {
    let mut report = Vec::new();
    for file in &tree.files {
        if file.path.starts_with("src/store/")
            || file.path.starts_with("src/wiring/")
            || STORE_HOLDERS.iter().any(|(path, _)| *path == file.path)
        {
            continue;
        }
        for path in &file.paths {
            let Some(absolute) = tree.absolute(file, &path.segments) else {
                continue;
            };
            if absolute.ends_with(&["store".to_string(), "Store".to_string()]) {
                report.push(format!(
                    "  {}:{}: `{}`\n",
                    file.path,
                    path.line,
                    path.text()
                ));
            }
        }
    }
    report
}

/// The checker itself: it must see a back-edge and a circle planted in a
/// small tree (so a passing tidy test means something).
#[test]
fn tidy_checker_sees_a_planted_back_edge_and_circle() {
    let files = [
        ("src/lib.rs", "pub mod high;\npub mod low;\n"),
        (
            "src/low/mod.rs",
            "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\npub use a::A;\n",
        ),
        (
            "src/low/a.rs",
            "use super::b::{self, B};\n/// use crate::high::H; (a comment)\npub struct A;\n",
        ),
        (
            "src/low/b.rs",
            "pub struct B;\nfn f() -> super::A { let _ = \"crate::high::H\"; super::A }\n\
             fn g() { crate::high::H::new(); }\n",
        ),
        ("src/low/tests.rs", "use crate::high::H;\n"),
        (
            "src/high.rs",
            "pub struct H;\n#[cfg(test)]\nmod tests { use crate::low::A; }\n",
        ),
    ];
    let tree = SourceTree::from_files(files.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    let layers = Layers::new(&["high", "low"]);
    let back: Vec<String> = tree
        .back_edges(&layers)
        .iter()
        .map(|e| format!("{}:{}", e.file, e.line))
        .collect();
    assert_eq!(
        back,
        ["src/low/b.rs:3"],
        "only the expression path, not the comment, string or test file"
    );
    let circles = tree.circles();
    assert_eq!(circles.len(), 1);
    assert_eq!(
        circles[0].files,
        ["low::a", "low::b"],
        "a -> b -> (super::A = a) -> a"
    );
    assert!(
        tree.back_edges(&Layers::new(&["low", "high"])).is_empty(),
        "low above high may use it"
    );
}

/// The longest a function in `src/` may be, in lines from `fn` to its
/// closing brace. A function longer than this does several things: split it
/// into functions named by what they decide or do.
const MAX_FN_LINES: usize = 80;

/// Functions that may stay longer than [`MAX_FN_LINES`]: flat tables (a
/// list of independent checks, a match whose arms are one line each), where
/// splitting would only scatter the table. (file, function, why).
const LONG_FN_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "src/metrics/mod.rs",
        "declare",
        "the metrics table: one (name, help, field) row per metric",
    ),
    (
        "src/config/checks.rs",
        "durations",
        "the duration keys: one (key, value, unit) row per setting",
    ),
];

/// Functions still longer than [`MAX_FN_LINES`] that are not flat tables:
/// debt from before the limit (issue 22). This list only shrinks; a function
/// leaves it when it is split. (file, function).
const LONG_FN_NOT_YET_SPLIT: &[(&str, &str)] = &[];

#[test]
fn tidy_functions_stay_short() {
    let tree = SourceTree::read(&repo().join("src"));
    let mut long = Vec::new();
    for file in &tree.files {
        if file
            .path
            .split('/')
            .any(|part| part == "tests" || part == "tests.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(repo().join(&file.path)).expect("source file");
        for f in long_functions(&tokenize(&text), MAX_FN_LINES) {
            long.push((file.path.clone(), f));
        }
    }
    let allowed = |path: &str, name: &str| {
        LONG_FN_ALLOWED
            .iter()
            .any(|(p, n, _)| *p == path && *n == name)
            || LONG_FN_NOT_YET_SPLIT
                .iter()
                .any(|(p, n)| *p == path && *n == name)
    };
    let report: Vec<String> = long
        .iter()
        .filter(|(path, f)| !allowed(path, &f.name))
        .map(|(path, f)| format!("  {path}:{}: `{}` is {} lines\n", f.line, f.name, f.lines))
        .collect();
    assert!(
        report.is_empty(),
        "functions over {MAX_FN_LINES} lines (split each into functions named by what they \
         decide or do; a genuinely flat table goes on LONG_FN_ALLOWED in tests/it/tidy.rs \
         with its reason):\n{}",
        report.join("")
    );
    let stale: Vec<String> = LONG_FN_ALLOWED
        .iter()
        .map(|(p, n, _)| (p, n))
        .chain(LONG_FN_NOT_YET_SPLIT.iter().map(|(p, n)| (p, n)))
        .filter(|(p, n)| !long.iter().any(|(path, f)| path == **p && f.name == **n))
        .map(|(p, n)| format!("  {p}: `{n}`\n"))
        .collect();
    assert!(
        stale.is_empty(),
        "allowlisted long functions that are short now (or gone): take them off the list in \
         tests/it/tidy.rs:\n{}",
        stale.join("")
    );
}

/// The length checker itself: a planted long function is seen, a short
/// one, a body-less trait method and a `#[cfg(test)]` module are not.
#[test]
fn tidy_length_checker_sees_a_planted_long_function() {
    let body = "    let x = 1;\n".repeat(5);
    let text = format!(
        "trait T {{ fn decl(&self); }}\n\
         fn short() {{\n{body}}}\n\
         pub(crate) async fn long<F: Fn() -> u8>(f: F) -> Result<(), ()> where F: Send {{\n\
         {body}    fn inner() {{ let s = \"}}\"; }}\n{body}}}\n\
         #[cfg(test)]\nmod tests {{\n    fn in_test() {{\n{body}{body}{body}    }}\n}}\n"
    );
    let found = long_functions(&tokenize(&text), 8);
    let seen: Vec<(String, usize)> = found.iter().map(|f| (f.name.clone(), f.lines)).collect();
    assert_eq!(seen, [("long".to_string(), 13)]);
}

/// A function longer than the limit.
#[derive(Debug)]
struct LongFn {
    name: String,
    /// The line of its `fn`.
    line: usize,
    /// From its `fn` to its closing brace, both included.
    lines: usize,
}

/// Every function with a body longer than `max` lines, nested ones too,
/// outside `#[cfg(test)]` items.
fn long_functions(tokens: &[Token], max: usize) -> Vec<LongFn> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].tok == Tok::Punct('#') && is_cfg_test(tokens, i) {
            i = skip_item(tokens, i);
            continue;
        }
        if let (Tok::Ident(word), Some(Tok::Ident(name))) =
            (&tokens[i].tok, tokens.get(i + 1).map(|t| &t.tok))
        {
            if word == "fn" {
                if let Some(close) = body_end(tokens, i + 2) {
                    let lines = tokens[close].line - tokens[i].line + 1;
                    if lines > max {
                        found.push(LongFn {
                            name: name.clone(),
                            line: tokens[i].line,
                            lines,
                        });
                    }
                }
            }
        }
        i += 1;
    }
    found
}

/// The index of the `}` closing the body of the function whose signature
/// continues at `i`; `None` for a declaration without a body.
fn body_end(tokens: &[Token], mut i: usize) -> Option<usize> {
    let mut nesting = 0usize;
    while let Some(token) = tokens.get(i) {
        match token.tok {
            Tok::Punct('(' | '[') => nesting += 1,
            Tok::Punct(')' | ']') => nesting = nesting.saturating_sub(1),
            Tok::Punct(';') if nesting == 0 => return None,
            Tok::Punct('{') if nesting == 0 => break,
            _ => {}
        }
        i += 1;
    }
    let mut depth = 0usize;
    while let Some(token) = tokens.get(i) {
        match token.tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Past the item starting at `i` (its attributes, then up to its `;` or
/// the end of its block).
fn skip_item(tokens: &[Token], mut i: usize) -> usize {
    while tokens.get(i).is_some_and(|t| t.tok == Tok::Punct('#')) {
        i = skip_attribute(tokens, i);
    }
    let mut depth = 0usize;
    while let Some(token) = tokens.get(i) {
        i += 1;
        match token.tok {
            Tok::Punct(';') if depth == 0 => return i,
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    i
}

/// What only `tests/it/support/test_bot.rs` may write: a call that starts a
/// Telegram bot, and a `[telegram]` table with a token in a Rust string (a
/// hand-written base configuration). Split so this file does not match.
const BOT_START: &str = concat!("TelegramBot", "::start");
const TELEGRAM_HEADER: &str = concat!("[tele", "gram]");

/// Files under `tests/it` that write their own `[telegram]` table with a
/// token, with the reason. (file, why).
const OWN_TELEGRAM_TOML: &[(&str, &str)] = &[
    (
        "tests/it/cli.rs",
        "writes a config file for the telegate binary",
    ),
    (
        "tests/it/config_security_cli.rs",
        "tests the loader's errors and file handling: the exact text matters",
    ),
    (
        "tests/it/store_integrity.rs",
        "`check-config` on exact files: its errors name their line (`bot.toml:5`)",
    ),
];

/// The bots of the integration tests start through `TestBot`, which owns
/// the base configuration (the fake's token and URL): a test gives only
/// the settings it is about, as TOML fragments merged into that base.
#[test]
fn tidy_tests_start_bots_through_test_bot() {
    let report = bot_setup_outside_test_bot(&read_tree(&repo().join("tests/it")));
    assert!(
        report.is_empty(),
        "tests that start a bot or write its `[telegram]` token themselves (use \
         support::test_bot::TestBot; a file that must write its own configuration goes on \
         OWN_TELEGRAM_TOML in tests/it/tidy.rs with its reason):\n{}",
        report.join("")
    );
    let stale: Vec<String> = OWN_TELEGRAM_TOML
        .iter()
        .filter(|(path, _)| {
            let text = std::fs::read_to_string(repo().join(path)).unwrap_or_default();
            telegram_headers(&text).is_empty()
        })
        .map(|(path, _)| format!("  {path}\n"))
        .collect();
    assert!(
        stale.is_empty(),
        "OWN_TELEGRAM_TOML lists files without a `[telegram]` table (take them off):\n{}",
        stale.join("")
    );
}

/// The checker itself sees a planted start call and a planted table.
#[test]
fn tidy_test_bot_checker_sees_a_planted_start_and_table() {
    let call = format!("let bot = {BOT_START}(&config).await;\n");
    let table = format!("let text = \"{TELEGRAM_HEADER}\\ntoken = \\\"1:T\\\"\\n\";\n");
    let raw = format!("let text = r#\"\n{TELEGRAM_HEADER}\ntoken = \"1:T\"\n\"#;\n");
    let doc = format!("/// `{TELEGRAM_HEADER} approvers`: who answers.\n");
    let fragment = format!("bot.toml(\"{TELEGRAM_HEADER}\\nmode = \\\"webhook\\\"\\n\");\n");
    let files = vec![
        ("tests/it/a.rs".to_string(), call),
        ("tests/it/b.rs".to_string(), table),
        ("tests/it/c.rs".to_string(), raw),
        ("tests/it/d.rs".to_string(), doc),
        ("tests/it/e.rs".to_string(), fragment),
        (
            "tests/it/support/test_bot.rs".to_string(),
            format!("{BOT_START}(&config)\n"),
        ),
    ];
    let report = bot_setup_outside_test_bot(&files);
    assert_eq!(
        report,
        [
            format!("  tests/it/a.rs:1: `{BOT_START}`\n"),
            format!("  tests/it/b.rs:1: a `{TELEGRAM_HEADER}` table\n"),
            format!("  tests/it/c.rs:2: a `{TELEGRAM_HEADER}` table\n"),
        ]
    );
}

/// Every start call and `[telegram]` table outside `test_bot.rs` (and the
/// tables of the files on [`OWN_TELEGRAM_TOML`]), as report lines.
fn bot_setup_outside_test_bot(files: &[(String, String)]) -> Vec<String> {
    let mut report = Vec::new();
    for (path, text) in files {
        if path == "tests/it/support/test_bot.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.contains(BOT_START) {
                report.push(format!("  {path}:{}: `{BOT_START}`\n", n + 1));
            }
        }
        if OWN_TELEGRAM_TOML.iter().any(|(p, _)| p == path) {
            continue;
        }
        for line in telegram_headers(text) {
            report.push(format!("  {path}:{line}: a `{TELEGRAM_HEADER}` table\n"));
        }
    }
    report
}

/// The lines (from 1) where `text` writes a `[telegram]` table with its
/// token in a string: the header followed by an escaped newline and
/// `token`, or alone on a line (a raw or multi-line string) with `token`
/// on the next. A fragment adding other `[telegram]` keys is not one, nor
/// is a doc comment naming a key.
fn telegram_headers(text: &str) -> Vec<usize> {
    let escaped = format!("{TELEGRAM_HEADER}\\ntoken");
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .filter(|&n| {
            lines[n].contains(&escaped)
                || (lines[n].trim() == TELEGRAM_HEADER
                    && lines
                        .get(n + 1)
                        .is_some_and(|next| next.trim_start().starts_with("token")))
        })
        .map(|n| n + 1)
        .collect()
}

/// Every `.rs` file below `dir`: (path from the repo, text), sorted.
fn read_tree(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(repo()).expect("under the repo");
                let text = std::fs::read_to_string(&path).expect("test file");
                found.push((rel.to_string_lossy().into_owned(), text));
            }
        }
    }
    found.sort();
    found
}

// ----- the reader -----

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The `## Layers` table of ARCHITECTURE.md: (module, what it owns), top first.
fn layer_docs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut rows = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == "## Layers";
            continue;
        }
        if !inside || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if let [name, owns, ..] = cells.as_slice() {
            rows.push((name.trim_matches('`').to_string(), owns.to_string()));
        }
    }
    rows
}

/// Layer ranks: higher is further up.
struct Layers {
    rank: HashMap<String, usize>,
}

impl Layers {
    fn new(top_first: &[&str]) -> Layers {
        let n = top_first.len();
        Layers {
            rank: top_first
                .iter()
                .enumerate()
                .map(|(i, name)| (name.to_string(), n - i))
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

/// One path as written: `crate::a::B`, `super::x`, a `use` leaf.
#[derive(Clone, Debug)]
struct PathRef {
    segments: Vec<String>,
    line: usize,
    /// A `use …::*` leaf.
    glob: bool,
}

impl PathRef {
    fn text(&self) -> String {
        self.segments.join("::")
    }
}

/// A module-level `use` binding: `name` stands for `target` here.
#[derive(Clone, Debug)]
struct Binding {
    name: String,
    target: Vec<String>,
}

#[derive(Debug)]
struct SourceFile {
    /// `src/adapter/owner.rs`.
    path: String,
    /// `["adapter", "owner"]`; `["main"]` for the binary.
    module: Vec<String>,
    paths: Vec<PathRef>,
    bindings: Vec<Binding>,
    /// Modules glob-imported at module level (`use x::*`).
    globs: Vec<Vec<String>>,
    /// Names of items defined at module level.
    defined: BTreeSet<String>,
    /// Children declared `#[cfg(test)] mod name;`.
    test_children: Vec<String>,
}

struct SourceTree {
    files: Vec<SourceFile>,
    modules: HashMap<Vec<String>, usize>,
}

/// A use of one module by another.
#[derive(Clone, Debug)]
struct Edge {
    file: String,
    line: usize,
    path: String,
    from: Vec<String>,
    to: Vec<String>,
}

impl Edge {
    fn explain(&self, layers: &Layers, docs: &[(String, String)]) -> String {
        let (from, to) = (&self.from[0], &self.to[0]);
        let owns = |name: &str| {
            docs.iter()
                .find(|(n, _)| n == name)
                .map_or("(not in the ARCHITECTURE.md table)", |(_, o)| o.as_str())
                .to_string()
        };
        let rank = |name: &str| layers.rank.get(name).copied().unwrap_or(0);
        format!(
            "{}:{}: `{}`: {from} uses {to}, which is {}.\n  \
             {from}: {}\n  {to}: {}\n  \
             A layer uses only the layers below it. Move what both need down to the layer \
             that owns it (words several layers share: `vocab`), or let the lower layer \
             declare a trait (a port) that the higher one implements.\n\n",
            self.file,
            self.line,
            self.path,
            if rank(to) == 0 {
                "in no layer (add it to LAYERS and ARCHITECTURE.md)".to_string()
            } else if rank(to) == rank(from) {
                "the same layer".to_string()
            } else {
                "above it".to_string()
            },
            owns(from),
            owns(to),
        )
    }
}

/// Files that use each other in a circle, with the edges that close it.
#[derive(Debug)]
struct Circle {
    files: Vec<String>,
    edges: Vec<Edge>,
}

impl Circle {
    fn explain(&self) -> String {
        let mut text = format!("circle: {}\n", self.files.join(", "));
        for edge in &self.edges {
            text.push_str(&format!(
                "  {}:{}: `{}` ({} -> {})\n",
                edge.file,
                edge.line,
                edge.path,
                edge.from.join("::"),
                edge.to.join("::")
            ));
        }
        text.push_str(
            "  Break it: move what the files share into a file of its own that uses neither \
             (a file may always use its own module's mod.rs).\n\n",
        );
        text
    }
}

impl SourceTree {
    fn read(src: &Path) -> SourceTree {
        let mut found = Vec::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("dir entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let rel = path
                        .strip_prefix(src.parent().expect("repo"))
                        .expect("under repo");
                    let text = std::fs::read_to_string(&path).expect("source file");
                    found.push((rel.to_string_lossy().into_owned(), text));
                }
            }
        }
        SourceTree::from_files(found)
    }

    fn from_files(files: impl IntoIterator<Item = (String, String)>) -> SourceTree {
        let mut files: Vec<SourceFile> = files
            .into_iter()
            .map(|(path, text)| SourceFile::parse(path, &text))
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let test_only: BTreeSet<Vec<String>> = files
            .iter()
            .flat_map(|f| {
                f.test_children.iter().map(|c| {
                    let mut m = f.module.clone();
                    m.push(c.clone());
                    m
                })
            })
            .collect();
        files.retain(|f| !test_only.iter().any(|t| f.module.starts_with(t)));
        let modules = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        SourceTree { files, modules }
    }

    fn top_level_modules(&self) -> BTreeSet<String> {
        self.files
            .iter()
            .map(|f| {
                f.module
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "lib".to_string())
            })
            .collect()
    }

    /// `segments` as an absolute path from the crate root, if it names
    /// something of this crate.
    fn absolute(&self, file: &SourceFile, segments: &[String]) -> Option<Vec<String>> {
        absolute_in(&file.module, segments, |m| self.modules.contains_key(m))
    }

    /// The module (file) that defines what `path` names, following
    /// re-exports and imports of the modules on the way.
    fn locate(&self, path: &[String], depth: usize) -> Option<Vec<String>> {
        let mut n = path.len();
        while n > 0 && !self.modules.contains_key(&path[..n]) {
            n -= 1;
        }
        let module = path[..n].to_vec();
        let (Some(name), Some(&index)) = (path.get(n), self.modules.get(&module)) else {
            return Some(module);
        };
        if depth > 8 {
            return Some(module);
        }
        let file = &self.files[index];
        if file.defined.contains(name) {
            return Some(module);
        }
        if let Some(binding) = file.bindings.iter().find(|b| &b.name == name) {
            let mut target = self.absolute(file, &binding.target)?;
            target.extend_from_slice(&path[n + 1..]);
            return self.locate(&target, depth + 1);
        }
        for glob in &file.globs {
            let Some(mut target) = self.absolute(file, glob) else {
                continue;
            };
            let provides = self
                .modules
                .get(&target)
                .map(|&i| &self.files[i])
                .is_some_and(|g| {
                    g.defined.contains(name) || g.bindings.iter().any(|b| &b.name == name)
                });
            if provides {
                target.extend_from_slice(&path[n..]);
                return self.locate(&target, depth + 1);
            }
        }
        Some(module)
    }

    /// Every use of one module by another (not of its own ancestors).
    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for file in &self.files {
            for path in &file.paths {
                let Some(absolute) = self.absolute(file, &path.segments) else {
                    continue;
                };
                let Some(to) = self.locate(&absolute, 0) else {
                    continue;
                };
                if to.is_empty() || file.module.starts_with(&to) {
                    continue;
                }
                edges.push(Edge {
                    file: file.path.clone(),
                    line: path.line,
                    path: path.text(),
                    from: file.module.clone(),
                    to,
                });
            }
        }
        edges
    }

    fn back_edges(&self, layers: &Layers) -> Vec<Edge> {
        self.edges()
            .into_iter()
            .filter(|e| !e.from.is_empty() && e.from[0] != e.to[0])
            .filter(|e| {
                let rank = |m: &Vec<String>| layers.rank.get(&m[0]).copied();
                match (rank(&e.from), rank(&e.to)) {
                    (Some(from), Some(to)) => to >= from,
                    _ => true,
                }
            })
            .collect()
    }

    /// Strongly connected groups of more than one file (Tarjan), each with
    /// the edges inside it.
    fn circles(&self) -> Vec<Circle> {
        let edges = self.edges();
        let mut graph: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
        for edge in &edges {
            graph.entry(&edge.from).or_default().insert(&edge.to);
        }
        let nodes: Vec<&Vec<String>> = self.files.iter().map(|f| &f.module).collect();
        let components = strongly_connected(&nodes, &graph);
        components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|component| {
                let inside: BTreeSet<&Vec<String>> = component.iter().copied().collect();
                let mut seen = BTreeSet::new();
                let edges = edges
                    .iter()
                    .filter(|e| inside.contains(&e.from) && inside.contains(&e.to))
                    .filter(|e| seen.insert((e.from.clone(), e.to.clone())))
                    .cloned()
                    .collect();
                let mut files: Vec<String> = component.iter().map(|m| m.join("::")).collect();
                files.sort();
                Circle { files, edges }
            })
            .collect()
    }
}

fn strongly_connected<'a>(
    nodes: &[&'a Vec<String>],
    graph: &BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
) -> Vec<Vec<&'a Vec<String>>> {
    struct State<'a> {
        index: HashMap<&'a Vec<String>, usize>,
        low: HashMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<&'a Vec<String>>>,
    }
    fn visit<'a>(
        v: &'a Vec<String>,
        graph: &BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
        s: &mut State<'a>,
    ) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut state = State {
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &node in nodes {
        if !state.index.contains_key(node) {
            visit(node, graph, &mut state);
        }
    }
    state.out
}

/// `segments`, written in module `module`, from the crate root; `None` for
/// paths outside the crate (std, dependencies, local names).
fn absolute_in(
    module: &[String],
    segments: &[String],
    is_module: impl Fn(&[String]) -> bool,
) -> Option<Vec<String>> {
    let first = segments.first()?.as_str();
    let binary = module == ["main"];
    let mut rest = segments;
    let mut base: Vec<String> = match first {
        "crate" if !binary => {
            rest = &segments[1..];
            Vec::new()
        }
        CRATE if binary => {
            rest = &segments[1..];
            Vec::new()
        }
        "self" => {
            rest = &segments[1..];
            module.to_vec()
        }
        "super" => {
            let mut base = module.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base
        }
        _ => {
            let mut child = module.to_vec();
            child.push(first.to_string());
            if binary || !is_module(&child) {
                return None;
            }
            module.to_vec()
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

impl SourceFile {
    fn parse(path: String, text: &str) -> SourceFile {
        let module = module_of(&path);
        let tokens = tokenize(text);
        let mut file = SourceFile {
            path,
            module,
            paths: Vec::new(),
            bindings: Vec::new(),
            globs: Vec::new(),
            defined: BTreeSet::new(),
            test_children: Vec::new(),
        };
        file.read(&tokens);
        file
    }

    fn read(&mut self, tokens: &[Token]) {
        let ident = |i: usize| match tokens.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(s)) => Some(s.as_str()),
            _ => None,
        };
        let punct = |i: usize, c: char| tokens.get(i).is_some_and(|t| t.tok == Tok::Punct(c));
        let sep = |i: usize| tokens.get(i).is_some_and(|t| t.tok == Tok::PathSep);
        let mut depth = 0usize;
        // Depths at which inline modules opened (their items are not the
        // file's module-level items).
        let mut inline: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            if punct(i, '#') && is_cfg_test(tokens, i) {
                i = self.skip_test_item(tokens, i);
                continue;
            }
            match &tokens[i].tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(word) => {
                    let top = depth == 0;
                    if word == "use" {
                        let mut leaves = Vec::new();
                        i = parse_use_tree(tokens, i + 1, &mut Vec::new(), &mut leaves);
                        for (leaf, alias) in leaves {
                            if top && inline.is_empty() {
                                if leaf.glob {
                                    self.globs.push(leaf.segments.clone());
                                } else if let Some(name) =
                                    alias.or_else(|| leaf.segments.last().cloned())
                                {
                                    self.bindings.push(Binding {
                                        name,
                                        target: leaf.segments.clone(),
                                    });
                                }
                            }
                            self.paths.push(leaf);
                        }
                        continue;
                    }
                    let item = matches!(
                        word.as_str(),
                        "struct"
                            | "enum"
                            | "fn"
                            | "const"
                            | "static"
                            | "trait"
                            | "type"
                            | "union"
                            | "mod"
                    );
                    if item && top && inline.is_empty() {
                        if let Some(name) = ident(i + 1) {
                            self.defined.insert(name.to_string());
                        }
                    }
                    if word == "mod" && ident(i + 1).is_some() && punct(i + 2, '{') {
                        inline.push(depth);
                    }
                    let starts_path =
                        sep(i + 1) && !(i > 0 && sep(i - 1)) && !(i > 0 && punct(i - 1, '$'));
                    if starts_path {
                        let line = tokens[i].line;
                        let mut segments = vec![word.clone()];
                        let mut j = i + 1;
                        while sep(j) {
                            match ident(j + 1) {
                                Some(next) => segments.push(next.to_string()),
                                None => break,
                            }
                            j += 2;
                        }
                        if inline.is_empty() {
                            self.paths.push(PathRef {
                                segments,
                                line,
                                glob: false,
                            });
                        }
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// Skip a `#[cfg(test)]` item starting at `i` (its attributes, then up
    /// to its `;` or the end of its block); remember `mod name;` children.
    fn skip_test_item(&mut self, tokens: &[Token], mut i: usize) -> usize {
        while tokens.get(i).is_some_and(|t| t.tok == Tok::Punct('#')) {
            i = skip_attribute(tokens, i);
        }
        if let (Some(Tok::Ident(m)), Some(Tok::Ident(name)), Some(Tok::Punct(';'))) = (
            tokens.get(i).map(|t| &t.tok),
            tokens.get(i + 1).map(|t| &t.tok),
            tokens.get(i + 2).map(|t| &t.tok),
        ) {
            if m == "mod" {
                self.test_children.push(name.clone());
                return i + 3;
            }
        }
        skip_item(tokens, i)
    }
}

/// `#[cfg(test)]` at `i`.
fn is_cfg_test(tokens: &[Token], i: usize) -> bool {
    let want = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    tokens.len() >= i + want.len()
        && tokens[i..i + want.len()]
            .iter()
            .zip(&want)
            .all(|(t, w)| &t.tok == w)
}

/// Past the attribute `#[...]` (or `#![...]`) at `i`.
fn skip_attribute(tokens: &[Token], mut i: usize) -> usize {
    i += 1;
    if tokens.get(i).is_some_and(|t| t.tok == Tok::Punct('!')) {
        i += 1;
    }
    let mut depth = 0usize;
    while let Some(token) = tokens.get(i) {
        i += 1;
        match token.tok {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    i
}

/// Parse a use tree at `i` under `prefix`; push each leaf (with its `as`
/// alias). Returns the index after the tree (after `;` at the top).
fn parse_use_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: &mut Vec<String>,
    leaves: &mut Vec<(PathRef, Option<String>)>,
) -> usize {
    let depth = prefix.len();
    let mut line = tokens.get(i).map_or(0, |t| t.line);
    if tokens.get(i).is_some_and(|t| t.tok == Tok::PathSep) {
        i += 1;
    }
    while let Some(Tok::Ident(segment)) = tokens.get(i).map(|t| &t.tok) {
        if segment == "as" {
            break;
        }
        line = tokens[i].line;
        prefix.push(segment.clone());
        i += 1;
        if tokens.get(i).is_some_and(|t| t.tok == Tok::PathSep) {
            i += 1;
        } else {
            break;
        }
    }
    match tokens.get(i).map(|t| &t.tok) {
        Some(Tok::Punct('{')) => {
            i += 1;
            while let Some(token) = tokens.get(i) {
                match token.tok {
                    Tok::Punct('}') => {
                        i += 1;
                        break;
                    }
                    Tok::Punct(',') => i += 1,
                    _ => i = parse_use_tree(tokens, i, prefix, leaves),
                }
            }
        }
        Some(Tok::Punct('*')) => {
            i += 1;
            leaves.push((
                PathRef {
                    segments: prefix.clone(),
                    line,
                    glob: true,
                },
                None,
            ));
        }
        _ => {
            let mut alias = None;
            if let (Some(Tok::Ident(a)), Some(Tok::Ident(name))) = (
                tokens.get(i).map(|t| &t.tok),
                tokens.get(i + 1).map(|t| &t.tok),
            ) {
                if a == "as" {
                    alias = Some(name.clone());
                    i += 2;
                }
            }
            let mut segments = prefix.clone();
            if segments.last().is_some_and(|s| s == "self") {
                segments.pop();
            }
            if !segments.is_empty() && alias.as_deref() != Some("_") {
                leaves.push((
                    PathRef {
                        segments,
                        line,
                        glob: false,
                    },
                    alias,
                ));
            }
        }
    }
    prefix.truncate(depth);
    if depth == 0 {
        // The end of the whole `use` item.
        while let Some(token) = tokens.get(i) {
            i += 1;
            if token.tok == Tok::Punct(';') {
                break;
            }
        }
    }
    i
}

/// `src/a/b.rs` -> `["a", "b"]`; `mod.rs` names its directory; `lib.rs` is
/// the root; `main.rs` (the binary) is `["main"]`.
fn module_of(path: &str) -> Vec<String> {
    let rel = path
        .strip_prefix("src/")
        .unwrap_or(path)
        .trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    match parts.last().map(String::as_str) {
        Some("lib") if parts.len() == 1 => Vec::new(),
        Some("main") if parts.len() == 1 => parts,
        Some("mod") => {
            parts.pop();
            parts
        }
        _ => parts,
    }
}

/// Identifiers, `::` and single punctuation; comments, strings and char
/// literals dropped.
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if at(i + 1) == '/' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if chars[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => i = skip_string(&chars, i + 1, 0, false, &mut line),
            'r' | 'b' if string_start(&chars, i).is_some() => {
                let (start, hashes, raw) = string_start(&chars, i).unwrap_or((i + 1, 0, false));
                i = skip_string(&chars, start, hashes, raw, &mut line);
            }
            '\'' => {
                if at(i + 1) == '\\' {
                    i += 2;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    // A lifetime or a label.
                    i += 1;
                }
            }
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                tokens.push(Token {
                    tok: Tok::Ident(word),
                    line,
                });
            }
            ':' if at(i + 1) == ':' => {
                tokens.push(Token {
                    tok: Tok::PathSep,
                    line,
                });
                i += 2;
            }
            c => {
                tokens.push(Token {
                    tok: Tok::Punct(c),
                    line,
                });
                i += 1;
            }
        }
    }
    tokens
}

/// `r"`, `r#"`, `br"`, `b"` at `i`: where the contents start, how many
/// `#` close them, and whether they are raw (no escapes).
fn string_start(chars: &[char], i: usize) -> Option<(usize, usize, bool)> {
    // Only at the start of a word.
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
        if chars.get(j) == Some(&'"') {
            return Some((j + 1, 0, false));
        }
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((j + 1, hashes, true))
}

/// Past the string whose contents start at `i`.
fn skip_string(chars: &[char], mut i: usize, hashes: usize, raw: bool, line: &mut usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' if !raw => i += 2,
            '"' if chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes =>
            {
                return i + 1 + hashes;
            }
            '\n' => {
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}
