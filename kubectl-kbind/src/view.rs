//! What the commands share: the consumer client, the provider client of a Connection (identity
//! checked against its pin), text that is safe to print, tables, and durations.

use std::path::Path;

use kbind_shared::api::{Connection, ConnectionSpec, ConnectionStatus};
use kbind_shared::kubeconfig::Transport;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::Serialize;

/// The longest text taken from a cluster into one table cell.
pub const MAX_CELL: usize = 80;

/// A client for the consumer: `--kubeconfig`/`--context` when given, else kube's usual inference.
pub async fn consumer_client(path: Option<&Path>, context: Option<&str>) -> Result<Client, String> {
    let config = config(path, context).await?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// The client configuration of the kubeconfig at `path` (default: as kubectl finds it) and
/// `context`, with kbind's bounded timeouts.
pub async fn config(path: Option<&Path>, context: Option<&str>) -> Result<Config, String> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let mut config = match path {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("read kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| e.to_string())?
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| e.to_string())?,
        None => Config::infer().await.map_err(|e| e.to_string())?,
    };
    kbind_shared::client::bound_timeouts(&mut config);
    Ok(config)
}

/// Prints `report` as JSON or as the text `render` makes of it.
pub fn print<T: Serialize>(json: bool, report: &T, render: fn(&T) -> String) -> Result<(), String> {
    if json {
        let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", render(report));
    }
    Ok(())
}

/// Text from a cluster, made safe for one line of a terminal: control characters (escape
/// sequences among them) become spaces, and it is cut at `max` characters.
pub fn line(text: &str, max: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if clean.chars().count() <= max {
        return clean;
    }
    let mut cut: String = clean.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// [`line`] at [`MAX_CELL`], with `-` for nothing.
pub fn cell(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        line(text, MAX_CELL)
    }
}

/// A plain table: a header row, then rows, columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, value) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(value.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut write_row = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (i, value) in cells.into_iter().enumerate() {
            out.push_str(value);
            if i < last {
                let pad = widths.get(i).copied().unwrap_or_default() + 2 - value.chars().count();
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    write_row(header.to_vec());
    for row in rows {
        write_row(row.iter().map(String::as_str).collect());
    }
    out
}

/// `1h2m`, `3m4s`, `5s`: a duration in seconds the way kubectl shows ages.
pub fn age(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        (h, _) if h < 48 => format!("{h}h{m}m"),
        (h, _) => format!("{}d{}h", h / 24, h % 24),
    }
}

/// [`age`] or `-`.
pub fn maybe_age(seconds: Option<u64>) -> String {
    seconds.map(age).unwrap_or_else(|| "-".into())
}

/// The provider side of a Connection as the plugin sees it.
pub struct ProviderView {
    /// A client built from the Connection's credential (as the schema manager holds it).
    pub provider: kbind_schema_manager::providers::Provider,
    /// The provider's cluster identity, as read now.
    pub identity: String,
}

/// Whether the provider a credential reaches is the one the Connection pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "verdict")]
pub enum Pin {
    /// It is.
    Matches,
    /// Nothing is pinned yet: kbind would pin this identity.
    Unpinned,
    /// Another cluster: kbind would refuse to use the credential (`ClusterIdentityChanged`).
    Mismatch {
        /// The pinned identity.
        pinned: String,
    },
}

/// ID-1 against the pin, as a pure decision.
pub fn pin(status: Option<&ConnectionStatus>, identity: &str) -> Pin {
    match status.map(|s| s.remote_cluster_uid.as_str()) {
        None | Some("") => Pin::Unpinned,
        Some(pinned) if pinned == identity => Pin::Matches,
        Some(pinned) => Pin::Mismatch {
            pinned: pinned.to_owned(),
        },
    }
}

/// The provider client of a Connection spec: its Secret read from the consumer (only in the
/// namespace the spec names), the kubeconfig validated as the programs validate it, and the
/// provider's identity read. Only reads.
pub async fn provider(
    consumer: &Client,
    spec: &ConnectionSpec,
    transport: Transport,
) -> Result<ProviderView, String> {
    let (view, identity) = provider_maybe_unidentified(consumer, spec, transport).await?;
    identity?;
    Ok(view)
}

