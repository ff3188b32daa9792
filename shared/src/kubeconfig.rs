//! Provider credentials: a kubeconfig held in a Secret, turned into a [`kube::Client`].
//!
//! kbind runs in a container, so a provider kubeconfig must be self-contained: inline
//! certificates, keys and tokens. File references and exec/auth-provider plugins are rejected with
//! an error naming the offending field. Error messages never quote the Secret's contents.

use kube::config::{Cluster, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster};
use kube::{Client, Config};

/// Why a kubeconfig cannot be used. Each message names what is wrong and where, never the
/// Secret's contents.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The data is empty.
    #[error("the kubeconfig is empty")]
    Empty,
    /// The data is not UTF-8 text.
    #[error("the kubeconfig is not UTF-8 text")]
    NotText,
    /// The data does not parse as a kubeconfig; `at` locates the problem.
    #[error("the kubeconfig is not a valid kubeconfig YAML document{at}")]
    NotKubeconfig {
        /// ` (line L, column C)` or empty.
        at: String,
    },
    /// `current-context` is missing or empty.
    #[error("the kubeconfig has no current-context")]
    NoCurrentContext,
    /// A name it refers to is not defined.
    #[error("the kubeconfig's {what} {name:?} is not defined")]
    Undefined {
        /// `context`, `cluster` or `user`.
        what: &'static str,
        /// The missing name.
        name: String,
    },
    /// The current cluster has no server URL.
    #[error("the kubeconfig's cluster {0:?} has no server")]
    NoServer(String),
    /// A field refers to a file on the machine, which kbind's container does not have.
    #[error(
        "the kubeconfig field {field} refers to a file; embed the data inline instead (e.g. {inline})"
    )]
    FileReference {
        /// The offending field, e.g. `users[admin].user.client-certificate`.
        field: String,
        /// The inline field to use instead.
        inline: &'static str,
    },
    /// A field asks for a credential plugin, which kbind does not run.
    #[error(
        "the kubeconfig field {field} uses a credential plugin, which kbind does not run; use an inline token or client certificate"
    )]
    Plugin {
        /// The offending field, e.g. `users[admin].user.exec`.
        field: String,
    },
    /// A field kbind does not support (named, never its value).
    #[error(
        "the kubeconfig field {0} is not supported by kbind (it connects to the provider directly)"
    )]
    Unsupported(String),
    /// More than [`MAX_KUBECONFIG_BYTES`].
    #[error("the kubeconfig is {0} bytes; kbind reads at most {MAX_KUBECONFIG_BYTES}")]
    TooLarge(usize),
    /// Insecure transport (`insecure-skip-tls-verify`, an `http://` server) and the operator did
    /// not allow it.
    #[error(
        "the kubeconfig's cluster {cluster:?} uses {what}; kbind refuses insecure transport to a provider unless the operator allows it (--allow-insecure-providers, chart value allowInsecureProviders)"
    )]
    Insecure {
        /// The cluster entry.
        cluster: String,
        /// What is insecure.
        what: &'static str,
    },
    /// kube could not turn the kubeconfig into a client (bad certificate data, bad URL, …).
    #[error("the kubeconfig cannot be used: {0}")]
    Client(String),
}

/// The largest kubeconfig kbind parses (a Secret holds at most 1 MiB anyway).
pub const MAX_KUBECONFIG_BYTES: usize = 1024 * 1024;

/// Whether a provider may be reached over insecure transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// Only TLS with verification (the default).
    #[default]
    Secure,
    /// The operator allowed `insecure-skip-tls-verify` and `http://` servers.
    AllowInsecure,
}

/// A validated, self-contained kubeconfig for the provider. Its `Debug` names the context,
/// server (without userinfo) and namespace only: credentials never reach a log.
#[derive(Clone)]
pub struct InlineKubeconfig {
    kubeconfig: Kubeconfig,
    context: String,
    server: String,
    namespace: Option<String>,
}

