//! `kubectl-kbind`, the kubectl plugin (`kubectl kbind …`): the operator's view of kbind from the
//! consumer cluster.
//!
//! - `status`: Connections, bindings, bound APIs with per-API object counts, conflicts and delivery
//!   lag, on one screen (`-o json` for scripts);
//! - `plan <file>`: what applying a Connection/binding file would do — CRDs created or changed
//!   (breaking or not), consumer objects that would start syncing, conflicts waiting on the
//!   provider — computed with the schema manager's own decisions and only reads on both clusters;
//! - `doctor <connection>`: the provider credential checked against everything kbind needs, per
//!   verb and resource, and what is missing as RBAC ready to apply;
//! - `diff <kind>/<name>`: one synced object against its provider copy — a unified diff of the
//!   fields kbind syncs, who owns which field on each side, delivery, the last refusal;
//! - `grant <export> --consumer <identity>` (run against a **provider**): records a Grant, waits for
//!   kbind-issuer to provision it, and prints the one-apply bundle (Secret, Connection, binding);
//! - `catalog --gateway <url>`: what a provider's gateway offers (Exports, their APIs and docs;
//!   Collections);
//! - `login --gateway <url>`: logs the command line in through the gateway's OpenID Connect
//!   login (the browser, or a code to paste);
//! - `bind <export> --gateway <url>`: binds the Export through the provider's gateway and applies
//!   the bundle to this consumer, waiting until its Connection and binding are Ready and its APIs
//!   served (`-o yaml`: prints the bundle, writes nothing);
//! - `consumers --provider-kubeconfig <file>`: on a provider, its consumers as `kbind-reaper`
//!   sees them and every heartbeat Lease with its server-recorded renewal;
//! - `rehome plan|apply --connection <c> --from <uid>`: after a restore, claiming the provider
//!   copies a previous identity of this consumer left, once it is gone;
//! - `migrate plan|apply`: replacing a running Go konnector — what kbind will do differently, the
//!   steps in order, and (apply) the kbind-side steps carried out.
//!
//! kubectl runs it with the user's environment, so it talks to the cluster `KUBECONFIG` (or
//! `--kubeconfig`, `--context`) names: the consumer. Everything read from a cluster is printed
//! through [`view::cell`] (control characters removed, length bounded).
#![forbid(unsafe_code)]

