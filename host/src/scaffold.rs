//! `groupstate new`: writes a plugin project (source with a small working example, a
//! `build.sh`, a README and example scenarios in `tests/`) for one of the languages with
//! an SDK under `guest-sdk/`. The templates are embedded in the binary
//! (`host/templates/`); the project refers to the SDK in a groupstate checkout by its
//! absolute path, so it builds wherever it is written.
//!
//! The example is the same in every language (count events per key, emit every `every`th,
//! forget a key after `idle_ms` of event time without events), so one set of scenarios
//! (`host/templates/tests/`) applies to all of them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A language `groupstate new` writes projects in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// Rust, with the `groupstate-sdk` crate (`guest-sdk/`).
    Rust,
    /// Python, with componentize-py and the `groupstate-sdk` pip package (`guest-sdk/python/`).
    Python,
    /// JavaScript, with componentize-js and the `groupstate-sdk` npm package (`guest-sdk/js/`).
    Js,
    /// C, with wit-bindgen, clang and the C helpers (`guest-sdk/c/`).
    C,
}

impl Language {
    /// Every language, in the order `--help` lists them.
    pub const ALL: [Language; 4] = [Language::Rust, Language::Python, Language::Js, Language::C];

    /// The name `--lang` takes.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Js => "js",
            Language::C => "c",
        }
    }

    /// The SDK's folder inside a checkout, which must exist for a project to build.
    fn sdk_dir(self) -> &'static str {
        match self {
            Language::Rust => "guest-sdk",
            Language::Python => "guest-sdk/python",
            Language::Js => "guest-sdk/js",
            Language::C => "guest-sdk/c",
        }
    }

    /// The files of a project in this language, the shared ones included.
    fn templates(self) -> Vec<Template> {
        let mut files = match self {
            Language::Rust => vec![
                Template::new("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
                Template::script("build.sh", include_str!("../templates/rust/build.sh")),
                Template::new("src/lib.rs", include_str!("../templates/rust/src/lib.rs")),
                Template::new(".gitignore", include_str!("../templates/rust/.gitignore")),
                Template::new(".cargo/config.toml", include_str!("../templates/rust/.cargo/config.toml")),
            ],
            Language::Python => vec![
                Template::new("plugin.py", include_str!("../templates/python/plugin.py")),
                Template::script("build.sh", include_str!("../templates/python/build.sh")),
                Template::new(".gitignore", include_str!("../templates/python/.gitignore")),
            ],
            Language::Js => vec![
                Template::new("package.json", include_str!("../templates/js/package.json")),
                Template::new(".npmrc", include_str!("../templates/js/.npmrc")),
                Template::new("plugin.js", include_str!("../templates/js/plugin.js")),
                Template::script("build.sh", include_str!("../templates/js/build.sh")),
                Template::new(".gitignore", include_str!("../templates/js/.gitignore")),
            ],
            Language::C => vec![
                Template::new("plugin.c", include_str!("../templates/c/plugin.c")),
                Template::script("build.sh", include_str!("../templates/c/build.sh")),
                Template::new(".gitignore", include_str!("../templates/c/.gitignore")),
            ],
        };
        files.extend([
            Template::new("README.md", include_str!("../templates/README.md")),
            Template::new("tests/counts.toml", include_str!("../templates/tests/counts.toml")),
            Template::new("tests/idle-keys-expire.toml", include_str!("../templates/tests/idle-keys-expire.toml")),
            Template::new("tests/without-timeouts.toml", include_str!("../templates/tests/without-timeouts.toml")),
        ]);
        files
    }

    /// The README's language-specific parts: (language, source file, what the build needs).
    fn readme_parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Language::Rust => (
                "Rust",
                "src/lib.rs",
                "Needs Rust (rustup) with the `wasm32-wasip2` target: `rustup target add wasm32-wasip2`. \
                 The build uses its own `target/`.",
            ),
            Language::Python => (
                "Python",
                "plugin.py",
                "Needs Python 3.10+ and componentize-py 0.25.1: `pip install componentize-py==0.25.1`. \
                 The build installs the SDK with pip into `.build/sdk`.",
            ),
            Language::Js => (
                "JavaScript",
                "plugin.js",
                "Needs Node.js 20+ and npm. The first build runs `npm install` (componentize-js and \
                 the SDK, a `file:` dependency on the groupstate checkout).",
            ),
            Language::C => (
                "C",
                "plugin.c",
                "Needs clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32 (`apt-get install -y \
                 clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32`), wit-bindgen 0.61.1 (`cargo install \
                 wit-bindgen-cli@0.61.1 --locked --no-default-features --features c`) and rustup's Rust \
                 (for `wasm-component-ld`).",
            ),
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Language {
    type Err = ScaffoldError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Language::ALL
            .into_iter()
            .find(|language| language.name() == text)
            .ok_or_else(|| ScaffoldError::UnknownLanguage(text.to_owned()))
    }
}