impl std::fmt::Debug for InlineKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineKubeconfig")
            .field("context", &self.context)
            .field("server", &crate::redact::strip_userinfo(&self.server))
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl InlineKubeconfig {
    /// Parses and validates kubeconfig bytes as read from a Secret.
    pub fn parse(data: &[u8]) -> Result<Self, KubeconfigError> {
        Self::parse_with(data, Transport::Secure)
    }

    /// [`InlineKubeconfig::parse`], allowing insecure transport only if `transport` says so.
    pub fn parse_with(data: &[u8], transport: Transport) -> Result<Self, KubeconfigError> {
        if data.len() > MAX_KUBECONFIG_BYTES {
            return Err(KubeconfigError::TooLarge(data.len()));
        }
        if data.iter().all(u8::is_ascii_whitespace) {
            return Err(KubeconfigError::Empty);
        }
        let text = std::str::from_utf8(data).map_err(|_| KubeconfigError::NotText)?;
        // serde_yaml's messages can quote the input; report only the location.
        let kubeconfig: Kubeconfig =
            serde_yaml::from_str(text).map_err(|e| KubeconfigError::NotKubeconfig {
                at: e
                    .location()
                    .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
                    .unwrap_or_default(),
            })?;

        let context_name = kubeconfig
            .current_context
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or(KubeconfigError::NoCurrentContext)?;
        let context = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.clone())
            .ok_or_else(|| KubeconfigError::Undefined {
                what: "context",
                name: context_name.clone(),
            })?;

        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .ok_or_else(|| KubeconfigError::Undefined {
                what: "cluster",
                name: context.cluster.clone(),
            })?;
        let server = check_cluster(cluster)?;
        if transport == Transport::Secure
            && let Some(what) = insecure(cluster, &server)
        {
            return Err(KubeconfigError::Insecure {
                cluster: cluster.name.clone(),
                what,
            });
        }

        if let Some(user) = context.user.as_deref().filter(|u| !u.is_empty()) {
            let auth = kubeconfig
                .auth_infos
                .iter()
                .find(|a| a.name == user)
                .ok_or_else(|| KubeconfigError::Undefined {
                    what: "user",
                    name: user.to_owned(),
                })?;
            check_user(auth)?;
        }

        Ok(Self {
            namespace: context.namespace.clone().filter(|n| !n.is_empty()),
            kubeconfig,
            context: context_name,
            server,
        })
    }

    /// The server URL of the current context.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The current context's default namespace, if it names one.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The current context's user, as the kubeconfig defines it.
    fn user(&self) -> Option<&kube::config::NamedAuthInfo> {
        let user = self
            .kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == self.context)?
            .context
            .as_ref()?
            .user
            .clone()?;
        self.kubeconfig.auth_infos.iter().find(|a| a.name == user)
    }

    /// The current context's bearer token, if its user has one inline.
    pub fn token(&self) -> Option<String> {
        use secrecy::ExposeSecret;
        let token = self.user()?.auth_info.as_ref()?.token.as_ref()?;
        Some(token.expose_secret().to_owned())
    }

    /// The kubeconfig as YAML with the current context's user's token replaced by `token` (a
    /// renewed credential); everything else as it was.
    pub fn with_token(&self, token: &str) -> Result<String, KubeconfigError> {
        let mut kubeconfig = self.kubeconfig.clone();
        let user = self.user().map(|u| u.name.clone()).unwrap_or_default();
        let auth = kubeconfig
            .auth_infos
            .iter_mut()
            .find(|a| a.name == user)
            .and_then(|a| a.auth_info.as_mut())
            .ok_or_else(|| KubeconfigError::Undefined {
                what: "user",
                name: user.clone(),
            })?;
        auth.token = Some(token.to_owned().into());
        serde_yaml::to_string(&kubeconfig)
            .map_err(|_| KubeconfigError::NotKubeconfig { at: String::new() })
    }

    /// A kube [`Config`] for the current context, with kbind's bounded timeouts (for a client
    /// built by [`crate::client::build_watching`], which bounds requests other than watches).
    pub async fn config(&self) -> Result<Config, KubeconfigError> {
        let options = KubeConfigOptions {
            context: Some(self.context.clone()),
            ..Default::default()
        };
        let mut config = Config::from_custom_kubeconfig(self.kubeconfig.clone(), &options)
            .await
            .map_err(|e| KubeconfigError::Client(crate::redact::remote(&e.to_string())))?;
        crate::client::bound_timeouts_watching(&mut config);
        Ok(config)
    }

    /// A client for the current context.
    pub async fn client(&self) -> Result<Client, KubeconfigError> {
        self.counted_client("", None).await
    }

    /// A client for the current context whose requests are counted in
    /// `kbind_api_requests_total` under `cluster`.
    pub async fn counted_client(
        &self,
        cluster: &str,
        counter: Option<&prometheus::IntCounterVec>,
    ) -> Result<Client, KubeconfigError> {
        crate::client::build_watching(self.config().await?, cluster, counter)
            .map_err(|e| KubeconfigError::Client(crate::redact::remote(&e.to_string())))
    }
}

