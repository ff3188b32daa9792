//! Writes the CRDs of kbind's API into `deploy/crds/` and the Helm chart's
//! `deploy/charts/kbind/files/crds/`, and the reaper's into its chart's `crds/` (or all of them
//! only into the directory given as the argument).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let only = std::env::args_os().nth(1).map(PathBuf::from);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for (dir, file, crd) in kbind_shared::api::checked_in_crds() {
        let dir = only.clone().unwrap_or_else(|| root.join(dir));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(file);
        std::fs::write(&path, kbind_shared::api::crd_yaml(&crd))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