/// One file of a project template.
struct Template {
    /// Its path in the project.
    path: &'static str,
    /// Its text, with `{{name}}`, `{{sdk}}` and the README's placeholders.
    text: &'static str,
    /// Whether it is a script to make executable.
    executable: bool,
}

impl Template {
    fn new(path: &'static str, text: &'static str) -> Self {
        Template { path, text, executable: false }
    }

    fn script(path: &'static str, text: &'static str) -> Self {
        Template { path, text, executable: true }
    }
}

/// What `groupstate new` was asked for.
#[derive(Debug, Clone)]
pub struct NewProject {
    /// The plugin's name: its `info().name` and the component's file name.
    pub name: String,
    /// The language.
    pub language: Language,
    /// The project folder to write (missing or empty).
    pub dir: PathBuf,
    /// The groupstate checkout whose `guest-sdk/` the project uses.
    pub sdk: PathBuf,
}

/// Why `groupstate new` wrote nothing (or, for `Write`, stopped part way).
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    /// `--lang` named no language with a template.
    #[error("unknown language `{0}`: pass --lang rust, python, js or c")]
    UnknownLanguage(String),
    /// The name cannot be used in every language.
    #[error("plugin name `{name}` {problem}: use lowercase letters, digits and `_`, starting with a letter")]
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The target folder already holds files.
    #[error("{0} already exists and is not empty: pick another --dir or remove it")]
    NotEmpty(PathBuf),
    /// The SDK folder is missing from the checkout given.
    #[error(
        "no {language} SDK at {path}: pass --sdk (or set GROUPSTATE_SDK to) the groupstate checkout that holds guest-sdk/"
    )]
    NoSdk {
        /// The language.
        language: Language,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The SDK's path cannot be written into the project's files as it is.
    #[error(
        "the SDK path {0} holds a character that cannot go into Cargo.toml, package.json or a shell script (a quote, \
         backslash, `$`, backquote or newline), or is not UTF-8: use a checkout at a plainer path"
    )]
    SdkPath(PathBuf),
    /// A file could not be written.
    #[error("cannot write {path}: {cause}")]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
}

/// Names no project may have: keywords of the four languages (the name appears in Rust,
/// C, Python and JavaScript code) and crate names cargo refuses or the SDK takes.
const RESERVED: &[&str] = &[
    // Rust (strict, reserved and the crates cargo refuses as package names).
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "gen",
    "macro",
    "override",
    "priv",
    "try",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "std",
    "core",
    "alloc",
    "test",
    "proc_macro",
    "groupstate_sdk",
    // Python.
    "and",
    "assert",
    "class",
    "def",
    "del",
    "elif",
    "except",
    "finally",
    "from",
    "global",
    "import",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "with",
    // JavaScript.
    "case",
    "catch",
    "debugger",
    "default",
    "delete",
    "export",
    "extends",
    "function",
    "instanceof",
    "new",
    "null",
    "switch",
    "this",
    "throw",
    "var",
    "void",
    "implements",
    "interface",
    "package",
    "private",
    "protected",
    "public",
    // C.
    "auto",
    "bool",
    "char",
    "double",
    "float",
    "goto",
    "inline",
    "int",
    "long",
    "register",
    "restrict",
    "short",
    "signed",
    "sizeof",
    "union",
    "unsigned",
    "volatile",
];

/// The longest name accepted.
const NAME_CHARS_MAX: usize = 64;

/// Checks that `name` is an identifier in Rust, Python, JavaScript and C, and a valid
/// crate, npm package and file name: `[a-z][a-z0-9_]*`, at most 64 characters, no keyword.
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let bad = |problem: &str| Err(ScaffoldError::BadName { name: name.to_owned(), problem: problem.to_owned() });
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > NAME_CHARS_MAX {
        return bad(&format!("is longer than {NAME_CHARS_MAX} characters"));
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return bad("does not start with a lowercase letter");
    }
    if let Some(c) = name.chars().find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')) {
        return bad(&format!("holds `{c}`"));
    }
    if RESERVED.contains(&name) {
        return bad("is a keyword or reserved name in Rust, Python, JavaScript or C");
    }
    Ok(())
}

