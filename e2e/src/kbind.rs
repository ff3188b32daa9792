//! Helpers that put kbind itself onto a test cluster.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::wait::eventually;

/// The checked-in CRD manifests of kbind's API (`deploy/crds/*.yaml`).
pub fn crd_manifests() -> Result<Vec<CustomResourceDefinition>, String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

/// Applies kbind's CRDs from `deploy/crds/` and waits until each is Established.
pub async fn install_crds(client: &Client) -> Result<Vec<String>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in crd_manifests()? {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or("a CRD manifest without a name")?;
        api.patch(
            &name,
            &PatchParams::apply("kbind-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("apply CRD {name}: {e}"))?;
        names.push(name);
    }
    for name in &names {
        wait_established(&api, name).await?;
    }
    Ok(names)
}

/// Waits until the CRD `name` is Established.
pub async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
) -> Result<(), String> {
    eventually(
        &format!("CRD {name} to be Established"),
        Duration::from_secs(30),
        || async {
            let crd = api.get(name).await.map_err(|e| e.to_string())?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        },
    )
    .await
}

/// A plain HTTP GET against a kbind endpoint on loopback: returns the status code and body.
pub async fn http_get(address: &str, path: &str) -> Result<(u16, String), String> {
    http_get_with(address, path, None).await
}

/// [`http_get`] with `Authorization: Bearer <token>` when a token is given.
pub async fn http_get_with(
    address: &str,
    path: &str,
    bearer: Option<&str>,
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("connect {address}: {e}"))?;
    let authorization = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    stream
        .write_all(
            format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n{authorization}\r\n").as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response from {address}{path}"))?;
    Ok((code, body.to_owned()))
}

/// Requests an API server has served so far, from its own `apiserver_request_total`, by
/// `"<verb> <group>/<resource> <subresource>"`.
pub async fn apiserver_requests(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let text = apiserver_metrics(client).await?;
    let mut requests = std::collections::BTreeMap::new();
    let served = counter_by(
        &text,
        "apiserver_request_total",
        &["verb", "group", "resource", "subresource"],
    );
    for (key, count) in served {
        let [verb, group, resource, subresource] = key;
        *requests
            .entry(format!("{verb} {group}/{resource} {subresource}"))
            .or_default() += count as u64;
    }
    Ok(requests)
}

/// An API server's own `/metrics` text.
pub async fn apiserver_metrics(client: &Client) -> Result<String, String> {
    client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("static request"),
        )
        .await
        .map_err(|e| format!("read API server metrics: {e}"))
}

/// The watches an API server holds open right now (every client's, from its own
/// `apiserver_longrunning_requests`), by `"<group>/<resource>"` (the core group is empty).
pub async fn apiserver_watches(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let text = apiserver_metrics(client).await?;
    let mut watches = std::collections::BTreeMap::new();
    let open = counter_by(
        &text,
        "apiserver_longrunning_requests",
        &["verb", "group", "resource"],
    );
    for ([verb, group, resource], count) in open {
        if verb == "WATCH" && count > 0.0 {
            *watches.entry(format!("{group}/{resource}")).or_default() += count as u64;
        }
    }
    Ok(watches)
}

/// Write requests (POST, PUT, PATCH, APPLY, DELETE) an API server has served so far
/// ([`apiserver_requests`]), leaving out Leases (heartbeats and leader election renew them by
/// design).
pub async fn apiserver_writes(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let mut writes = apiserver_requests(client).await?;
    writes.retain(|key, _| {
        let mut parts = key.split(' ');
        let verb = parts.next().unwrap_or_default();
        let resource = parts.next().unwrap_or_default();
        matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE")
            && !resource.ends_with("/leases")
    });
    Ok(writes)
}

/// How many more of each request `after` counts than `before` (only those that grew).
pub fn grown(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(key, n)| {
            let more = n.saturating_sub(before.get(key).copied().unwrap_or_default());
            (more > 0).then(|| (key.clone(), more))
        })
        .collect()
}

/// The samples of the counter `metric` in a `/metrics` text, summed by the values of `labels`
/// (missing labels read as empty).
pub fn counter_by<const N: usize>(
    text: &str,
    metric: &str,
    labels: &[&str; N],
) -> std::collections::BTreeMap<[String; N], f64> {
    let mut out = std::collections::BTreeMap::new();
    let prefix = format!("{metric}{{");
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let key = labels.map(|name| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        });
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        *out.entry(key).or_default() += value;
    }
    out
}

/// The writes in `after` that `before` did not have yet.
pub fn new_writes(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<String> {
    after
        .iter()
        .filter_map(|(key, n)| {
            let delta = n - before.get(key).copied().unwrap_or_default();
            (delta > 0).then(|| format!("{key}: {delta}"))
        })
        .collect()
}

/// The sum of every sample of the metric family `name` (any labels) in a `/metrics` text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_by_the_labels_asked_for() {
        let text = "# HELP apiserver_request_total x\n\
apiserver_request_total{code=\"201\",group=\"\",resource=\"configmaps\",subresource=\"\",verb=\"POST\"} 2\n\
apiserver_request_total{code=\"409\",group=\"\",resource=\"configmaps\",subresource=\"\",verb=\"POST\"} 1\n\
apiserver_request_total{code=\"200\",group=\"apps\",resource=\"deployments\",subresource=\"status\",verb=\"PATCH\"} 4\n\
apiserver_request_total_other{verb=\"POST\"} 9\n";
        let by = counter_by(
            text,
            "apiserver_request_total",
            &["verb", "group", "resource", "subresource"],
        );
        assert_eq!(
            by.into_iter().collect::<Vec<_>>(),
            [
                (
                    ["PATCH", "apps", "deployments", "status"].map(String::from),
                    4.0
                ),
                (["POST", "", "configmaps", ""].map(String::from), 3.0),
            ]
        );
    }

    #[test]
    fn only_requests_that_grew_are_counted() {
        let at = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(k, n)| ((*k).to_owned(), *n))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let before = at(&[("GET /namespaces ", 3), ("WATCH /namespaces ", 1)]);
        let after = at(&[
            ("GET /namespaces ", 3),
            ("WATCH /namespaces ", 2),
            ("APPLY coordination.k8s.io/leases ", 1),
        ]);
        assert_eq!(
            grown(&before, &after),
            at(&[
                ("APPLY coordination.k8s.io/leases ", 1),
                ("WATCH /namespaces ", 1)
            ])
        );
    }
}