/// [`provider`], also when the credential may not read the provider's identity: the view (its
/// `identity` empty then) and whether the identity could be read.
pub async fn provider_maybe_unidentified(
    consumer: &Client,
    spec: &ConnectionSpec,
    transport: Transport,
) -> Result<(ProviderView, Result<(), String>), String> {
    // The Secret is read wherever the spec points: the plugin cannot know the operator's
    // `--provider-secret-namespaces`, so that is the only namespace it allows.
    let reference = &spec.kubeconfig_secret_ref;
    let policy = kbind_shared::credential::SecretPolicy {
        namespaces: vec![reference.namespace.clone()],
        transport,
    };
    let credential =
        kbind_schema_manager::providers::read_credential(consumer, reference, &policy).await?;
    let client = credential
        .kubeconfig
        .client()
        .await
        .map_err(|e| e.to_string())?;
    let (identity, read) = match kbind_shared::identity::cluster_identity(&client).await {
        Ok(identity) => (identity, Ok(())),
        Err(e) => (
            String::new(),
            Err(format!("cannot read the provider's cluster identity: {e}")),
        ),
    };
    let view = ProviderView {
        provider: kbind_schema_manager::providers::Provider {
            client,
            kubeconfig: credential.kubeconfig,
            digest: credential.digest,
            schemas: Default::default(),
            identity: Default::default(),
        },
        identity,
    };
    Ok((view, read))
}

/// Numbered steps under a `Steps:` heading.
pub fn steps(steps: &[String]) -> String {
    let mut out = String::from("Steps:\n");
    for (i, step) in steps.iter().enumerate() {
        out.push_str(&format!("  {}. {step}\n", i + 1));
    }
    out
}

/// Objects listed per request.
const PAGE: u32 = 500;

/// Why reading `what` failed, without URLs or tokens.
pub fn read_error(what: &str, e: &kube::Error) -> String {
    format!(
        "cannot read {what}: {}",
        kbind_shared::identity::describe_error(e)
    )
}

/// Lists `api` page by page, handing each object to `each` (nothing is kept between pages).
pub async fn for_each_object(
    api: &Api<kube::api::DynamicObject>,
    what: &str,
    mut each: impl FnMut(&kube::api::DynamicObject),
) -> Result<(), String> {
    let mut params = kube::api::ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|e| read_error(what, &e))?;
        page.items.iter().for_each(&mut each);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// The Connection named `name` on the consumer, if it exists.
pub async fn connection(consumer: &Client, name: &str) -> Result<Option<Connection>, String> {
    Api::<Connection>::all(consumer.clone())
        .get_opt(name)
        .await
        .map_err(|e| read_error(&format!("Connection {name}"), &e))
}

/// Seconds from an RFC 3339 time to `now`, never negative; `None` for text that is not a time.
pub fn seconds_since(time: &str, now: jiff::Timestamp) -> Option<u64> {
    let then: jiff::Timestamp = time.parse().ok()?;
    let span = now.as_second() - then.as_second();
    Some(span.max(0).unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_cluster_is_one_bounded_line() {
        for (input, max, want) in [
            ("plain", 10, "plain"),
            ("", 10, ""),
            ("a\nb\tc", 10, "a b c"),
            ("\u{1b}[31mred\u{1b}[0m", 20, " [31mred [0m"),
            ("abcdefghij", 5, "abcd…"),
            ("ääääää", 3, "ää…"),
        ] {
            assert_eq!(line(input, max), want, "{input:?}");
        }
        assert_eq!(cell(""), "-");
    }

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let text = table(
            &["NAME", "READY"],
            &[
                vec!["a-long-name".into(), "True".into()],
                vec!["b".into(), "-".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME         READY\na-long-name  True\nb            -\n"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (seconds, want) in [
            (0, "0s"),
            (59, "59s"),
            (61, "1m1s"),
            (3600, "1h0m"),
            (3 * 86400 + 7200, "3d2h"),
        ] {
            assert_eq!(age(seconds), want);
        }
        assert_eq!(maybe_age(None), "-");
    }

    #[test]
    fn the_pin_decides_whether_a_credential_may_be_used() {
        let status = |uid: &str| ConnectionStatus {
            remote_cluster_uid: uid.into(),
            ..Default::default()
        };
        assert_eq!(pin(None, "x"), Pin::Unpinned);
        assert_eq!(pin(Some(&status("")), "x"), Pin::Unpinned);
        assert_eq!(pin(Some(&status("x")), "x"), Pin::Matches);
        assert_eq!(
            pin(Some(&status("y")), "x"),
            Pin::Mismatch { pinned: "y".into() }
        );
    }

    #[test]
    fn seconds_since_a_time() {
        let now: jiff::Timestamp = "2026-12-01T00:01:00Z".parse().unwrap();
        assert_eq!(seconds_since("2026-12-01T00:00:00Z", now), Some(60));
        assert_eq!(seconds_since("2026-12-01T00:02:00Z", now), Some(0));
        assert_eq!(seconds_since("yesterday", now), None);
    }
}
