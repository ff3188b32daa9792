//! Writes the CRDs of kbind's API into `deploy/crds/` and the Helm chart's
//! `deploy/charts/kbind/files/crds/` (or only into the directory given as the argument).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dirs = match std::env::args_os().nth(1) {
        Some(dir) => vec![PathBuf::from(dir)],
        None => kbind_shared::api::CRD_DIRS
            .iter()
            .map(|d| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(d))
            .collect(),
    };
    for dir in dirs {
        std::fs::create_dir_all(&dir)?;
        for (file, crd) in kbind_shared::api::crds() {
            let path = dir.join(file);
            std::fs::write(&path, kbind_shared::api::crd_yaml(&crd))?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