mod bind;
mod consumers;
mod diff;
mod doctor;
mod gateway;
mod handover;
mod login;
mod migrate;
mod plan;
mod rehome;
mod rehome_related;
mod rollback;
mod status;
mod view;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// `kubectl kbind`: kbind's view from the consumer cluster.
#[derive(Debug, Parser)]
#[command(name = "kubectl kbind", version)]
struct Args {
    /// The consumer's kubeconfig (default: `KUBECONFIG`, then `~/.kube/config`, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Accept provider kubeconfigs with `insecure-skip-tls-verify` or an `http://` server (as the
    /// programs' `--allow-insecure-providers`).
    #[arg(long, global = true)]
    allow_insecure_providers: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Tables for a terminal.
    Text,
    /// One JSON document.
    Json,
    /// YAML (`bind`: the bundle, applied nowhere).
    Yaml,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Connections, bindings and bound APIs: object counts, delivery, conflicts, lag. Exits 1 when
    /// the provider rejected or forbade objects (a script's check), unless told not to.
    Status {
        /// Exit 0 even when objects were rejected or forbidden.
        #[arg(long)]
        ignore_refused: bool,
    },
    /// A dry run of applying a file of Connections, ClusterBindings and Bindings: changes nothing.
    Plan {
        /// The YAML or JSON file (several documents allowed; `-` reads standard input).
        file: PathBuf,
    },
    /// Checks a Connection's provider credential against everything kbind needs.
    Doctor {
        /// The Connection's name.
        connection: String,
    },
    /// One synced object against its provider copy: a unified diff of the fields kbind syncs
    /// (`-` the provider's, `+` what kbind would write), the field owners on both sides, the
    /// delivered generation, the last refusal. Exits 1 when they differ. Changes nothing.
    Diff {
        /// `<kind>/<name>`: the kind as its plural, singular, kind or short name, optionally
        /// with `.<group>`.
        target: String,
        /// The object's namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Replacing a running Go konnector: `plan` (read-only) lists what kbind will do differently
    /// and the steps in order; `apply` scales the Go Deployments to 0, waits for their pods, and
    /// keeps the core CRDs for kbind's Helm release.
    Migrate {
        #[command(subcommand)]
        action: MigrateAction,
        /// kbind's Helm release (that will adopt the core CRDs).
        #[arg(long, default_value = "kbind", global = true)]
        release: String,
        /// Its namespace.
        #[arg(long, default_value = "kbind-system", global = true)]
        release_namespace: String,
    },
    /// After a restore or rebuild (a new consumer cluster UID): claims the provider copies a
    /// previous identity of this consumer left, once that identity is gone. `plan` only reads.
    Rehome {
        #[command(subcommand)]
        action: RehomeAction,
        /// The Connection whose provider holds the copies.
        #[arg(long, global = true, default_value = "")]
        connection: String,
        /// The previous consumer cluster UID (the copies' `core.kbind.io/consumer-cluster-uid`).
        #[arg(long, global = true, default_value = "")]
        from: String,
    },
    /// On a PROVIDER (the kubeconfig's cluster): grants a consumer an Export — records the Grant,
    /// waits until kbind-issuer has provisioned its boundary and credential, and prints the bundle
    /// to apply on the consumer (Secret, Connection, ClusterBinding or Binding). Writes nothing on
    /// the consumer.
    Grant {
        /// The Export.
        export: String,
        /// The consumer's identity (the same identity, cluster and Export always get the same
        /// Grant and boundary).
        #[arg(long)]
        consumer: String,
        /// Which of the consumer's clusters, when it has several.
        #[arg(long)]
        cluster_name: Option<String>,
        /// A Binding in this consumer namespace instead of a ClusterBinding.
        #[arg(short, long)]
        namespace: Option<String>,
        /// The Connection's name on the consumer (default: the Export's).
        #[arg(long)]
        connection: Option<String>,
        /// Where on the consumer the kubeconfig Secret goes.
        #[arg(long, default_value = kbind_shared::keys::DEFAULT_NAMESPACE)]
        secret_namespace: String,
        /// A token that never expires (air-gapped GitOps): it ends only when the Grant is
        /// revoked or deleted.
        #[arg(long)]
        long_lived: bool,
        /// A short-lived token's lifetime in seconds (600 to 86400).
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(i64).range(600..=86400))]
        expiration_seconds: i64,
        /// The provider's address as consumers reach it (default: the kubeconfig's).
        #[arg(long)]
        server: Option<String>,
    },
    /// Logs in to a provider's gateway with its OpenID Connect login: your browser logs in, and
    /// the session is handed to this command (kept for `catalog` and `bind`).
    Login {
        #[command(flatten)]
        gateway: GatewayArgs,
        /// No browser beside this command: print the URL, and read the code the page shows.
        #[arg(long)]
        paste: bool,
        /// Do not try to open the browser (print the URL only).
        #[arg(long)]
        no_open: bool,
    },
    /// What a provider's gateway offers: its Exports (their APIs and docs) and Collections.
    Catalog {
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Binds an Export of a provider through its gateway and applies the bundle to this consumer
    /// (the kubeconfig's cluster): waits until the Connection and the binding are Ready and the
    /// APIs served. `-o yaml` prints the bundle instead and writes nothing.
    Bind {
        /// The Export (see `kubectl kbind catalog`).
        export: String,
        #[command(flatten)]
        gateway: GatewayArgs,
        /// Which of your clusters this is, when you bind from several (each gets its own Grant).
        #[arg(long)]
        cluster_name: Option<String>,
        /// A Binding in this namespace instead of a ClusterBinding.
        #[arg(short, long)]
        namespace: Option<String>,
        /// The Connection's name (default: the Export's).
        #[arg(long)]
        connection: Option<String>,
        /// Where the kubeconfig Secret goes (default: kbind).
        #[arg(long)]
        secret_namespace: Option<String>,
        /// How long to wait for Ready.
        #[arg(long, default_value = "3m", value_parser = kbind_shared::cli::parse_duration)]
        timeout: std::time::Duration,
    },
    /// On a provider: its consumers as kbind-reaper last saw them (state, last renewal by the
    /// provider's clock, objects per API), and every heartbeat Lease. Changes nothing.
    Consumers {
        /// The provider's kubeconfig (this command reads the provider, not the consumer).
        #[arg(long)]
        provider_kubeconfig: PathBuf,
    },
}

