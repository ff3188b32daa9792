//! `kubectl kbind bind <export> --gateway <url>`: the consumer's one command. The gateway binds
//! the Export for the caller and hands over a bundle once; the bundle is applied to the current
//! consumer context exactly as it came (server-side apply, never forced: a Secret, Connection or
//! binding of that name that someone else wrote is reported, not taken over), then the command
//! waits until the Connection is Ready, the binding is Ready and its APIs are served, printing
//! each step. `-o yaml` prints the bundle instead and writes nothing.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind_shared::api::{Binding, ClusterBinding, Connection};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::gateway::{Gateway, refused};

/// The field manager of what the plugin applies.
const FIELD_MANAGER: &str = "kubectl-kbind";

/// What the consumer asks the gateway for.
pub struct Ask {
    pub export: String,
    pub cluster_name: Option<String>,
    pub namespace: Option<String>,
    pub connection: Option<String>,
    pub secret_namespace: Option<String>,
}

/// The body of `POST /api/bind`.
pub fn request_body(ask: &Ask) -> Value {
    let mut body = json!({ "export": ask.export });
    for (key, value) in [
        ("clusterName", &ask.cluster_name),
        ("namespace", &ask.namespace),
        ("connection", &ask.connection),
        ("secretNamespace", &ask.secret_namespace),
    ] {
        if let Some(value) = value {
            body[key] = json!(value);
        }
    }
    body
}

/// Binds on the gateway and picks the bundle up (YAML).
pub async fn fetch(gateway: &Gateway, ask: &Ask) -> Result<String, String> {
    let bound = gateway
        .call(
            "POST",
            "/api/bind",
            "application/json",
            Some(&request_body(ask)),
        )
        .await?;
    if bound.code != 201 {
        return Err(refused(&bound));
    }
    let answer: Value = serde_json::from_str(&bound.body)
        .map_err(|e| format!("the gateway's bind answer is not JSON: {e}"))?;
    let pickup = answer["pickup"]
        .as_str()
        .filter(|p| p.starts_with("/api/pickup/"))
        .ok_or("the gateway's bind answer names no pickup")?;
    let taken = gateway
        .call("GET", pickup, "application/yaml", None)
        .await?;
    if taken.code != 200 {
        return Err(refused(&taken));
    }
    Ok(taken.body)
}

/// The bundle's documents.
pub fn documents(bundle: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(bundle) {
        let value = Value::deserialize(document).map_err(|e| format!("the bundle: {e}"))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    let kinds: Vec<&str> = out
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or(""))
        .collect();
    match kinds.as_slice() {
        ["Secret", "Connection", "ClusterBinding" | "Binding"] => Ok(out),
        _ => Err(format!(
            "the bundle is not a Secret, a Connection and a binding: {kinds:?}"
        )),
    }
}

fn name(document: &Value) -> Result<&str, String> {
    document["metadata"]["name"]
        .as_str()
        .ok_or_else(|| "a bundle document has no name".to_owned())
}

/// Applies the bundle's documents; returns the Connection's name and the binding (namespace,
/// name).
pub async fn apply(
    consumer: &Client,
    documents: &[Value],
) -> Result<(String, Option<String>, String), String> {
    let params = PatchParams::apply(FIELD_MANAGER);
    let refused = |what: String| {
        move |e: kube::Error| match e {
            kube::Error::Api(s) if s.code == 409 => format!(
                "{what} exists and someone else wrote it (not taken over): {}; pick another --connection",
                s.message
            ),
            e => format!("apply {what}: {e}"),
        }
    };
    let [secret, connection, binding] = documents else {
        return Err("the bundle is not three documents".into());
    };
    let namespace = secret["metadata"]["namespace"]
        .as_str()
        .ok_or("the bundle's Secret has no namespace")?;
    Api::<Secret>::namespaced(consumer.clone(), namespace)
        .patch(name(secret)?, &params, &Patch::Apply(secret))
        .await
        .map_err(refused(format!("Secret {namespace}/{}", name(secret)?)))?;
    eprintln!("applied Secret {namespace}/{}", name(secret)?);
    Api::<Connection>::all(consumer.clone())
        .patch(name(connection)?, &params, &Patch::Apply(connection))
        .await
        .map_err(refused(format!("Connection {}", name(connection)?)))?;
    eprintln!("applied Connection {}", name(connection)?);
    let binding_namespace = binding["metadata"]["namespace"].as_str().map(str::to_owned);
    match &binding_namespace {
        Some(ns) => {
            Api::<Binding>::namespaced(consumer.clone(), ns)
                .patch(name(binding)?, &params, &Patch::Apply(binding))
                .await
                .map_err(refused(format!("Binding {ns}/{}", name(binding)?)))?;
            eprintln!("applied Binding {ns}/{}", name(binding)?);
        }
        None => {
            Api::<ClusterBinding>::all(consumer.clone())
                .patch(name(binding)?, &params, &Patch::Apply(binding))
                .await
                .map_err(refused(format!("ClusterBinding {}", name(binding)?)))?;
            eprintln!("applied ClusterBinding {}", name(binding)?);
        }
    }
    Ok((
        name(connection)?.to_owned(),
        binding_namespace,
        name(binding)?.to_owned(),
    ))
}

