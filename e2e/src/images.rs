//! kbind's container images in tests: built by `scripts/images` (buildah, vfs storage, chroot
//! isolation), inspected, and run — each image's own entrypoint, as its own user — with
//! `buildah run` on the host network, so that a program from an image reaches the test clusters on
//! loopback like any other.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// The environment every buildah command here runs with (the storage `scripts/images` builds into).
const BUILDAH_ENV: [(&str, &str); 2] = [("STORAGE_DRIVER", "vfs"), ("BUILDAH_ISOLATION", "chroot")];

fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `buildah <args>`; its stdout, or an error with its stderr.
pub fn buildah(args: &[&str]) -> Result<String, String> {
    let output = Command::new("buildah")
        .envs(BUILDAH_ENV)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run buildah: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "buildah {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The image references `scripts/images` builds, in its order (schema manager, syncer). Builds
/// them once per test binary from the current tree, so that no test ever runs a stale image
/// (a no-op rebuild takes about a second).
pub fn built() -> Result<Vec<String>, String> {
    static BUILT: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    BUILT.get_or_init(|| run_images_script(&[])).clone()
}

/// The images of the chart upgrade test's previous version (`scripts/images --previous`: the
/// binaries `e2e/tools/build-previous.sh chart` builds once and caches), in the same order.
pub fn previous() -> Result<Vec<String>, String> {
    static PREVIOUS: OnceLock<Result<Vec<String>, String>> = OnceLock::new();
    PREVIOUS
        .get_or_init(|| run_images_script(&["--previous"]))
        .clone()
}

/// Runs `scripts/images <args>`; the references it prints.
fn run_images_script(args: &[&str]) -> Result<Vec<String>, String> {
    let script = repository_root().join("scripts/images");
    let mut command = Command::new(&script);
    // Without the variables cargo sets for this test (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, …):
    // build scripts fingerprint them, so the images' whole dependency tree would be built again
    // each time the images are built once from a test and once from `scripts/test`.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && !matches!(&*key, "CARGO_HOME" | "CARGO_TARGET_DIR"))
            || key == "OUT_DIR"
        {
            command.env_remove(&*key);
        }
    }
    let output = command
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} {} failed ({})",
            script.display(),
            args.join(" "),
            output.status
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The reference of `program`'s image (`kbind-schema-manager`, `kbind-syncer`).
pub fn reference(program: &str) -> Result<String, String> {
    find_reference(&built()?, program)
}

/// The reference of `program`'s image of the previous version ([`previous`]).
pub fn previous_reference(program: &str) -> Result<String, String> {
    find_reference(&previous()?, program)
}

fn find_reference(references: &[String], program: &str) -> Result<String, String> {
    references
        .iter()
        .find(|r| program_of(r) == program)
        .cloned()
        .ok_or_else(|| format!("scripts/images built no image for {program}"))
}

/// `kbind-syncer` of `ghcr.io/kbind-dev/kbind-syncer:0.1.0`.
fn program_of(reference: &str) -> &str {
    reference
        .rsplit('/')
        .next()
        .and_then(|last| last.split(':').next())
        .unwrap_or_default()
}

/// The image's OCI configuration (`User`, `Entrypoint`, `Labels`, …).
pub fn config(reference: &str) -> Result<Value, String> {
    let text = buildah(&["inspect", "--type", "image", reference])?;
    let inspected: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(inspected["OCIv1"]["config"].clone())
}

/// The image's size in bytes: its configuration and layers as its manifest records them (the
/// layers uncompressed, as stored locally).
pub fn size(reference: &str) -> Result<u64, String> {
    let text = buildah(&["inspect", "--type", "image", reference])?;
    let inspected: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let manifest: Value = serde_json::from_str(inspected["Manifest"].as_str().unwrap_or("{}"))
        .map_err(|e| format!("the manifest of {reference}: {e}"))?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    if layers.is_empty() {
        return Err(format!("{reference} has no layers: {manifest}"));
    }
    Ok(manifest["config"]["size"].as_u64().unwrap_or(0)
        + layers
            .iter()
            .filter_map(|l| l["size"].as_u64())
            .sum::<u64>())
}