/// Where the gateway is and who calls it.
#[derive(Debug, clap::Args)]
struct GatewayArgs {
    /// The provider's gateway (`https://…`).
    #[arg(long, env = "KBIND_GATEWAY")]
    gateway: String,
    /// A CA certificate (PEM) to trust for the gateway besides the system's.
    #[arg(long)]
    gateway_ca_file: Option<PathBuf>,
    /// A file holding your token for the provider (its first line); default: the environment's
    /// `KBIND_GATEWAY_TOKEN`, else the session `kubectl kbind login` kept. Never given on the
    /// command line, where other users' `ps` sees it.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl GatewayArgs {
    fn client(&self, with_credential: bool) -> Result<gateway::Gateway, String> {
        let credential = if with_credential {
            let credential = match gateway::token(self.token_file.as_deref())? {
                Some(token) => gateway::Credential::Bearer(token),
                None => {
                    let kept = login::session_for(&self.gateway).ok_or(
                        "a token is required: --token-file <file>, KBIND_GATEWAY_TOKEN, or kubectl kbind login --gateway <url> first",
                    )?;
                    gateway::Credential::Session {
                        session: kept.session,
                        csrf: kept.csrf_token,
                    }
                }
            };
            Some(credential)
        } else {
            None
        };
        gateway::Gateway::new(&self.gateway, self.gateway_ca_file.as_deref(), credential)
    }
}

#[derive(Debug, Subcommand)]
enum RehomeAction {
    /// What re-homing would claim, and whether the previous identity is gone. Changes nothing.
    Plan,
    /// Claims the previous identity's copies: one write each.
    Apply,
}

#[derive(Debug, Subcommand)]
enum MigrateAction {
    /// What the migration involves on this cluster. Changes nothing.
    Plan,
    /// Carries out the kbind-side steps.
    Apply {
        /// Also record kbind as the creator of the CRDs the Go konnector pulled (kbind then
        /// deletes them when their last binding goes, as it does CRDs it created).
        #[arg(long)]
        stamp_created_by: bool,
        /// How long the Go konnector's field manager must have written nothing on either cluster
        /// (after the Go konnectors found here are stopped) before the core CRDs are handed over:
        /// longer than its 30 s renewal, so that one running elsewhere is seen.
        #[arg(long, default_value = handover::DEFAULT_QUIET, value_parser = kbind_shared::cli::parse_duration)]
        quiet_for: std::time::Duration,
    },
    /// Handing this consumer back to the Go konnector: what loses its fence, and (apply) kbind
    /// stopped, stranded route finalizers stripped, the Go konnector started.
    Rollback {
        #[command(subcommand)]
        action: RollbackAction,
    },
}

#[derive(Debug, Subcommand)]
enum RollbackAction {
    /// What the Go konnector would do that kbind's fences stop, and the steps. Changes nothing.
    Plan,
    /// Carries out the steps; refused while objects are routed.
    Apply,
}

/// How a command ended: its report was printed and it found nothing wrong (0), or something the
/// user must act on (1). A command that could not run exits 2 with the reason on stderr.
enum Verdict {
    Fine,
    Attention,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(Verdict::Fine) => ExitCode::SUCCESS,
        Ok(Verdict::Attention) => ExitCode::from(1),
        Err(message) => {
            eprintln!("error: {}", view::line(&message, 2000));
            ExitCode::from(2)
        }
    }
}

