//! Writes the CRDs of kbind's API into `deploy/crds/` (or the directory given as the argument).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds"));
    std::fs::create_dir_all(&dir)?;
    for (file, crd) in kbind_shared::api::crds() {
        let path = dir.join(file);
        std::fs::write(&path, kbind_shared::api::crd_yaml(&crd))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
