//! Builds every plugin under `plugins/` (and the test plugins under `tests/plugins/`)
//! to wasm32-wasip2 components, and exposes their paths as constants in
//! `$OUT_DIR/plugins.rs`, so `cargo test` always exercises freshly built plugins.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("tests/ has a parent").to_owned();
    let target_dir = root.join("target").join("guest");
    for dir in ["plugins", "guest-sdk", "wit", "tests/plugins"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let mut consts = String::new();
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
