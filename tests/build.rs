//! Builds every plugin under `plugins/` (and the test plugins under `tests/plugins/`)
//! to components, and exposes their paths as constants in `$OUT_DIR/plugins.rs`, so
//! `cargo test` always exercises freshly built plugins:
//!
//! - the Rust plugins (cargo workspaces `plugins/` and `tests/plugins/`, target
//!   wasm32-wasip2), as `plugins::SENSOR_ALERTS` and so on;
//! - the plugins in other languages (`plugins/*/build.sh`, see [`OTHER_LANGUAGES`]),
//!   into `target/guest/other/`, as `plugins::SENSOR_ALERTS_PY` and so on. Each is
//!   rebuilt only when its folder or its SDK (`guest-sdk/<language>/`, which carries
//!   its own copy of the WIT) changed (a fingerprint of their files is
//!   kept beside the component), as they take 10–30 s each.

use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Plugins in other languages: (folder under `plugins/`, the SDK it uses under
/// `guest-sdk/`, component file name, what to install when the toolchain is missing).
/// Each folder has a `build.sh OUT.wasm`, which installs the SDK as a user's plugin does.
const OTHER_LANGUAGES: &[(&str, &str, &str, &str)] = &[
    ("sensor-alerts-py", "python", "sensor_alerts_py", "pip install componentize-py==0.25.1"),
    ("sessions-py", "python", "sessions_py", "pip install componentize-py==0.25.1"),
    ("sensor-alerts-js", "js", "sensor_alerts_js", "Node.js 20+ and npm (build.sh runs npm ci)"),
    ("sessions-js", "js", "sessions_js", "Node.js 20+ and npm (build.sh runs npm ci)"),
    (
        "inactivity-alert-v2-c",
        "c",
        "inactivity_alert_v2_c",
        "apt-get install -y clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32 and \
         cargo install wit-bindgen-cli@0.61.1 --locked --no-default-features --features c",
    ),
    (
        "sensor-alerts-c",
        "c",
        "sensor_alerts_c",
        "apt-get install -y clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32 and \
         cargo install wit-bindgen-cli@0.61.1 --locked --no-default-features --features c",
    ),
];

/// Folders that hold no plugin sources: installed packages, build outputs, caches.
const SKIPPED_DIRS: &[&str] = &["node_modules", "target", "__pycache__"];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("tests/ has a parent").to_owned();
    let target_dir = root.join("target").join("guest");
    // Every source file (not `plugins/` as a whole: cargo would then also scan
    // node_modules and see every npm install as a change).
    for dir in ["plugins", "guest-sdk", "wit", "tests/plugins"] {
        for file in source_files(&root.join(dir)) {
            println!("cargo:rerun-if-changed={}", file.display());
        }
    }
    // The guests' rustflags (found by the inner cargo from its working directory).
    println!("cargo:rerun-if-changed={}", root.join(".cargo").join("config.toml").display());
    let mut consts = String::new();
    // The other languages build in the background while cargo builds the Rust ones.
    let other = build_other_languages(&root, &target_dir.join("other"));
    for workspace in ["plugins", "tests/plugins"] {
        let manifest = root.join(workspace).join("Cargo.toml");
        if manifest.exists() {
            build(&manifest, &target_dir);
        }
    }
    let out = target_dir.join("wasm32-wasip2").join("release");
    let mut wasm: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap_or_else(|e| panic!("no plugin outputs in {}: {e}", out.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .collect();
    wasm.sort();
    wasm.extend(other.finish());
    for path in wasm {
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("utf-8 plugin name");
        consts.push_str(&format!(
            "/// The built `{stem}` component.\npub const {}: &str = {:?};\n",
            stem.to_uppercase().replace('-', "_"),
            path.display().to_string()
        ));
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("plugins.rs"), consts).expect("write plugins.rs");
}

fn build(manifest: &Path, target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target_dir);
    // The outer build's flags are for the host target, not for wasm.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run cargo for {}: {e}", manifest.display()));
    assert!(
        status.success(),
        "building the plugins in {} failed; is the wasm32-wasip2 target installed? (rustup target add wasm32-wasip2)",
        manifest.display()
    );
}

/// The builds of the other-language plugins in flight.
struct OtherBuilds {
    running: Vec<OtherBuild>,
}

/// One other-language plugin: fresh, or being built.
struct OtherBuild {
    /// The component.
    wasm: PathBuf,
    /// Where the fingerprint of its sources is kept once it is built.
    stamp: PathBuf,
    /// The fingerprint of its sources now.
    fingerprint: String,
    /// The build's output.
    log: PathBuf,
    /// The build, `None` when the component is fresh.
    child: Option<Child>,
    /// What to install when the build fails.
    install: &'static str,
}

/// Starts `build.sh` for each other-language plugin whose fingerprint changed.
fn build_other_languages(root: &Path, out_dir: &Path) -> OtherBuilds {
    std::fs::create_dir_all(out_dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", out_dir.display()));
    let mut running = Vec::new();
    for &(folder, sdk, name, install) in OTHER_LANGUAGES {
        let dir = root.join("plugins").join(folder);
        let wasm = out_dir.join(format!("{name}.wasm"));
        let stamp = out_dir.join(format!("{name}.fingerprint"));
        let log = out_dir.join(format!("{name}.log"));
        let fingerprint = fingerprint(root, &[dir.clone(), root.join("guest-sdk").join(sdk)]);
        let fresh = wasm.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == fingerprint);
        let child = if fresh {
            None
        } else {
            // A half-done build must not look fresh next time.
            let _ = std::fs::remove_file(&stamp);
            let log_file =
                std::fs::File::create(&log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
            let stderr = log_file.try_clone().expect("clone the log file handle");
            let child = Command::new("bash")
                .arg(dir.join("build.sh"))
                .arg(&wasm)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log_file)
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run bash for {}: {e}", dir.join("build.sh").display()));
            Some(child)
        };
        running.push(OtherBuild { wasm, stamp, fingerprint, log, child, install });
    }
    OtherBuilds { running }
}

impl OtherBuilds {
    /// Waits for the builds; the components' paths, or a panic that says what to install.
    fn finish(self) -> Vec<PathBuf> {
        let mut failures = Vec::new();
        let mut built = Vec::new();
        for OtherBuild { wasm, stamp, fingerprint, log, child, install } in self.running {
            if let Some(mut child) = child {
                let status =
                    child.wait().unwrap_or_else(|e| panic!("waiting for the build of {}: {e}", wasm.display()));
                let output = std::fs::read_to_string(&log).unwrap_or_default();
                if !status.success() || !wasm.exists() {
                    failures.push(format!(
                        "building {} failed ({status}); its output ({}) is below. If a tool is missing: {install} \
                         (see .ci/run and the plugin's README).\n{}",
                        wasm.display(),
                        log.display(),
                        output.trim_end()
                    ));
                    continue;
                }
                for line in output.lines().filter(|l| l.contains("warning")) {
                    println!("cargo:warning={line}");
                }
                std::fs::write(&stamp, &fingerprint)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", stamp.display()));
            }
            built.push(wasm);
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        built
    }
}

/// The files under `dir`, recursively, without [`SKIPPED_DIRS`], sorted.
fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let skipped = entry.file_name().to_str().is_some_and(|n| SKIPPED_DIRS.contains(&n));
            match entry.file_type() {
                Ok(kind) if kind.is_dir() && !skipped => pending.push(path),
                Ok(kind) if kind.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files.sort();
    files
}

/// A hash of the relative paths and contents of the source files under `dirs`.
fn fingerprint(root: &Path, dirs: &[PathBuf]) -> String {
    let mut hasher = DefaultHasher::new();
    for file in dirs.iter().flat_map(|dir| source_files(dir)) {
        let relative = file.strip_prefix(root).unwrap_or(&file);
        hasher.write(relative.to_string_lossy().as_bytes());
        hasher.write(&std::fs::read(&file).unwrap_or_default());
    }
    format!("{:016x}\n", hasher.finish())
}
