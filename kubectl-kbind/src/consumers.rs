//! `kubectl kbind consumers --provider-kubeconfig <file>`: the provider's consumers as
//! `kbind-reaper` last saw them (each `ReaperPolicy`'s status: state, last renewal by the
//! provider's clock, objects per API), and every heartbeat Lease the credential may list with the
//! time the provider's API server recorded its last renewal. Read-only.

use kbind_provider::reaper::facts;
use kbind_shared::api::reaper::{ReaperPolicy, ReaperPolicyStatus};
use kbind_shared::keys;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::view;

/// What the provider shows.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Each policy's name and status.
    pub policies: Vec<(String, Option<ReaperPolicyStatus>)>,
    /// Why the policies could not be read (no reaper installed, or no permission).
    pub policies_unreadable: Option<String>,
    /// Heartbeat Leases: namespace/name, consumer UID, Connection, renewal (server time), and
    /// whether marked disconnected after it.
    pub leases: Vec<LeaseRow>,
    /// Why the Leases could not be listed.
    pub leases_unreadable: Option<String>,
}

/// One heartbeat Lease.
#[derive(Debug, Serialize)]
pub struct LeaseRow {
    pub lease: String,
    pub consumer: String,
    pub connection: Option<String>,
    pub renewed: Option<String>,
    pub left: bool,
}

/// Reads the provider's policies and heartbeat Leases.
pub async fn gather(provider: &Client) -> Result<Report, String> {
    let (policies, policies_unreadable) = match Api::<ReaperPolicy>::all(provider.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => (
            list.items
                .into_iter()
                .map(|p| (p.name_any(), p.status))
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(view::read_error("ReaperPolicies", &e))),
    };
    let selector = format!("{}={}", keys::MANAGED_LABEL, keys::TRUE);
    let (leases, leases_unreadable) =
        match Api::<k8s_openapi::api::coordination::v1::Lease>::all(provider.clone())
            .list(&ListParams::default().labels(&selector).limit(500))
            .await
        {
            Ok(list) => (
                list.items
                    .iter()
                    .filter_map(|lease| {
                        let seen =
                            facts::lease_seen(&lease.namespace().unwrap_or_default(), lease)?;
                        Some(LeaseRow {
                            renewed: facts::written_at(&lease.metadata, &["f:spec", "f:renewTime"])
                                .and_then(facts::time)
                                .map(|t| t.0.to_string()),
                            lease: seen.key,
                            consumer: seen.uid,
                            connection: seen.connection,
                            left: seen.left,
                        })
                    })
                    .collect(),
                None,
            ),
            Err(e) => (Vec::new(), Some(view::read_error("heartbeat Leases", &e))),
        };
    if policies_unreadable.is_some() && leases_unreadable.is_some() {
        return Err(format!(
            "cannot read the provider's consumers: {}; {}",
            policies_unreadable.unwrap_or_default(),
            leases_unreadable.unwrap_or_default()
        ));
    }
    Ok(Report {
        policies,
        policies_unreadable,
        leases,
        leases_unreadable,
    })
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for (name, status) in &report.policies {
        let Some(status) = status else {
            out.push_str(&format!(
                "ReaperPolicy {}: not swept yet\n\n",
                view::cell(name)
            ));
            continue;
        };
        let counts = &status.counts;
        out.push_str(&format!(
            "ReaperPolicy {} (last sweep {}): {} live, {} stale, {} reaping, {} reaped, {} without a Lease, {} left, {} unaccounted\n",
            view::cell(name),
            status
                .last_sweep
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_else(|| "-".into()),
            counts.live,
            counts.stale,
            counts.reaping,
            counts.reaped,
            counts.no_lease,
            counts.left,
            counts.unaccounted
        ));
        let rows: Vec<Vec<String>> = status
            .consumers
            .iter()
            .map(|c| {
                vec![
                    view::cell(&c.uid),
                    view::cell(&c.state),
                    view::cell(&c.connections.join(",")),
                    view::cell(&c.leases.join(",")),
                    c.last_renewal
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_else(|| "-".into()),
                    c.next_change
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_else(|| "-".into()),
                    view::cell(
                        &c.objects
                            .iter()
                            .map(|o| format!("{}={}", o.api, o.count))
                            .collect::<Vec<_>>()
                            .join(" "),
                    ),
                ]
            })
            .collect();
        out.push_str(&view::table(
            &[
                "CONSUMER",
                "STATE",
                "CONNECTIONS",
                "LEASE",
                "SEEN RENEWED",
                "NEXT CHANGE",
                "OBJECTS",
            ],
            &rows,
        ));
        out.push('\n');
    }
    if let Some(why) = &report.policies_unreadable {
        out.push_str(&format!(
            "No ReaperPolicy read ({}): is kbind-reaper installed?\n\n",
            view::line(why, 300)
        ));
    } else if report.policies.is_empty() {
        out.push_str(
            "No ReaperPolicy on this provider: nobody tells live consumers from dead ones.\n\n",
        );
    }
    match &report.leases_unreadable {
        Some(why) => out.push_str(&format!(
            "Heartbeat Leases not listed: {}\n",
            view::line(why, 300)
        )),
        None => {
            let rows: Vec<Vec<String>> = report
                .leases
                .iter()
                .map(|l| {
                    vec![
                        view::cell(&l.lease),
                        view::cell(&l.consumer),
                        view::cell(l.connection.as_deref().unwrap_or("-")),
                        l.renewed.clone().unwrap_or_else(|| "-".into()),
                        if l.left { "yes" } else { "" }.into(),
                    ]
                })
                .collect();
            out.push_str(
                "Heartbeat Leases (renewal times as the provider's API server stamped them; whoever may write a Lease can clear them — the reaper goes by what it saw change):\n",
            );
            out.push_str(&view::table(
                &["LEASE", "CONSUMER", "CONNECTION", "RENEWED", "LEFT"],
                &rows,
            ));
        }
    }
    out
}
