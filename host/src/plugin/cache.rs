//! The on-disk cache of compiled components, keyed by the component's sha256 and the
//! engine's compatibility hash, so a restart or a swap back to a known version does
//! not recompile (Python and JavaScript components take 20+ s to compile).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of `<sha256>-<engine hash>.cwasm` files.
pub(super) struct Cache {
    dir: PathBuf,
    engine_hash: String,
}

/// The hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::codec::hex(&Sha256::digest(bytes))
}

impl Cache {
    pub(super) fn new(dir: &Path, engine: &Engine) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Self { dir: dir.to_owned(), engine_hash: format!("{:016x}", h.finish()) }
    }

    fn path_for(&self, bytes: &[u8]) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", sha256_hex(bytes), self.engine_hash))
    }

    /// The cached compilation of `bytes`, if any. A stale or corrupt entry is
    /// ignored (and recompiled by the caller).
    pub(super) fn get(&self, engine: &Engine, bytes: &[u8]) -> Option<Component> {
        let path = self.path_for(bytes);
        if !path.exists() {
            return None;
        }
        // SAFETY: `deserialize_file` trusts the file to be wasmtime's own output. The
        // cache dir belongs to the user running groupstate; entries are written only
        // by `put` below (atomically, through a rename) and are named by the source's
        // hash and the engine's compatibility hash, which wasmtime checks again.
        #[allow(unsafe_code)]
        let component = unsafe { Component::deserialize_file(engine, &path) };
        component.ok()
    }

    /// Stores the compilation of `bytes`.
    pub(super) fn put(&self, bytes: &[u8], component: &Component) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let serialized = component.serialize().map_err(|e| std::io::Error::other(e.to_string()))?;
        let path = self.path_for(bytes);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, serialized)?;
        std::fs::rename(&tmp, &path)
    }
}
