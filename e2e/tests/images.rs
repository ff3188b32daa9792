//! kbind's container images (`scripts/images`, buildah, `FROM scratch`): what is in them, and
//! their entrypoints run as real processes against two real clusters.

use std::path::{Path, PathBuf};
use std::process::Command;

use kbind_e2e::fixtures::*;
use kbind_e2e::images::{self, Container};
use kbind_e2e::wait::wait_for;
use serde_json::json;

const PROGRAMS: [&str; 5] = [
    "kbind-schema-manager",
    "kbind-syncer",
    "kbind-reaper",
    "kbind-issuer",
    "kbind-gateway",
];
const VERSION: &str = env!("CARGO_PKG_VERSION");
const MAX_IMAGE_BYTES: u64 = 40 * 1024 * 1024;

/// Every regular file under `root`, as absolute paths inside it.
fn files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            files(root, &entry.path(), out);
        } else {
            let path = entry.path();
            out.push(format!("/{}", path.strip_prefix(root).unwrap().display()));
        }
    }
}

fn run(container: &Container, args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let (program, args) = container.run_command(&args, &[], &[]);
    Command::new(program)
        .envs(images::buildah_env().iter().copied())
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test]
async fn each_image_is_one_static_binary_as_a_numeric_non_root_user_with_labels() {
    let refs = images::built().unwrap();
    let registry = std::env::var("KBIND_IMAGE_REGISTRY").unwrap_or("ghcr.io/kbind-dev".into());
    let expected: Vec<String> = PROGRAMS
        .iter()
        .map(|p| format!("{registry}/{p}:{VERSION}"))
        .collect();
    assert_eq!(
        refs, expected,
        "scripts/images prints one reference per image"
    );
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());

    for (program, reference) in PROGRAMS.iter().zip(&refs) {
        let config = images::config(reference).unwrap();
        assert_eq!(
            config["User"],
            json!("65532:65532"),
            "{reference}: numeric, non-root"
        );
        assert_eq!(
            config["Entrypoint"],
            json!([format!("/{program}")]),
            "{reference}"
        );
        let labels = &config["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], json!(VERSION));
        assert_eq!(labels["org.opencontainers.image.title"], json!(program));
        assert!(
            labels["org.opencontainers.image.source"]
                .as_str()
                .is_some_and(|s| s.starts_with("https://")),
            "{reference}: source label {labels}"
        );
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap();
        if let Some(head) = &head {
            assert!(
                revision.starts_with(head.as_str()),
                "{reference}: revision {revision} is not HEAD {head}"
            );
        }
        let size = images::size(reference).unwrap();
        eprintln!(
            "image {reference}: {size} bytes ({:.1} MiB; goal < 40 MiB)",
            size as f64 / 1024.0 / 1024.0
        );
        assert!(size < MAX_IMAGE_BYTES, "{reference} is {size} bytes");

        // Exactly the binary and the CA bundle: no shell, no loader, no libraries.
        let container = Container::create(reference).unwrap();
        let mount = images::buildah(&["mount", container.name()]).unwrap();
        let root = PathBuf::from(mount.trim());
        let mut found = Vec::new();
        files(&root, &root, &mut found);
        found.sort();
        let _ = images::buildah(&["umount", container.name()]);
        assert_eq!(
            found,
            vec![
                "/etc/ssl/certs/ca-certificates.crt".to_owned(),
                format!("/{program}")
            ],
            "{reference} holds exactly its binary and the CA bundle"
        );

        // The entrypoint runs in that empty root (so it is statically linked).
        let help = run(&container, &["--help"]);
        assert!(help.status.success(), "{reference} --help: {help:?}");
        assert!(String::from_utf8_lossy(&help.stdout).contains(&format!("Usage: {program}")));
        let version = run(&container, &["--version"]);
        assert_eq!(
            String::from_utf8_lossy(&version.stdout).trim(),
            format!("{program} {VERSION}")
        );
    }
}