/// Writes the project; returns the files written, relative to the project folder.
///
/// Checks everything first (name, SDK, target folder), so a refusal writes nothing.
pub fn create(project: &NewProject) -> Result<Vec<String>, ScaffoldError> {
    check_name(&project.name)?;
    let sdk_dir = project.sdk.join(project.language.sdk_dir());
    if !sdk_dir.is_dir() {
        return Err(ScaffoldError::NoSdk { language: project.language, path: sdk_dir });
    }
    let sdk = sdk_path_text(&project.sdk)?;
    check_empty(&project.dir)?;
    let (language, source, needs) = project.language.readme_parts();
    let guide = format!("{sdk}/docs/write-a-plugin-{}.md", project.language.name());
    let mut written = Vec::new();
    for template in project.language.templates() {
        let text = template
            .text
            .replace("{{name}}", &project.name)
            .replace("{{sdk}}", &sdk)
            .replace("{{language}}", language)
            .replace("{{source}}", source)
            .replace("{{needs}}", needs)
            .replace("{{guide}}", &guide);
        let path = project.dir.join(template.path);
        write_file(&path, &text, template.executable)?;
        written.push(template.path.to_owned());
    }
    Ok(written)
}

/// The SDK checkout's absolute path as text that Cargo.toml, package.json and bash all
/// take inside double quotes without escaping.
fn sdk_path_text(sdk: &Path) -> Result<String, ScaffoldError> {
    let absolute = std::path::absolute(sdk).map_err(|cause| ScaffoldError::Write { path: sdk.to_owned(), cause })?;
    let absolute = absolute.canonicalize().unwrap_or(absolute);
    let text = absolute.to_str().ok_or_else(|| ScaffoldError::SdkPath(absolute.clone()))?;
    if text.chars().any(|c| matches!(c, '"' | '\'' | '\\' | '$' | '`' | '\n' | '\r')) {
        return Err(ScaffoldError::SdkPath(absolute.clone()));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// Refuses a folder that exists and holds anything.
fn check_empty(dir: &Path) -> Result<(), ScaffoldError> {
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_some()) {
        Ok(true) => Err(ScaffoldError::NotEmpty(dir.to_owned())),
        Ok(false) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(ScaffoldError::Write { path: dir.to_owned(), cause }),
    }
}

fn write_file(path: &Path, text: &str, executable: bool) -> Result<(), ScaffoldError> {
    let failed = |cause| ScaffoldError::Write { path: path.to_owned(), cause };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    std::fs::write(path, text).map_err(failed)?;
    if executable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_work_in_every_language() {
        for name in ["demo", "sensor_alerts", "a1", "x"] {
            check_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, problem) in [
            ("", "is empty"),
            ("Demo", "does not start with a lowercase letter"),
            ("1demo", "does not start with a lowercase letter"),
            ("_demo", "does not start with a lowercase letter"),
            ("my-plugin", "holds `-`"),
            ("dé", "holds `é`"),
            ("class", "is a keyword"),
            ("int", "is a keyword"),
            ("fn", "is a keyword"),
            ("function", "is a keyword"),
            ("test", "is a keyword"),
        ] {
            let error = check_name(name).expect_err(name).to_string();
            assert!(error.contains(problem), "{name}: {error}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn every_template_placeholder_is_filled() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("checkout").to_owned();
        for language in Language::ALL {
            let project =
                NewProject { name: "demo".into(), language, dir: dir.path().join(language.name()), sdk: sdk.clone() };
            let files = create(&project).unwrap_or_else(|e| panic!("{language}: {e}"));
            assert!(files.contains(&"build.sh".to_owned()) && files.contains(&"README.md".to_owned()));
            for file in files {
                let text = std::fs::read_to_string(project.dir.join(&file)).expect("written file");
                assert!(!text.contains("{{"), "{language} {file} keeps a placeholder");
            }
            let again = create(&project).expect_err("the folder is no longer empty");
            assert!(matches!(again, ScaffoldError::NotEmpty(_)), "{again}");
        }
    }

    #[test]
    fn a_rust_project_builds_its_plugin_with_the_repositorys_guest_flags() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("checkout").to_owned();
        let project = NewProject {
            name: "demo".into(),
            language: Language::Rust,
            dir: dir.path().join("demo"),
            sdk: sdk.clone(),
        };
        let files = create(&project).expect("created");
        assert!(files.contains(&".cargo/config.toml".to_owned()), "{files:?}");
        let rustflags = |path: &Path| -> toml::Value {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let config: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            config["target"]["wasm32-wasip2"]["rustflags"].clone()
        };
        let ours = rustflags(&sdk.join(".cargo/config.toml"));
        assert_eq!(rustflags(&project.dir.join(".cargo/config.toml")), ours);
        assert!(ours.to_string().contains("inline-threshold"), "{ours}");
    }

    #[test]
    fn refuses_a_checkout_without_the_sdk() {
        let dir = tempfile::tempdir().expect("temp dir");
        let project = NewProject {
            name: "demo".into(),
            language: Language::Python,
            dir: dir.path().join("demo"),
            sdk: dir.path().to_owned(),
        };
        let error = create(&project).expect_err("no SDK there").to_string();
        assert!(error.starts_with("no python SDK at "), "{error}");
        assert!(!project.dir.exists(), "a refusal writes nothing");
    }
}