/// What makes the transport to `cluster` insecure, if anything.
fn insecure(cluster: &NamedCluster, server: &str) -> Option<&'static str> {
    if cluster
        .cluster
        .as_ref()
        .and_then(|c| c.insecure_skip_tls_verify)
        == Some(true)
    {
        Some("insecure-skip-tls-verify: true")
    } else if server
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
    {
        Some("an http:// server")
    } else {
        None
    }
}

fn check_cluster(named: &NamedCluster) -> Result<String, KubeconfigError> {
    let name = &named.name;
    let Some(Cluster {
        server,
        certificate_authority,
        proxy_url,
        ..
    }) = &named.cluster
    else {
        return Err(KubeconfigError::NoServer(name.clone()));
    };
    if proxy_url.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err(KubeconfigError::Unsupported(format!(
            "clusters[{name}].cluster.proxy-url"
        )));
    }
    if certificate_authority
        .as_deref()
        .is_some_and(|p| !p.is_empty())
    {
        return Err(KubeconfigError::FileReference {
            field: format!("clusters[{name}].cluster.certificate-authority"),
            inline: "certificate-authority-data",
        });
    }
    server
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| KubeconfigError::NoServer(name.clone()))
}

fn check_user(named: &NamedAuthInfo) -> Result<(), KubeconfigError> {
    let name = &named.name;
    let Some(user) = &named.auth_info else {
        return Ok(());
    };
    let files = [
        (
            "client-certificate",
            &user.client_certificate,
            "client-certificate-data",
        ),
        ("client-key", &user.client_key, "client-key-data"),
        ("tokenFile", &user.token_file, "token"),
    ];
    for (field, value, inline) in files {
        if value.as_deref().is_some_and(|p| !p.is_empty()) {
            return Err(KubeconfigError::FileReference {
                field: format!("users[{name}].user.{field}"),
                inline,
            });
        }
    }
    if user.exec.is_some() {
        return Err(KubeconfigError::Plugin {
            field: format!("users[{name}].user.exec"),
        });
    }
    if user.auth_provider.is_some() {
        return Err(KubeconfigError::Plugin {
            field: format!("users[{name}].user.auth-provider"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "Y2VydA=="; // base64 of "cert": parsing never decodes it.

    fn kubeconfig(cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: provider\n\
             clusters:\n- name: p\n  cluster:\n    server: https://127.0.0.1:6443\n{cluster}\
             contexts:\n- name: provider\n  context:\n    cluster: p\n    user: u\n    namespace: team-a\n\
             users:\n- name: u\n  user:\n{user}"
        )
    }

    fn parse(text: &str) -> Result<InlineKubeconfig, KubeconfigError> {
        InlineKubeconfig::parse(text.as_bytes())
    }

    #[test]
    fn a_token_is_read_and_replaced_leaving_the_rest_as_it_was() {
        let kc = parse(&kubeconfig(
            &format!("    certificate-authority-data: {CA}\n"),
            "    token: old-token\n",
        ))
        .unwrap();
        assert_eq!(kc.token().as_deref(), Some("old-token"));
        let renewed = parse(&kc.with_token("new-token").unwrap()).unwrap();
        assert_eq!(renewed.token().as_deref(), Some("new-token"));
        assert_eq!(renewed.server(), kc.server());
        assert_eq!(renewed.namespace(), Some("team-a"));
        let no_token = parse(&kubeconfig(
            &format!("    certificate-authority-data: {CA}\n"),
            &format!("    client-certificate-data: {CA}\n    client-key-data: {CA}\n"),
        ))
        .unwrap();
        assert_eq!(no_token.token(), None);
    }

    #[test]
    fn inline_token_is_accepted() {
        let kc = parse(&kubeconfig(
            &format!("    certificate-authority-data: {CA}\n"),
            "    token: s3cr3t\n",
        ))
        .unwrap();
        assert_eq!(kc.server(), "https://127.0.0.1:6443");
        assert_eq!(kc.namespace(), Some("team-a"));
        let debug = format!("{kc:?}");
        assert!(
            !debug.contains("s3cr3t") && debug.contains("127.0.0.1"),
            "{debug}"
        );
    }

    #[test]
    fn inline_client_certificate_is_accepted() {
        let user = format!("    client-certificate-data: {CA}\n    client-key-data: {CA}\n");
        assert!(
            parse(&kubeconfig(
                &format!("    certificate-authority-data: {CA}\n"),
                &user
            ))
            .is_ok()
        );
    }

    #[test]
    fn file_references_are_rejected_naming_the_field() {
        let cases = [
            (
                kubeconfig("    certificate-authority: /etc/ca.crt\n", "    token: t\n"),
                "clusters[p].cluster.certificate-authority",
            ),
            (
                kubeconfig(
                    "",
                    "    client-certificate: /home/me/c.crt\n    client-key-data: a2V5\n",
                ),
                "users[u].user.client-certificate",
            ),
            (
                kubeconfig(
                    "",
                    "    client-certificate-data: Yw==\n    client-key: /k.pem\n",
                ),
                "users[u].user.client-key",
            ),
            (
                kubeconfig("", "    tokenFile: /var/run/token\n"),
                "users[u].user.tokenFile",
            ),
        ];
        for (text, field) in cases {
            let err = parse(&text).unwrap_err();
            assert!(
                matches!(&err, KubeconfigError::FileReference { field: f, .. } if f == field),
                "{err}"
            );
            assert!(err.to_string().contains(field));
        }
    }

    #[test]
    fn credential_plugins_are_rejected_naming_the_field() {
        let exec =
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n";
        let err = parse(&kubeconfig("", exec)).unwrap_err();
        assert!(err.to_string().contains("users[u].user.exec"), "{err}");

        let provider = "    auth-provider:\n      name: oidc\n      config: {}\n";
        let err = parse(&kubeconfig("", provider)).unwrap_err();
        assert!(
            err.to_string().contains("users[u].user.auth-provider"),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_rejected_without_quoting_it() {
        for garbage in [
            "this-is-a-secret-token",
            "[1, 2",
            "clusters: 7\ncurrent-context: x",
        ] {
            let err = parse(garbage).unwrap_err();
            assert!(
                matches!(err, KubeconfigError::NotKubeconfig { .. }),
                "{garbage}: {err}"
            );
            assert!(!err.to_string().contains("secret-token"), "{err}");
        }
        assert!(matches!(
            InlineKubeconfig::parse(&[0xff, 0xfe, 0x00]),
            Err(KubeconfigError::NotText)
        ));
    }

    #[test]
    fn empty_data_is_rejected() {
        assert!(matches!(parse(""), Err(KubeconfigError::Empty)));
        assert!(matches!(parse(" \n"), Err(KubeconfigError::Empty)));
    }

    #[test]
    fn missing_or_dangling_current_context_is_rejected() {
        let text = kubeconfig("", "    token: t\n");
        let none = text.replace("current-context: provider\n", "");
        assert!(matches!(
            parse(&none),
            Err(KubeconfigError::NoCurrentContext)
        ));
        let dangling = text.replace("current-context: provider", "current-context: elsewhere");
        let err = parse(&dangling).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the kubeconfig's context \"elsewhere\" is not defined"
        );
    }

    #[test]
    fn cluster_without_server_is_rejected() {
        let text = kubeconfig("", "    token: t\n").replace(
            "    server: https://127.0.0.1:6443\n",
            "    insecure-skip-tls-verify: true\n",
        );
        assert!(matches!(parse(&text), Err(KubeconfigError::NoServer(c)) if c == "p"));
    }

    #[test]
    fn insecure_transport_only_when_allowed() {
        let insecure = kubeconfig("    insecure-skip-tls-verify: true\n", "    token: t\n");
        let http = kubeconfig("", "    token: t\n").replace("https://", "http://");
        for text in [&insecure, &http] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains("--allow-insecure-providers"), "{err}");
            assert!(
                InlineKubeconfig::parse_with(text.as_bytes(), Transport::AllowInsecure).is_ok()
            );
        }
        let secure = kubeconfig(
            &format!("    certificate-authority-data: {CA}\n"),
            "    token: t\n",
        );
        assert!(parse(&secure).is_ok());
    }

    #[test]
    fn oversized_and_proxied_kubeconfigs_are_refused_by_name() {
        let big = format!(
            "{}\n{}",
            kubeconfig("", "    token: t\n"),
            "#".repeat(5 * 1024 * 1024)
        );
        assert!(matches!(parse(&big), Err(KubeconfigError::TooLarge(_))));
        let proxied = kubeconfig(
            "    proxy-url: http://user:hunter2@proxy:3128\n",
            "    token: t\n",
        );
        let err = parse(&proxied).unwrap_err().to_string();
        assert!(
            err.contains("clusters[p].cluster.proxy-url") && !err.contains("hunter2"),
            "{err}"
        );
    }
}