async fn run(args: &Args) -> Result<Verdict, String> {
    let json = args.output == Output::Json;
    if let Command::Consumers {
        provider_kubeconfig,
    } = &args.command
    {
        let provider = view::consumer_client(Some(provider_kubeconfig), args.context.as_deref())
            .await
            .map_err(|e| format!("cannot reach the provider cluster: {e}"))?;
        let report = consumers::gather(&provider).await?;
        view::print(json, &report, consumers::render)?;
        return Ok(Verdict::Fine);
    }
    if let Command::Login {
        gateway,
        paste,
        no_open,
    } = &args.command
    {
        let client = gateway.client(false)?;
        let (username, kept) = login::login(&client, *paste, !no_open).await?;
        println!(
            "logged in to {} as {username} (session kept in {})",
            client.url(),
            kept.display()
        );
        return Ok(Verdict::Fine);
    }
    if let Command::Catalog { gateway } = &args.command {
        let answer = gateway
            .client(false)?
            .call("GET", "/api/catalog", "application/json", None)
            .await?;
        if answer.code != 200 {
            return Err(gateway::refused(&answer));
        }
        let catalog: serde_json::Value = serde_json::from_str(&answer.body)
            .map_err(|e| format!("the gateway's catalog is not JSON: {e}"))?;
        match args.output {
            Output::Json => println!("{catalog:#}"),
            Output::Yaml => print!(
                "{}",
                serde_yaml::to_string(&catalog).map_err(|e| e.to_string())?
            ),
            Output::Text => print!("{}", gateway::render_catalog(&catalog)),
        }
        return Ok(Verdict::Fine);
    }
    if let Command::Bind {
        export,
        gateway,
        cluster_name,
        namespace,
        connection,
        secret_namespace,
        timeout,
    } = &args.command
    {
        let ask = bind::Ask {
            export: export.clone(),
            cluster_name: cluster_name.clone(),
            namespace: namespace.clone(),
            connection: connection.clone(),
            secret_namespace: secret_namespace.clone(),
        };
        if args.output == Output::Json {
            return Err("bind prints its bundle as YAML (-o yaml) or applies it".into());
        }
        // Reach the consumer before anything is bound: a bundle fetched for nothing is a pickup
        // spent.
        let consumer = if args.output == Output::Yaml {
            None
        } else {
            Some(
                view::consumer_client(args.kubeconfig.as_deref(), args.context.as_deref())
                    .await
                    .map_err(|e| format!("cannot reach the consumer cluster: {e}"))?,
            )
        };
        let client = gateway.client(true)?;
        let bundle = bind::fetch(&client, &ask).await?;
        let documents = bind::documents(&bundle)?;
        let Some(consumer) = consumer else {
            print!("{bundle}");
            return Ok(Verdict::Fine);
        };
        eprintln!("bound {export}: applying its bundle to this cluster");
        let (connection, binding_namespace, binding) = bind::apply(&consumer, &documents).await?;
        let apis: Vec<String> = documents[2]["spec"]["apis"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["name"].as_str().map(str::to_owned))
            .collect();
        bind::wait(
            &consumer,
            &connection,
            (binding_namespace.as_deref(), &binding),
            &apis,
            *timeout,
        )
        .await?;
        println!(
            "bound {export}: Connection {connection} Ready, serving {}",
            apis.join(", ")
        );
        return Ok(Verdict::Fine);
    }
    if args.output == Output::Yaml {
        return Err("-o yaml is for catalog and bind; this command prints text or JSON".into());
    }
    if let Command::Grant {
        export,
        consumer,
        cluster_name,
        namespace,
        connection,
        secret_namespace,
        long_lived,
        expiration_seconds,
        server,
    } = &args.command
    {
        let config = view::config(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
        let provider = kube::Client::try_from(config.clone())
            .map_err(|e| format!("cannot reach the provider cluster: {e}"))?;
        let request = kbind_provider::bundle::Request {
            export: export.clone(),
            identity: consumer.clone(),
            cluster_name: cluster_name.clone(),
            namespace: namespace.clone(),
            connection: connection.clone(),
            secret_namespace: secret_namespace.clone(),
            long_lived: *long_lived,
            expiration_seconds: *expiration_seconds,
            server: server.clone(),
        };
        let (bundle, note) =
            kbind_provider::bundle::run(&provider, &config, &request, "kubectl-kbind")
                .await
                .map_err(|e| e.to_string())?;
        if let Some(note) = note {
            eprintln!("{note}");
        }
        print!("{bundle}");
        return Ok(Verdict::Fine);
    }
    let consumer = view::consumer_client(args.kubeconfig.as_deref(), args.context.as_deref())
        .await
        .map_err(|e| format!("cannot reach the consumer cluster: {e}"))?;
    let transport = if args.allow_insecure_providers {
        kbind_shared::kubeconfig::Transport::AllowInsecure
    } else {
        kbind_shared::kubeconfig::Transport::Secure
    };
    match &args.command {
        Command::Status { ignore_refused } => {
            let report = status::gather(&consumer).await?;
            view::print(json, &report, status::render)?;
            Ok(if report.refused() > 0 && !ignore_refused {
                Verdict::Attention
            } else {
                Verdict::Fine
            })
        }
        Command::Plan { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .map_err(|e| format!("read standard input: {e}"))?
            } else {
                std::fs::read_to_string(file)
                    .map_err(|e| format!("read {}: {e}", file.display()))?
            };
            let documents = plan::parse(&text)?;
            let report = plan::gather(&consumer, documents, transport).await?;
            view::print(json, &report, plan::render)?;
            Ok(if report.blocked() {
                Verdict::Attention
            } else {
                Verdict::Fine
            })
        }
        Command::Doctor { connection } => {
            let report = doctor::gather(&consumer, connection, transport).await?;
            view::print(json, &report, doctor::render)?;
            Ok(if report.healthy() {
                Verdict::Fine
            } else {
                Verdict::Attention
            })
        }
        Command::Diff { target, namespace } => {
            let report = diff::gather(&consumer, target, namespace.as_deref(), transport).await?;
            view::print(json, &report, diff::render)?;
            Ok(if report.differs() {
                Verdict::Attention
            } else {
                Verdict::Fine
            })
        }
        Command::Migrate {
            action,
            release,
            release_namespace,
        } => {
            let release = migrate::Release {
                name: release.clone(),
                namespace: release_namespace.clone(),
            };
            let report = match action {
                MigrateAction::Rollback { action } => {
                    let report = match action {
                        RollbackAction::Plan => rollback::gather(&consumer).await?,
                        RollbackAction::Apply => rollback::apply(&consumer).await?,
                    };
                    view::print(json, &report, rollback::render)?;
                    return Ok(if report.routed.is_empty() {
                        Verdict::Fine
                    } else {
                        Verdict::Attention
                    });
                }
                MigrateAction::Plan => migrate::gather(&consumer, &release, transport).await?,
                MigrateAction::Apply {
                    stamp_created_by,
                    quiet_for,
                } => {
                    let options = migrate::ApplyOptions {
                        stamp_created_by: *stamp_created_by,
                        quiet_for: *quiet_for,
                        transport,
                    };
                    migrate::apply(&consumer, &release, &options).await?
                }
            };
            view::print(json, &report, migrate::render)?;
            Ok(Verdict::Fine)
        }
        Command::Rehome {
            action,
            connection,
            from,
        } => {
            if connection.is_empty() || from.is_empty() {
                return Err(
                    "rehome needs --connection <name> and --from <previous consumer cluster UID>"
                        .into(),
                );
            }
            let apply = matches!(action, RehomeAction::Apply);
            let report = rehome::run(&consumer, connection, from, transport, apply).await?;
            view::print(json, &report, rehome::render)?;
            Ok(if report.refused.is_some() {
                Verdict::Attention
            } else {
                Verdict::Fine
            })
        }
        Command::Consumers { .. }
        | Command::Grant { .. }
        | Command::Catalog { .. }
        | Command::Login { .. }
        | Command::Bind { .. } => Ok(Verdict::Fine),
    }
}