/// The `Ready` condition's (status, reason, message), if any.
fn ready(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    kbind_shared::conditions::find(conditions, "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until `look` says Ready=True, printing each new reason; `what` names it.
async fn until_ready<F, Fut>(what: &str, deadline: Instant, mut look: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<(String, String, String)>, String>>,
{
    let mut said = None;
    loop {
        let now = look().await?;
        if let Some((status, reason, message)) = &now {
            if status == "True" {
                eprintln!("{what} is Ready");
                return Ok(());
            }
            if said.as_ref() != Some(reason) {
                eprintln!(
                    "waiting for {what}: {reason}: {}",
                    crate::view::line(message, 300)
                );
                said = Some(reason.clone());
            }
        }
        if Instant::now() > deadline {
            let last = now
                .map(|(_, reason, message)| format!("{reason}: {message}"))
                .unwrap_or_else(|| {
                    "no Ready condition yet (is kbind running on this cluster?)".into()
                });
            return Err(format!(
                "{what} is not Ready: {}",
                crate::view::line(&last, 500)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the Connection and the binding are Ready and each of the binding's APIs is served
/// (its CRD Established), for at most `limit`.
pub async fn wait(
    consumer: &Client,
    connection: &str,
    binding: (Option<&str>, &str),
    apis: &[String],
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let connections = Api::<Connection>::all(consumer.clone());
    until_ready(&format!("Connection {connection}"), deadline, || async {
        let c = connections
            .get(connection)
            .await
            .map_err(|e| format!("read Connection {connection}: {e}"))?;
        Ok(c.status.as_ref().and_then(|s| ready(&s.conditions)))
    })
    .await?;
    match binding {
        (Some(ns), name) => {
            let bindings = Api::<Binding>::namespaced(consumer.clone(), ns);
            until_ready(&format!("Binding {ns}/{name}"), deadline, || async {
                let b = bindings
                    .get(name)
                    .await
                    .map_err(|e| format!("read Binding {ns}/{name}: {e}"))?;
                Ok(b.status.as_ref().and_then(|s| ready(&s.conditions)))
            })
            .await?;
        }
        (None, name) => {
            let bindings = Api::<ClusterBinding>::all(consumer.clone());
            until_ready(&format!("ClusterBinding {name}"), deadline, || async {
                let b = bindings
                    .get(name)
                    .await
                    .map_err(|e| format!("read ClusterBinding {name}: {e}"))?;
                Ok(b.status.as_ref().and_then(|s| ready(&s.conditions)))
            })
            .await?;
        }
    }
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone());
    for api in apis {
        until_ready(&format!("API {api}"), deadline, || async {
            let crd = crds
                .get_opt(api)
                .await
                .map_err(|e| format!("read CRD {api}: {e}"))?;
            Ok(crd
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Established"))
                .map(|c| {
                    let status = c.status.clone();
                    (
                        status,
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default(),
                    )
                }))
        })
        .await
        .map_err(|e| e.replace("is not Ready", "is not served"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_only_what_was_given() {
        let ask = Ask {
            export: "widgets".into(),
            cluster_name: Some("prod".into()),
            namespace: None,
            connection: None,
            secret_namespace: None,
        };
        assert_eq!(
            request_body(&ask),
            json!({ "export": "widgets", "clusterName": "prod" })
        );
    }

    #[test]
    fn a_bundle_is_a_secret_a_connection_and_a_binding() {
        let ok = "---\nkind: Secret\nmetadata: {name: s, namespace: kbind}\n---\nkind: Connection\nmetadata: {name: c}\n---\nkind: Binding\nmetadata: {name: b, namespace: t}\n";
        assert_eq!(documents(ok).unwrap().len(), 3);
        for bad in [
            "kind: Secret\n",
            "---\nkind: Secret\n---\nkind: ClusterRoleBinding\n---\nkind: Connection\n",
            "- not: a document\n",
        ] {
            assert!(documents(bad).is_err(), "{bad}");
        }
    }
}
