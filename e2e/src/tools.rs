//! Tools the tests build from official sources once and cache: Helm.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The Helm binary, built by `e2e/tools/build-helm.sh` the first time.
pub fn helm() -> Result<PathBuf, String> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/build-helm.sh");
        let output = Command::new("bash")
            .arg(&script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !output.status.success() {
            return Err(format!("{} failed ({})", script.display(), output.status));
        }
        Ok(PathBuf::from(
            String::from_utf8_lossy(&output.stdout).trim(),
        ))
    })
    .clone()
}

/// The chart directory.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/charts/kbind")
}

/// Runs `helm <args>`; returns its output whether or not it succeeded.
pub fn run_helm(args: &[&str]) -> Result<Output, String> {
    Command::new(helm()?)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run helm: {e}"))
}
