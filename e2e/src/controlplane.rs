//! The Kubernetes control plane binaries, built once from the Go module in `e2e/controlplane`
//! and cached outside the repository (see `e2e/controlplane/build.sh`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Paths of the control plane binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `etcd`
    pub etcd: PathBuf,
    /// `kube-apiserver`
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler` (the node's consumer cluster)
    pub kube_scheduler: PathBuf,
    /// `kubelet`
    pub kubelet: PathBuf,
    /// `kube-proxy`
    pub kube_proxy: PathBuf,
    /// `pause`: the pod sandbox image's program
    pub pause: PathBuf,
}

impl Binaries {
    fn in_dir(dir: &Path) -> Self {
        Self {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kube_scheduler: dir.join("kube-scheduler"),
            kubelet: dir.join("kubelet"),
            kube_proxy: dir.join("kube-proxy"),
            pause: dir.join("pause"),
        }
    }
}

/// Builds (first time only) and returns the control plane binaries. Concurrent callers, in this
/// process or others, wait for one build.
pub fn binaries() -> Result<Binaries, String> {
    static BINARIES: OnceLock<Result<Binaries, String>> = OnceLock::new();
    BINARIES.get_or_init(build).clone()
}

fn build() -> Result<Binaries, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("controlplane/build.sh");
    let dir = crate::tools::run_build_script(&script)?;
    let binaries = Binaries::in_dir(Path::new(&dir));
    for path in [
        &binaries.etcd,
        &binaries.kube_apiserver,
        &binaries.kube_controller_manager,
        &binaries.kube_scheduler,
        &binaries.kubelet,
        &binaries.kube_proxy,
        &binaries.pause,
    ] {
        if !path.is_file() {
            return Err(format!(
                "{} did not produce {}",
                script.display(),
                path.display()
            ));
        }
    }
    Ok(binaries)
}

/// Where kbind's own programs were built: `$KBIND_BIN_DIR`, else the cargo target directory this
/// test binary runs from (`target/<profile>/deps/..`).
pub fn kbind_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KBIND_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    let mut dir = exe
        .parent()
        .expect("the test binary is in a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The path of one of kbind's programs, checking that it was built.
pub fn kbind_bin(name: &str) -> Result<PathBuf, String> {
    let path = kbind_bin_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run `cargo build --workspace --bins` before the e2e tests",
            path.display()
        ))
    }
}
