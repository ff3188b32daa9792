//! Flags both programs share (INTERFACES.md, "Flags common to both"). Every flag can also be set
//! through an environment variable `KBIND_<NAME>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::keys;

/// Flags common to `kbind-schema-manager` and `kbind-syncer`.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Kubeconfig of the consumer cluster [default: in-cluster, else $KUBECONFIG, else ~/.kube/config]
    #[arg(long, env = "KBIND_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context [default: the current context]
    #[arg(long, env = "KBIND_CONTEXT")]
    pub context: Option<String>,

    /// kbind's own namespace: its Leases and its Events' home [default: $POD_NAMESPACE, else kbind]
    #[arg(long, env = "KBIND_NAMESPACE")]
    pub namespace: Option<String>,

    /// Namespaces (comma-separated) where provider kubeconfig Secrets may live; a Connection
    /// referencing a Secret elsewhere is refused [default: kbind's own namespace]
    #[arg(long, env = "KBIND_PROVIDER_SECRET_NAMESPACES", value_delimiter = ',')]
    pub provider_secret_namespaces: Vec<String>,

    /// Address of the Prometheus endpoint `/metrics`; `0` disables it
    #[arg(long, env = "KBIND_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080", value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,

    /// Serve `/metrics` only to a bearer token the consumer API server authenticates
    /// (TokenReview) and allows to `get` the non-resource URL `/metrics` (SubjectAccessReview),
    /// as kube-rbac-proxy does; needs `create` on tokenreviews and subjectaccessreviews
    #[arg(long, env = "KBIND_METRICS_AUTH", default_value_t = false, action = clap::ArgAction::Set)]
    pub metrics_auth: bool,

    /// Address of `/healthz` and `/readyz`; `0` disables them
    #[arg(long, env = "KBIND_HEALTH_PROBE_BIND_ADDRESS", default_value = "0.0.0.0:8081", value_parser = parse_bind_address)]
    pub health_probe_bind_address: BindAddress,

    /// Log format
    #[arg(long, env = "KBIND_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in tracing env-filter syntax (RUST_LOG is honoured too)
    #[arg(long, env = "KBIND_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Accept provider kubeconfigs with `insecure-skip-tls-verify: true` or an `http://` server
    /// (refused by default)
    #[arg(long, env = "KBIND_ALLOW_INSECURE_PROVIDERS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_insecure_providers: bool,

    /// This process's name: the syncer's member name (its membership Lease), the schema manager's
    /// leader Lease holder, both programs' Event instance [default: $POD_NAME, else
    /// <hostname>-<pid>]
    #[arg(long, env = "KBIND_IDENTITY")]
    pub identity: Option<String>,
}

impl CommonArgs {
    /// kbind's own namespace: `--namespace`, else `$POD_NAMESPACE`, else `kbind`.
    pub fn namespace(&self) -> String {
        self.namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| keys::DEFAULT_NAMESPACE.to_owned())
    }
}

impl CommonArgs {
    /// The one identity rule of both programs: `--identity`, else `$POD_NAME`, else
    /// `<hostname>-<pid>` (two processes on one host never share a name, so never a Lease).
    pub fn identity(&self) -> String {
        identity(
            self.identity.as_deref(),
            std::env::var("POD_NAME").ok().as_deref(),
            || {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .or_else(|_| std::fs::read_to_string("/etc/hostname"))
                    .ok()
            },
            std::process::id(),
        )
    }

    /// The operator's rules for provider Secrets: where they may live and whether insecure
    /// transport is allowed.
    pub fn provider_secrets(&self) -> crate::credential::SecretPolicy {
        crate::credential::SecretPolicy {
            namespaces: self.provider_secret_namespaces(),
            transport: if self.allow_insecure_providers {
                crate::kubeconfig::Transport::AllowInsecure
            } else {
                crate::kubeconfig::Transport::Secure
            },
        }
    }

    /// Where provider kubeconfig Secrets may live: `--provider-secret-namespaces`, else kbind's
    /// own namespace.
    pub fn provider_secret_namespaces(&self) -> Vec<String> {
        let listed: Vec<String> = self
            .provider_secret_namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if listed.is_empty() {
            vec![self.namespace()]
        } else {
            listed
        }
    }
}

/// [`CommonArgs::identity`] over its inputs.
pub fn identity(
    flag: Option<&str>,
    pod_name: Option<&str>,
    hostname: impl FnOnce() -> Option<String>,
    pid: u32,
) -> String {
    let given = |v: Option<&str>| {
        v.map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    given(flag).or_else(|| given(pod_name)).unwrap_or_else(|| {
        let host = given(hostname().as_deref()).unwrap_or_else(|| "kbind".to_owned());
        format!("{host}-{pid}")
    })
}

/// Parses a size in bytes: `1048576`, `512Ki`, `10Mi`, `1Gi`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} (use Ki, Mi or Gi)")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a size in bytes (e.g. 10Mi)"))
}

/// A listen address, or disabled (`0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindAddress {
    /// Serve on this address.
    Listen(SocketAddr),
    /// Do not serve.
    Disabled,
}

/// Parses `HOST:PORT`, `:PORT`, or `0` (disabled).
pub fn parse_bind_address(text: &str) -> Result<BindAddress, String> {
    if text == "0" {
        return Ok(BindAddress::Disabled);
    }
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse()
        .map(BindAddress::Listen)
        .map_err(|_| format!("{text:?} is not HOST:PORT, :PORT or 0"))
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses a duration such as `500ms`, `30s`, `10m` or `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 500ms, 30s, 10m or 1h: {e}"))?;
    if duration.is_zero() {
        return Err(format!("{text:?} must be longer than zero"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_bytes() {
        assert_eq!(parse_bytes("10Mi"), Ok(10 << 20));
        assert_eq!(parse_bytes("512Ki"), Ok(512 << 10));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        for bad in ["", "0", "10MB", "Mi", "-1", "99999999999999999999Gi"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_identity_rule() {
        let host = || Some("node-1\n".to_owned());
        assert_eq!(identity(Some("me"), Some("pod"), host, 7), "me");
        assert_eq!(identity(Some(" "), Some("pod"), host, 7), "pod");
        assert_eq!(identity(None, Some(""), host, 7), "node-1-7");
        assert_eq!(identity(None, None, || None, 7), "kbind-7");
    }

    #[test]
    fn durations_in_the_documented_forms() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind_address("0").unwrap(), BindAddress::Disabled);
        assert_eq!(
            parse_bind_address(":8080").unwrap(),
            BindAddress::Listen("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:0").unwrap(),
            BindAddress::Listen("127.0.0.1:0".parse().unwrap())
        );
        assert!(parse_bind_address("localhost").is_err());
    }
}