/// Name resolution inside the image (static glibc, no NSS modules): a program from the image,
/// pointed at `localhost` on a closed port, gets as far as "connection refused" — the name
/// resolved through the container's /etc/hosts — and not a lookup failure.
#[tokio::test]
async fn host_names_resolve_inside_the_images() {
    let reference = images::reference("kbind-syncer").unwrap();
    let dir = kbind_e2e::env::runs_dir().join(format!("images_resolve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = kbind_e2e::cluster::free_port();
    let kubeconfig = dir.join("localhost.kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig_without_ca(&format!("https://localhost:{port}"), "t"),
    )
    .unwrap();
    let container = Container::create(&reference).unwrap();
    let args: Vec<String> = [
        format!("--kubeconfig={}", kubeconfig.display()),
        "--identity=resolver".to_owned(),
        "--namespace=default".to_owned(),
        format!(
            "--metrics-bind-address=127.0.0.1:{}",
            kbind_e2e::cluster::free_port()
        ),
        format!(
            "--health-probe-bind-address=127.0.0.1:{}",
            kbind_e2e::cluster::free_port()
        ),
    ]
    .into();
    let (launcher, launch) = container.run_command(&args, &[(&kubeconfig, &kubeconfig)], &[]);
    let log = dir.join("syncer.log");
    let mut process = kbind_e2e::ChildProcess::start_with(
        "resolver",
        &launcher,
        &launch,
        images::buildah_env(),
        &log,
        true,
    )
    .unwrap();
    let text = wait_for("the syncer's first connection attempt", 30, || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { Ok(text.contains("not reachable yet").then_some(text)) }
    })
    .await;
    process.kill();
    drop(container);
    assert!(text.contains("Connection refused"), "{text}");
    assert!(!text.contains("failed to lookup address"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The user ids of the processes named `program` in the process group `group`.
fn uids_in_group(group: u32, program: &str) -> Vec<String> {
    let mut uids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …
        let Some((comm, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
        else {
            continue;
        };
        let pgrp = rest
            .split_whitespace()
            .nth(2)
            .and_then(|p| p.parse::<u32>().ok());
        // The kernel keeps 15 bytes of a command name.
        if comm == &program[..program.len().min(15)] && pgrp == Some(group) {
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
                uids.push(line.split_whitespace().nth(1).unwrap_or("").to_owned());
            }
        }
    }
    uids
}

/// A kubeconfig for `server` with `token` and no certificate authority: the program must trust
/// the server through the CA bundle at the standard path.
fn kubeconfig_without_ca(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: {token}\n"
    )
}

#[tokio::test]
async fn programs_from_the_images_become_ready_and_sync_an_object_between_two_clusters() {
    images::built().unwrap();
    let mut s = SyncEnv::start_built(
        "images_smoke",
        &[0, 1, 2],
        None,
        &[],
        &[],
        (&Build::Images, &Build::Images),
    )
    .await;
    wait_cluster_binding_ready(&s.consumer, "widgets").await;
    s.manager
        .wait_ready("the schema manager from its image", 60)
        .await;
    s.syncer.wait_ready("the syncer from its image", 60).await;

    // One object: spec up, status down, a change up, deletion cleans up.
    kbind_e2e::cluster::ensure_namespace(&s.consumer, "team-a")
        .await
        .unwrap();
    create_widget_and_wait_upstream(&s.consumer, &s.provider, "team-a", "w1", 3).await;
    let consumer_widgets = widgets(&s.consumer, "team-a");
    let provider_widgets = widgets(&s.provider, "team-a");
    wait_status_down(&consumer_widgets, "w1", 3).await;
    resize_and_wait_upstream(&consumer_widgets, &provider_widgets, "w1", 5).await;

    // Each program runs as the image's user, not as the root that launched it.
    for (index, program) in [
        (s.manager.index, "kbind-schema-manager"),
        (s.syncer.index, "kbind-syncer"),
    ] {
        let group = s.env.process(index).pid().unwrap();
        assert_eq!(
            uids_in_group(group, program),
            vec!["65532".to_owned()],
            "{program}"
        );
    }

    // TLS roots: a kubeconfig naming no CA is trusted through the image's CA bundle path. The
    // image's own bundle (public CAs) does not vouch for the test cluster…
    let consumer = s.env.cluster("consumer");
    let no_ca = s.env.dir().join("no-ca.kubeconfig");
    std::fs::write(
        &no_ca,
        kubeconfig_without_ca(consumer.server(), consumer.admin_token()),
    )
    .unwrap();
    let cluster_ca = s.env.dir().join("cluster-ca.pem");
    std::fs::write(&cluster_ca, consumer.ca_pem()).unwrap();
    let untrusted = Component::Syncer
        .start_built(
            &mut s.env,
            &Build::Images,
            &no_ca,
            "syncer-public-roots",
            &[],
        )
        .unwrap();
    wait_for(
        "an unknown-issuer error from the image's own CA bundle",
        30,
        || {
            let log = std::fs::read_to_string(s.env.process_ref(untrusted.index).log())
                .unwrap_or_default();
            async move { Ok(log.contains("UnknownIssuer").then_some(())) }
        },
    )
    .await;
    let log = std::fs::read_to_string(s.env.process_ref(untrusted.index).log()).unwrap();
    assert!(
        !log.contains("no valid native root CA"),
        "the image has CA roots: {log}"
    );
    s.env.process(untrusted.index).kill();

    // …and with the cluster's CA at that path, the same kubeconfig connects and the replica joins.
    let container = Container::create(&images::reference("kbind-syncer").unwrap()).unwrap();
    let metrics = format!("127.0.0.1:{}", kbind_e2e::cluster::free_port());
    let probes = format!("127.0.0.1:{}", kbind_e2e::cluster::free_port());
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", no_ca.display()),
        format!("--metrics-bind-address={metrics}"),
        format!("--health-probe-bind-address={probes}"),
        format!("--namespace={KBIND_NAMESPACE}"),
        "--identity=syncer-cluster-roots".to_owned(),
    ];
    let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    let (launcher, launch) =
        container.run_command(&args, &[(&no_ca, &no_ca), (&cluster_ca, bundle)], &[]);
    s.env.hold_container(container);
    let index = s
        .env
        .start_process(
            "syncer-cluster-roots",
            &launcher,
            &launch,
            images::buildah_env(),
            true,
        )
        .unwrap();
    let trusted = Program {
        index,
        metrics,
        probes,
    };
    trusted
        .wait_ready("a syncer trusting the cluster through its CA bundle", 60)
        .await;

    // Deletion still cleans up with the images' programs.
    consumer_widgets
        .delete("w1", &Default::default())
        .await
        .unwrap();
    kbind_e2e::wait::wait_gone(&provider_widgets, "w1", "the provider copy", 30).await;
    kbind_e2e::wait::wait_gone(&consumer_widgets, "w1", "the consumer object", 30).await;
}