/// A working container of an image; removed on drop.
#[derive(Debug)]
pub struct Container {
    name: String,
    entrypoint: Vec<String>,
}

impl Container {
    /// A new container of `reference`, never pulling.
    pub fn create(reference: &str) -> Result<Self, String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "kbind-e2e-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let entrypoint: Vec<String> = config(reference)?["Entrypoint"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if entrypoint.is_empty() {
            return Err(format!("{reference} has no entrypoint"));
        }
        buildah(&["from", "--pull-never", "--name", &name, reference])?;
        Ok(Self { name, entrypoint })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program and arguments that run the image's entrypoint with `args` in this container:
    /// host network, the image's user, each `(host path, container path)` of `mounts`
    /// bind-mounted read-only, and `envs` set.
    pub fn run_command(
        &self,
        args: &[String],
        mounts: &[(&Path, &Path)],
        envs: &[(&str, &str)],
    ) -> (PathBuf, Vec<String>) {
        let mut command = vec![
            "run".to_owned(),
            "--isolation=chroot".to_owned(),
            "--network=host".to_owned(),
        ];
        for (host, inside) in mounts {
            command.push(format!(
                "--volume={}:{}:ro",
                host.display(),
                inside.display()
            ));
        }
        for (key, value) in envs {
            command.push(format!("--env={key}={value}"));
        }
        command.push(self.name.clone());
        command.push("--".to_owned());
        command.extend(self.entrypoint.iter().cloned());
        command.extend(args.iter().cloned());
        (PathBuf::from("buildah"), command)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = buildah(&["rm", &self.name]);
    }
}

/// The environment variables buildah needs, for a [`crate::ChildProcess`] running it.
pub fn buildah_env() -> &'static [(&'static str, &'static str)] {
    &BUILDAH_ENV
}

/// The OCI archives `scripts/images` writes beside the images it builds
/// (`target/images/<program>.tar`, each naming its image reference), for a node's containerd.
pub fn archives() -> Result<Vec<PathBuf>, String> {
    archives_in(&built()?, "target/images")
}

/// The OCI archives of the previous version's images (`target/images/previous/<program>.tar`).
pub fn previous_archives() -> Result<Vec<PathBuf>, String> {
    archives_in(&previous()?, "target/images/previous")
}

fn archives_in(references: &[String], dir: &str) -> Result<Vec<PathBuf>, String> {
    references
        .iter()
        .map(|reference| {
            let archive = repository_root().join(format!("{dir}/{}.tar", program_of(reference)));
            if archive.is_file() {
                Ok(archive)
            } else {
                Err(format!("scripts/images wrote no {}", archive.display()))
            }
        })
        .collect()
}

/// An OCI archive of the pod sandbox image `reference`: `FROM scratch`, the static `pause`
/// program as its entrypoint (built with the control plane). Built once per test binary.
pub fn pause_archive(pause: &Path, reference: &str) -> Result<PathBuf, String> {
    static ARCHIVE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            let archive = repository_root().join("target/images/pause.tar");
            std::fs::create_dir_all(repository_root().join("target/images"))
                .map_err(|e| e.to_string())?;
            let container = buildah(&["from", "scratch"])?.trim().to_owned();
            let built = (|| {
                buildah(&["copy", &container, &pause.display().to_string(), "/pause"])?;
                buildah(&[
                    "config",
                    "--entrypoint",
                    r#"["/pause"]"#,
                    "--user",
                    "65535:65535",
                    &container,
                ])?;
                buildah(&["commit", "--quiet", &container, reference])?;
                let _ = std::fs::remove_file(&archive);
                buildah(&[
                    "push",
                    "--quiet",
                    reference,
                    &format!("oci-archive:{}:{reference}", archive.display()),
                ])
            })();
            let _ = buildah(&["rm", &container]);
            built.map(|_| archive)
        })
        .clone()
}
