//! Tools the tests build once and cache: Helm (from its official sources), kbind's previous
//! version (for the version-skew tests) and an OpenID Connect provider (the gateway's login).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Runs one of the `e2e/tools/` build scripts, which build once into the cache and print a path.
fn cached_build(script: &str) -> Result<PathBuf, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tools")
        .join(script);
    run_build_script(&script).map(PathBuf::from)
}

/// Runs the bash script `script` (its stderr shown as it goes) and returns the last line it
/// printed: where it left what it built.
pub fn run_build_script(script: &std::path::Path) -> Result<String, String> {
    let output = Command::new("bash")
        .arg(script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}); its output is above",
            script.display(),
            output.status
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout.trim().lines().last().unwrap_or_default().to_owned())
}

/// The Helm binary, built by `e2e/tools/build-helm.sh` the first time.
pub fn helm() -> Result<PathBuf, String> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| cached_build("build-helm.sh")).clone()
}

/// The OpenID Connect provider (zitadel/oidc's example server), built by
/// `e2e/tools/build-oidc.sh` the first time.
pub fn oidc_provider() -> Result<PathBuf, String> {
    static OIDC: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    OIDC.get_or_init(|| cached_build("build-oidc.sh")).clone()
}

/// The directory holding `kbind-schema-manager` and `kbind-syncer` of the previous version
/// (`e2e/tools/previous-version`), built by `e2e/tools/build-previous.sh` the first time.
pub fn previous_build() -> Result<PathBuf, String> {
    static PREVIOUS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PREVIOUS
        .get_or_init(|| cached_build("build-previous.sh"))
        .clone()
}

/// The commit of the previous version (`e2e/tools/previous-version`).
pub fn previous_commit() -> Result<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/previous-version");
    std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .lines()
        .find_map(|l| l.strip_prefix("commit=").map(str::to_owned))
        .ok_or_else(|| format!("{} names no commit", path.display()))
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

/// Runs `helm <args>`; its output, or an error with everything helm printed when it failed.
pub fn helm_checked(args: &[&str]) -> Result<String, String> {
    let output = run_helm(args)?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    if output.status.success() {
        Ok(stdout.into_owned())
    } else {
        Err(format!("helm {args:?} failed:\n{stdout}\n{stderr}"))
    }
}
