//! Writing a plugin, as a user does it: for each language, `groupstate new` in a
//! temporary folder outside the repository, its `build.sh`, then `groupstate test` on
//! its scenarios (which must pass, and fail with a diff on a wrong expectation); the
//! commands of each "Write a plugin" guide (`docs/write-a-plugin-*.md`), run as written;
//! the Rust guide's 0.2 example with its test; and the SDKs' copies of the WIT, which
//! must be the contract itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use groupstate::{Clock, SystemClock};

use crate::cli::groupstate_bin;

/// The languages `groupstate new` knows.
const LANGUAGES: [&str; 4] = ["rust", "python", "js", "c"];

/// How long one language's commands may take before the test gives up. Generous: a
/// first build on a loaded 2-core machine, and the host's first compile of a Python
/// component, each take up to a few minutes there.
const COMMANDS_SECONDS_MAX: u64 = 20 * 60;

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the checkout").to_owned()
}

/// A `bash -c script` in `dir` with the built `groupstate` first on `PATH`, in a
/// process group of its own that is killed after [`COMMANDS_SECONDS_MAX`].
fn bash(dir: &Path, script: &str) -> Output {
    use std::os::unix::process::CommandExt;
    let bin_dir = groupstate_bin().parent().expect("bin dir").to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // As a user's shell: the test's cargo environment is not the project's.
    for var in ["GROUPSTATE_SDK", "CARGO_TARGET_DIR", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_TARGET"] {
        command.env_remove(var);
    }
    let child = command.spawn().expect("run bash");
    let pid = child.id();
    let (done, timed_out) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        // Disconnected means bash is done: only a timeout kills.
        if let Err(RecvTimeoutError::Timeout) = timed_out.recv_timeout(Duration::from_secs(COMMANDS_SECONDS_MAX)) {
            // The whole group: the script and anything it left in the background.
            let _ = Command::new("kill").arg("-9").arg(format!("-{pid}")).status();
        }
    });
    let output = child.wait_with_output().expect("wait for bash");
    drop(done);
    watchdog.join().expect("watchdog");
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// `groupstate new demo --lang L`, `./build.sh`, `groupstate test demo.wasm tests/`
/// in a fresh temporary folder; then a scenario with a wrong expectation must fail with
/// a diff, and the commands of the project's README must work. Prints how long the
/// first three took (`--nocapture` shows it).
fn new_build_test(language: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(!dir.path().starts_with(checkout()), "the project must be outside the repository");
    let started = SystemClock.monotonic_ns();
    // A compile cache of its own, so that the time includes the host's first compile
    // of the component, as a user's first `groupstate test` does.
    let output = bash(
        dir.path(),
        &format!(
            "set -euo pipefail\nexport XDG_CACHE_HOME=\"$PWD/cache\"\ngroupstate new demo --lang {language}\ncd demo\n./build.sh\ngroupstate test demo.wasm tests/"
        ),
    );
    let took_s = (SystemClock.monotonic_ns() - started) as f64 / 1e9;
    assert_success(&output, &format!("{language}: new, build, test"));
    let stdout = text(&output.stdout);
    assert!(stdout.contains("scenarios: 3 passed, 0 failed"), "{language}: {stdout}");
    eprintln!("authoring: {language}: groupstate new + ./build.sh + groupstate test took {took_s:.1} s");

    // The first scenario with the first expected count off by one.
    let project = dir.path().join("demo");
    let counts = std::fs::read_to_string(project.join("tests/counts.toml")).expect("counts.toml");
    let wrong = counts.replacen(r#"'{"key":"a","count":3}'"#, r#"'{"key":"a","count":4}'"#, 1);
    assert_ne!(wrong, counts, "the scenario changed");
    std::fs::create_dir_all(project.join("wrong")).expect("mkdir");
    std::fs::write(project.join("wrong/counts.toml"), wrong).expect("write");
    let output = bash(&project, "XDG_CACHE_HOME=\"$PWD/../cache\" groupstate test demo.wasm wrong/");
    let stdout = text(&output.stdout);
    assert!(!output.status.success(), "{language}: a wrong expectation passed:\n{stdout}");
    assert_eq!(output.status.code(), Some(1), "{language}: {}", text(&output.stderr));
    assert!(stdout.contains("FAIL wrong/counts.toml"), "{language}: {stdout}");
    assert!(stdout.contains("outputs differ (- expected, + produced)"), "{language}: {stdout}");
    assert!(stdout.contains(r#"- {"count":4,"key":"a"}"#), "{language}: {stdout}");
    assert!(stdout.contains(r#"+ {"count":3,"key":"a"}"#), "{language}: {stdout}");
    assert!(stdout.contains("scenarios: 0 passed, 1 failed"), "{language}: {stdout}");

    // The commands in the project's README work as written.
    let readme = std::fs::read_to_string(project.join("README.md")).expect("README.md");
    let blocks = fenced_blocks(&readme, "sh");
    assert!(!blocks.is_empty(), "{language}: the project README has no sh block");
    let script = format!("set -euo pipefail\nexport XDG_CACHE_HOME=\"$PWD/../cache\"\n{}", blocks.concat());
    assert_success(&bash(&project, &script), &format!("{language}: the project README's commands"));
    let out = std::fs::read_to_string(project.join("out.jsonl")).expect("out.jsonl");
    assert_eq!(out, "{\"key\":\"a\",\"count\":3}\n", "{language}: the README's run");
}

#[test]
fn authoring_rust_new_build_test() {
    new_build_test("rust");
}

#[test]
fn authoring_python_new_build_test() {
    new_build_test("python");
}

#[test]
fn authoring_js_new_build_test() {
    new_build_test("js");
}

#[test]
fn authoring_c_new_build_test() {
    new_build_test("c");
}

/// The code blocks of a Markdown file fenced as ```language, in order.
fn fenced_blocks(markdown: &str, language: &str) -> Vec<String> {
    let opening = format!("```{language}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == opening => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed {opening} block");
    blocks
}

/// Runs a guide's ```sh blocks, in order, as one bash script in a fresh temporary
/// folder; a failing command fails the test. Background jobs are killed at the end.
fn run_guide(language: &str) {
    let guide = checkout().join(format!("docs/write-a-plugin-{language}.md"));
    let markdown = std::fs::read_to_string(&guide).unwrap_or_else(|e| panic!("{}: {e}", guide.display()));
    let blocks = fenced_blocks(&markdown, "sh");
    assert!(blocks.len() >= 5, "{}: expected the create, build, test, run and hot-load steps", guide.display());
    let script =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\nset -x\n{}", blocks.concat());
    let dir = tempfile::tempdir().expect("temp dir");
    let started = SystemClock.monotonic_ns();
    let output = bash(dir.path(), &script);
    assert_success(&output, &format!("the commands of {}", guide.display()));
    let took_s = (SystemClock.monotonic_ns() - started) as f64 / 1e9;
    eprintln!("authoring: the {language} guide's commands took {took_s:.1} s");
}

#[test]
fn authoring_rust_guide() {
    run_guide("rust");
}

#[test]
fn authoring_python_guide() {
    run_guide("python");
}

#[test]
fn authoring_js_guide() {
    run_guide("js");
}

#[test]
fn authoring_c_guide() {
    run_guide("c");
}

/// The first ```rust block of a Markdown file after the line `heading`.
fn rust_block_after(markdown: &str, heading: &str) -> String {
    let after: Vec<&str> = markdown.lines().skip_while(|line| line.trim_end() != heading).skip(1).collect();
    let block = fenced_blocks(&after.join("\n"), "rust").into_iter().next();
    block.filter(|b| !b.is_empty()).unwrap_or_else(|| panic!("no ```rust block after {heading:?}"))
}

/// The Rust guide's 0.2 example, as a reader would use it: its plugin and its native
/// test in a project of `groupstate new`, with the `serde_json` the guide says to add;
/// the test must pass, the plugin build as a component and run over a few events.
#[test]
fn authoring_rust_guide_0_2_example_builds_and_its_test_passes() {
    let guide = checkout().join("docs/write-a-plugin-rust.md");
    let markdown = std::fs::read_to_string(&guide).unwrap_or_else(|e| panic!("{}: {e}", guide.display()));
    let plugin = rust_block_after(&markdown, "## The 0.2 state API");
    let test = rust_block_after(&markdown, "### Testing a 0.2 plugin natively");
    assert!(plugin.contains("export_keyed_plugin!(Visits)"), "the guide's 0.2 plugin moved:\n{plugin}");
    assert!(test.contains("KeyedDriver::<Visits>"), "the guide's 0.2 test moved:\n{test}");
    let dir = tempfile::tempdir().expect("temp dir");
    assert_success(&bash(dir.path(), "groupstate new visits --lang rust"), "groupstate new visits");
    let project = dir.path().join("visits");
    let lib = format!("{plugin}\n#[cfg(test)]\nmod guide {{\nuse super::*;\n{test}}}\n");
    std::fs::write(project.join("src/lib.rs"), lib).expect("write src/lib.rs");
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).expect("Cargo.toml");
    let with_json = manifest.replacen("[dependencies]\n", "[dependencies]\nserde_json = \"1\"\n", 1);
    assert_ne!(with_json, manifest, "the project's Cargo.toml has no [dependencies]");
    std::fs::write(project.join("Cargo.toml"), with_json).expect("write Cargo.toml");
    let script = r#"set -euo pipefail
export XDG_CACHE_HOME="$PWD/../cache"
cargo test --quiet 2>&1
./build.sh
printf '%s\n' '{"user":"u1","ts":1000,"page":"/a"}' '{"user":"u1","ts":2000,"page":"/b"}' > views.jsonl
groupstate run --plugin visits.wasm --input views.jsonl --output out.jsonl --state-dir state \
  --key-field user --time-field ts --timeout event-time
cat out.jsonl"#;
    let output = bash(&project, script);
    assert_success(&output, "the Rust guide's 0.2 example");
    let stdout = text(&output.stdout);
    assert!(stdout.contains("test result: ok. 1 passed"), "the guide's test did not run and pass:\n{stdout}");
    let out = std::fs::read_to_string(project.join("out.jsonl")).expect("out.jsonl");
    let totals: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    // One batch, one call for u1 with both views: its total after them.
    assert_eq!(totals, [serde_json::json!({"user": "u1", "total": 2})], "{out}");
}

/// The README links every guide.
#[test]
fn authoring_guides_are_linked_from_the_readme() {
    let readme = std::fs::read_to_string(checkout().join("README.md")).expect("README.md");
    for language in LANGUAGES {
        let link = format!("docs/write-a-plugin-{language}.md");
        assert!(readme.contains(&link), "README.md does not link {link}");
    }
}

/// Every SDK carries its own copy of the WIT (so that it builds, or installs, from
/// anywhere); each must be the contract in `wit/`, byte for byte.
#[test]
fn authoring_sdk_wit_copies_are_the_contract() {
    let root = checkout();
    let contract = std::fs::read(root.join("wit/groupstate.wit")).expect("wit/groupstate.wit");
    for copy in [
        "guest-sdk/wit/groupstate.wit",
        "guest-sdk/python/groupstate_sdk/wit/groupstate.wit",
        "guest-sdk/js/wit/groupstate.wit",
        "guest-sdk/c/wit/groupstate.wit",
    ] {
        let bytes = std::fs::read(root.join(copy)).unwrap_or_else(|e| panic!("{copy}: {e}"));
        assert!(
            bytes == contract,
            "{copy} differs from wit/groupstate.wit: copy the contract there (cp wit/groupstate.wit {copy})"
        );
    }
    let contract = std::fs::read(root.join("wit/v0.2/groupstate.wit")).expect("wit/v0.2/groupstate.wit");
    for copy in [
        "guest-sdk/wit/v0.2/groupstate.wit",
        "guest-sdk/python/groupstate_sdk/wit/v0.2/groupstate.wit",
        "guest-sdk/js/wit/v0.2/groupstate.wit",
        "guest-sdk/c/wit/v0.2/groupstate.wit",
    ] {
        let bytes = std::fs::read(root.join(copy)).unwrap_or_else(|e| panic!("{copy}: {e}"));
        assert!(
            bytes == contract,
            "{copy} differs from wit/v0.2/groupstate.wit: copy the contract there (cp wit/v0.2/groupstate.wit {copy})"
        );
    }
}

/// `groupstate new` refuses what would not build or would overwrite something, and
/// says what to do; a refusal writes nothing.
#[test]
fn authoring_new_refuses_bad_requests() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("taken")).expect("mkdir");
    std::fs::write(dir.path().join("taken/file"), "x").expect("write");
    let cases: &[(&[&str], &str)] = &[
        (&["new", "My-Plugin", "--lang", "rust"], "plugin name `My-Plugin` does not start with a lowercase letter"),
        (&["new", "class", "--lang", "python"], "plugin name `class` is a keyword"),
        (&["new", "demo", "--lang", "c", "--dir", "taken"], "already exists and is not empty"),
        (&["new", "demo", "--lang", "js", "--sdk", "/nonexistent"], "no js SDK at /nonexistent/guest-sdk/js"),
        (&["new", "demo", "--lang", "go"], "invalid value 'go'"),
    ];
    for (args, message) in cases {
        let output = Command::new(groupstate_bin()).args(*args).current_dir(dir.path()).output().expect("run");
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(left, ["taken"], "a refusal writes nothing");
}

/// The Python SDK's `JsonCodec` gives back the state it stored, nested dataclasses
/// included (alone, in lists, tuples, dicts and optionals). Runs the SDK natively.
#[test]
fn authoring_python_codec_keeps_nested_dataclasses() {
    let script = r#"
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple
from groupstate_sdk import JsonCodec

@dataclass
class Point:
    x: int
    y: int

@dataclass
class Track:
    name: str
    last: Optional[Point] = None
    points: List[Point] = field(default_factory=list)
    by_name: Dict[str, Point] = field(default_factory=dict)
    pair: Tuple[Point, int] = (Point(0, 0), 0)
    tags: List[str] = field(default_factory=list)

codec = JsonCodec(Track)
for value in [Track("a", Point(1, 2), [Point(3, 4)], {"p": Point(5, 6)}, (Point(7, 8), 9), ["t"]), Track("b")]:
    back = codec.decode(codec.encode(value))
    assert back == value, (back, value)
    assert type(back.pair[0]) is Point
print("ok")
"#;
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", checkout().join("guest-sdk/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    assert_success(&output, "the Python codec round trip");
    assert_eq!(text(&output.stdout).trim(), "ok");
}

/// Each project's `build.sh`, on a machine without the language's toolchain (`PATH`
/// holds only bash and a few core utilities), fails at once and says what to install.
#[test]
fn authoring_build_says_what_is_missing() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    for tool in ["bash", "dirname", "basename", "cat", "mkdir", "rm", "cp", "mv", "awk", "grep", "diff"] {
        let found = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.exists());
        let found = found.unwrap_or_else(|| panic!("{tool} is not in /usr/bin or /bin"));
        symlink(found, bin.join(tool)).expect("symlink");
    }
    let cases = [
        ("rust", "cargo not found; install Rust with rustup"),
        ("python", "python3 not found; install Python 3.10 or later"),
        ("js", "node or npm not found; install Node.js 20 or later"),
        ("c", "wit-bindgen not found; install it with: cargo install wit-bindgen-cli@0.61.1"),
    ];
    for (language, message) in cases {
        let project = dir.path().join(language);
        let output = Command::new(groupstate_bin())
            .args(["new", "demo", "--lang", language, "--dir"])
            .arg(&project)
            .env_remove("GROUPSTATE_SDK")
            .output()
            .expect("groupstate new");
        assert_success(&output, &format!("groupstate new --lang {language}"));
        let output = Command::new(bin.join("bash"))
            .arg("build.sh")
            .current_dir(&project)
            .env_clear()
            .env("PATH", &bin)
            .env("HOME", dir.path())
            .output()
            .expect("run build.sh");
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{language}: build.sh succeeded without its toolchain");
        assert!(stderr.contains(&format!("error: {message}")), "{language}: {stderr}");
        assert!(!project.join("demo.wasm").exists(), "{language}: a component appeared");
    }
}
