//! The provider's front door, part 2 (#52): consumers bind from the catalog through
//! `kbind-gateway` — two real replicas serving TLS on a real provider with kbind-issuer, each with
//! the chart's ServiceAccount, RBAC and admission fence; callers are real ServiceAccounts and a
//! user token the provider's API server authenticates; the bundle is applied to a real consumer
//! running kbind, whose Connection becomes Ready and syncs.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kbind_e2e::TestEnv;
use kbind_e2e::cluster::{User, client_for, ensure_namespace};
use kbind_e2e::fixtures::*;
use kbind_e2e::wait::wait_for;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// The right to bind the Export `export`: the verb `bind` on it, by name.
fn may_bind(export: &str) -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec!["catalog.kbind.io".into()]),
        resources: Some(vec!["exports".into()]),
        verbs: vec!["bind".into()],
        resource_names: Some(vec![export.into()]),
        ..Default::default()
    }]
}

/// A provider with kbind-issuer and the gateway's RBAC, Widgets exported (the Export `widgets`,
/// offered) and the Export `gadgets` naming an API the provider does not serve (not offered);
/// the gateway's account.
async fn provider_with_gateway(env: &mut TestEnv) -> (Client, User) {
    let provider = env.cluster("provider").admin_client().await.unwrap();
    install_issuer_chart(&provider).await;
    install_gateway_rbac(&provider).await;
    install_crd(&provider, &widget_crd()).await.unwrap();
    start_issuer(env).await;
    apply_export(&provider, "widgets", &["widgets.example.org"], false).await;
    apply_export(&provider, "gadgets", &["gadgets.example.org"], false).await;
    wait_export_offered(&provider, "widgets").await;
    let account = env
        .cluster("provider")
        .mint_service_account_user(ISSUER_NAMESPACE, GATEWAY_SERVICE_ACCOUNT)
        .await
        .unwrap();
    (provider, account)
}

/// The consumer cluster with kbind's CRDs, its namespaces (and `namespaces`) and kbind running:
/// its schema manager and syncer, both ready.
async fn consumer_running_kbind(env: &mut TestEnv, namespaces: &[&str]) -> Client {
    let consumer = env.cluster("consumer").admin_client().await.unwrap();
    kbind_e2e::kbind::install_crds(&consumer).await.unwrap();
    for namespace in [KBIND_NAMESPACE, SECRET_NAMESPACE].iter().chain(namespaces) {
        ensure_namespace(&consumer, namespace).await.unwrap();
    }
    let manager = Component::SchemaManager
        .start(env, "consumer", "schema-manager", &["--leader-elect=false"])
        .await
        .unwrap();
    let syncer = Component::Syncer
        .start(env, "consumer", "syncer", &[])
        .await
        .unwrap();
    manager.wait_ready("the schema manager", 60).await;
    syncer.wait_ready("the syncer", 60).await;
    consumer
}

/// One address in front of the gateway's replicas, as a Service is, where a real OpenID
/// provider returns browsers: its user alice (password wonderland), whom RBAC lets bind Widgets.
struct Front {
    forward: kbind_e2e::forward::Forward,
    /// `127.0.0.1:<port>`.
    address: String,
    /// `https://<address>`: the gateway's external URL.
    external: String,
    idp: OidcProvider,
}

impl Front {
    async fn with_login(env: &mut TestEnv) -> Self {
        let forward = kbind_e2e::forward::Forward::start(1).await.unwrap();
        let address = format!("127.0.0.1:{}", forward.port());
        let external = format!("https://{address}");
        let idp = start_oidc_provider(
            env,
            &[("alice", "alice@example.org", "wonderland")],
            &format!("{external}/callback"),
        )
        .await;
        env.cluster("provider")
            .grant_user(
                "oidc:alice@example.org",
                "alice-binds-widgets",
                may_bind("widgets"),
            )
            .await
            .unwrap();
        Self {
            forward,
            address,
            external,
            idp,
        }
    }

    /// The flags a replica logs browsers in with.
    fn flags(&self) -> Vec<String> {
        vec![
            format!("--oidc-issuer={}", self.idp.issuer),
            "--oidc-client-id=web".to_owned(),
            format!("--oidc-client-secret-file={}", self.idp.secret_file),
            format!("--external-url={}", self.external),
        ]
    }

    /// A browser opening `url` (a login's start, on the front) and logging in at the provider:
    /// its cookies, and the gateway's answer to the provider's callback.
    async fn browser_login(&self, ca: &str, url: &str) -> (Jar, Answer) {
        let mut browser = Jar::default();
        let started = https(&self.address, ca, "GET", &path_of(url), &[], b"")
            .await
            .unwrap();
        assert_eq!(started.code, 302, "{started:?}");
        browser.absorb(&started);
        let callback = log_in_at_the_provider(&self.idp, started.header("location").unwrap()).await;
        let jar = browser.header();
        let answer = https(
            &self.address,
            ca,
            "GET",
            &path_of(&callback),
            &[("Cookie", &jar)],
            b"",
        )
        .await
        .unwrap();
        browser.absorb(&answer);
        (browser, answer)
    }

    /// Sends what reaches the front to `gateway`.
    fn route_to(&self, gateway: &Gateway) {
        self.forward
            .switch(gateway.address.rsplit_once(':').unwrap().1.parse().unwrap());
    }
}

/// User `alice` on the provider, allowed to bind the Export `widgets`.
async fn alice_may_bind_widgets(env: &TestEnv) -> User {
    let cluster = env.cluster("provider");
    let alice = cluster.mint_user("alice").await.unwrap();
    cluster
        .grant(&alice, "alice-binds-widgets", may_bind("widgets"))
        .await
        .unwrap();
    alice
}

/// `POST /api/bind` of `body` as `token` (none: anonymous).
async fn bind(gateway: &Gateway, ca: &str, token: Option<&str>, body: &str) -> Answer {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &authorization {
        headers.push(("Authorization", a.as_str()));
    }
    https(
        &gateway.address,
        ca,
        "POST",
        "/api/bind",
        &headers,
        body.as_bytes(),
    )
    .await
    .unwrap()
}

/// `GET <path>` with `accept`.
async fn get(gateway: &Gateway, ca: &str, path: &str, accept: Option<&str>) -> Answer {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    https(&gateway.address, ca, "GET", path, &headers, b"")
        .await
        .unwrap()
}

/// The secrets no log of the run may hold: every `*.log` kbind's processes wrote (the API
/// servers' audit logs aside, which record what the API servers were sent, and the test's
/// OpenID provider's).
fn assert_no_log_holds(env: &TestEnv, secrets: &[(&str, &str)]) {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(env.dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log")
            && path.file_name().is_some_and(|n| n != "oidc.log")
        {
            logs.push(path);
        }
    }
    assert!(
        logs.iter().any(|l| l.to_string_lossy().contains("gateway")),
        "the gateways' logs are among {logs:?}"
    );
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for (what, secret) in secrets {
            assert!(!secret.is_empty());
            assert!(!text.contains(secret), "{} holds {what}", log.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_binds_from_the_catalog_and_any_replica_hands_its_bundle_over_once() {
    let mut env = TestEnv::start("gateway-bind", &["provider", "consumer"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let controller = run_provider_widget_controller(provider.clone());
    let consumer = consumer_running_kbind(&mut env, &["team-a"]).await;
    let (cert, key, ca) = gateway_certificate(&env);
    let a = start_gateway(&mut env, "gateway-a", &account, (&cert, &key), &[]).await;
    let b = start_gateway(&mut env, "gateway-b", &account, (&cert, &key), &[]).await;

    // Who the provider is, and what it offers: the offered Export with its APIs; not the one
    // naming an API nobody serves.
    let about = get(&a, &ca, "/api/provider", None).await;
    assert_eq!(about.code, 200, "{about:?}");
    assert_eq!(about.json()["name"], "e2e-provider");
    let catalog = get(&b, &ca, "/api/catalog", None).await;
    assert_eq!(catalog.code, 200, "{catalog:?}");
    let catalog = catalog.json();
    let names: Vec<&str> = catalog["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["widgets"], "{catalog:#}");
    assert_eq!(
        catalog["exports"][0]["apis"][0],
        json!({ "name": "widgets.example.org", "scope": "Namespaced" })
    );

    // A team's ServiceAccount allowed to bind Widgets binds on replica A…
    let alice = alice_may_bind_widgets(&env).await;
    let bound = bind(&a, &ca, Some(&alice.token), r#"{"export":"widgets"}"#).await;
    assert_eq!(bound.code, 201, "{bound:?}");
    assert_eq!(bound.header("cache-control"), Some("no-store"));
    let pickup = bound.json()["pickup"].as_str().unwrap().to_owned();
    let token = pickup.trim_start_matches("/api/pickup/").to_owned();
    let boundary = kbind_provider::issuer::rbac::boundary(&alice.username, None, "widgets");
    assert_eq!(bound.json()["boundary"], boundary.as_str());
    // …the Grant is the caller's, as the API server named it.
    let grant = Api::<kbind_shared::api::iam::Grant>::all(provider.clone())
        .get(&boundary)
        .await
        .unwrap();
    assert_eq!(grant.spec.consumer.identity, alice.username);

    // Replica A goes away; B hands the bundle over, once.
    env.process(a.index).kill();
    let taken = get(&b, &ca, &pickup, Some("application/json")).await;
    assert_eq!(taken.code, 200, "{taken:?}");
    assert_eq!(taken.header("content-type"), Some("application/json"));
    assert_eq!(taken.header("cache-control"), Some("no-store"));
    let list = taken.json();
    assert_eq!(list["kind"], "List");
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["Secret", "Connection", "ClusterBinding"]);
    assert_eq!(list["items"][1]["spec"]["boundary"], boundary.as_str());
    let again = get(&b, &ca, &pickup, None).await;
    assert_eq!(again.code, 404, "{again:?}");
    assert_eq!(again.body.lines().count(), 1, "{again:?}");
    // Nothing of the pickup is left in the provider's store.
    let records = Api::<Secret>::namespaced(provider.clone(), ISSUER_NAMESPACE)
        .list(&kube::api::ListParams::default().labels("gateway.kbind.io/record=pickup"))
        .await
        .unwrap();
    assert!(records.items.is_empty(), "{:?}", records.items);

    // The consumer applies the bundle as it came: its Connection becomes Ready, its binding
    // serves Widgets, and a Widget syncs into the boundary with its status back.
    let yaml: String = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect();
    let credential = list["items"][0]["stringData"]["kubeconfig"]
        .as_str()
        .unwrap()
        .to_owned();
    let credential_token = serde_yaml::from_str::<Value>(&credential).unwrap()["users"][0]["user"]
        ["token"]
        .as_str()
        .unwrap()
        .to_owned();
    apply_manifest(&consumer, &yaml).await.unwrap();
    wait_cluster_binding_ready(&consumer, "widgets").await;
    widgets(&consumer, "team-a")
        .create(&PostParams::default(), &widget("w", 3))
        .await
        .unwrap();
    let copies = widgets(&provider, &format!("{boundary}-team-a"));
    wait_for("the Widget's copy in the boundary", 30, || async {
        Ok((size_of(&copies, "w").await == Some(3)).then_some(()))
    })
    .await;
    let mine = widgets(&consumer, "team-a");
    wait_for("the Widget's status back", 30, || async {
        let w = mine.get("w").await.map_err(|e| e.to_string())?;
        Ok((w.data["status"]["observedSize"] == 3).then_some(()))
    })
    .await;

    // The metrics say what B answered: one bundle handed over, one reuse refused.
    let metrics = kbind_e2e::kbind::http_get(&b.metrics, "/metrics")
        .await
        .unwrap()
        .1;
    for (endpoint, code, count) in [
        ("pickup", "200", 1.0),
        ("pickup", "404", 1.0),
        ("catalog", "200", 1.0),
    ] {
        assert_eq!(
            metric_sum(
                &metrics,
                "kbind_gateway_requests_total",
                &[("endpoint", endpoint), ("code", code)]
            ),
            count,
            "{endpoint} {code}: {metrics}"
        );
    }
    // No token, pickup or credential in any log of the run.
    assert_no_log_holds(
        &env,
        &[
            ("alice's token", &alice.token),
            ("the pickup token", &token),
            ("the bundle's credential", &credential_token),
        ],
    );
    controller.abort();
}

/// Two replicas whose hosts' clocks are six hours apart, each the other way from the API
/// server's: a pickup lasts its lifetime by the API server's clock on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_its_clock_off_judges_a_pickups_lifetime_by_the_api_servers_clock() {
    let mut env = TestEnv::start("gateway-clock", &["provider"])
        .await
        .unwrap();
    let (_provider, account) = provider_with_gateway(&mut env).await;
    let (cert, key, ca) = gateway_certificate(&env);
    let mut replicas = Vec::new();
    for (name, offset) in [("gateway-ahead", "+6h"), ("gateway-behind", "-6h")] {
        let clock = format!("--host-clock-offset={offset}");
        let args = ["--pickup-seconds=4", clock.as_str()];
        replicas.push(start_gateway(&mut env, name, &account, (&cert, &key), &args).await);
    }
    let (ahead, behind) = (&replicas[0], &replicas[1]);
    let alice = alice_may_bind_widgets(&env).await;
    let widgets = r#"{"export":"widgets"}"#;

    // Made on the replica behind, taken at once on the one ahead (by its own clock the pickup
    // ended six hours ago): handed over.
    let bound = bind(behind, &ca, Some(&alice.token), widgets).await;
    assert_eq!(bound.code, 201, "{bound:?}");
    // The answer's expiry is the API server's (this machine's) time plus the lifetime.
    let expires: jiff::Timestamp = bound.json()["expiresAt"].as_str().unwrap().parse().unwrap();
    let expected = jiff::Timestamp::now() + Duration::from_secs(4);
    let off = expires.duration_since(expected).abs();
    assert!(
        off < jiff::SignedDuration::from_secs(3),
        "{expires} vs {expected}"
    );
    let pickup = bound.json()["pickup"].as_str().unwrap().to_owned();
    let taken = get(ahead, &ca, &pickup, None).await;
    assert_eq!(taken.code, 200, "{taken:?}");

    // Made on the replica ahead, taken on the one behind after its lifetime (by its own clock
    // the pickup has six hours to go): expired.
    let bound = bind(ahead, &ca, Some(&alice.token), widgets).await;
    assert_eq!(bound.code, 201, "{bound:?}");
    let pickup = bound.json()["pickup"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let late = get(behind, &ca, &pickup, None).await;
    assert_eq!(late.code, 410, "{late:?}");
    assert!(late.body.contains("expired"), "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_and_bad_requests_get_one_line_and_no_bundle() {
    let mut env = TestEnv::start("gateway-hostile", &["provider"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let (cert, key, ca) = gateway_certificate(&env);
    let short = start_gateway(
        &mut env,
        "gateway-short",
        &account,
        (&cert, &key),
        &["--pickup-seconds=2"],
    )
    .await;
    let strict = start_gateway(
        &mut env,
        "gateway-strict",
        &account,
        (&cert, &key),
        &["--binds-per-minute=7"],
    )
    .await;
    let cluster = env.cluster("provider");
    let alice = alice_may_bind_widgets(&env).await;
    let bob = cluster.mint_user("bob").await.unwrap();
    let admin_token = cluster.admin_token().to_owned();
    let widgets = r#"{"export":"widgets"}"#;

    // Who may not: nobody, a made-up token, a token in a cookie (a browser's ambient
    // credential is not one), an identity without the right, one with the right to another Export.
    let refusals: Vec<(&str, Answer, u16, &str)> = vec![
        (
            "anonymous",
            bind(&short, &ca, None, widgets).await,
            401,
            "bearer token is required",
        ),
        (
            "a made-up token",
            bind(&short, &ca, Some("not-a-token"), widgets).await,
            401,
            "not valid",
        ),
        (
            "a cookie",
            https(
                &short.address,
                &ca,
                "POST",
                "/api/bind",
                &[
                    ("Content-Type", "application/json"),
                    ("Cookie", &format!("token={}", alice.token)),
                ],
                widgets.as_bytes(),
            )
            .await
            .unwrap(),
            401,
            "bearer token is required",
        ),
        (
            "bob",
            bind(&short, &ca, Some(&bob.token), widgets).await,
            403,
            "may not bind Export widgets",
        ),
        (
            "alice, gadgets",
            bind(&short, &ca, Some(&alice.token), r#"{"export":"gadgets"}"#).await,
            403,
            "may not bind Export gadgets",
        ),
        // A cross-site form can send only form or text bodies: never acted on.
        (
            "a form post",
            https(
                &short.address,
                &ca,
                "POST",
                "/api/bind",
                &[
                    ("Content-Type", "application/x-www-form-urlencoded"),
                    ("Authorization", &format!("Bearer {}", alice.token)),
                ],
                b"export=widgets",
            )
            .await
            .unwrap(),
            415,
            "application/json",
        ),
        (
            "an oversized body",
            bind(
                &short,
                &ca,
                Some(&alice.token),
                &format!(
                    r#"{{"export":"widgets","connection":"{}"}}"#,
                    "a".repeat(10_000)
                ),
            )
            .await,
            413,
            "",
        ),
        (
            "a malformed body",
            bind(&short, &ca, Some(&alice.token), r#"{"export":"Widgets!"}"#).await,
            400,
            "is not an Export's name",
        ),
        // The provider's admin (a user token, not a ServiceAccount) may bind anything: what is
        // not there or not offered gets no Grant.
        (
            "no such Export",
            bind(&short, &ca, Some(&admin_token), r#"{"export":"nope"}"#).await,
            404,
            "no Export nope",
        ),
        (
            "not offered",
            bind(&short, &ca, Some(&admin_token), r#"{"export":"gadgets"}"#).await,
            409,
            "gadgets.example.org",
        ),
    ];
    for (what, answer, code, says) in &refusals {
        assert_eq!(answer.code, *code, "{what}: {answer:?}");
        assert!(answer.body.contains(says), "{what}: {answer:?}");
        assert!(
            answer.body.trim_end().lines().count() <= 1,
            "{what}: one line: {answer:?}"
        );
        assert!(
            !answer.body.contains("apiVersion"),
            "{what}: no bundle: {answer:?}"
        );
    }
    let grants = Api::<kbind_shared::api::iam::Grant>::all(provider.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        grants.items.is_empty(),
        "no refused call recorded a Grant: {:?}",
        grants.items
    );

    // No login where none is configured; no session without a login.
    let login = get(&short, &ca, "/login", None).await;
    assert_eq!(login.code, 404, "{login:?}");
    assert!(login.body.contains("not configured"), "{login:?}");
    let no_session = https(
        &short.address,
        &ca,
        "GET",
        "/api/session",
        &[(
            "Cookie",
            &format!("__Host-kbind-session={}", "A".repeat(43)),
        )],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(no_session.code, 401, "{no_session:?}");

    // Pickups: a guessed token, a path that is no token, an expired one.
    for path in [
        format!("/api/pickup/{}", "A".repeat(43)),
        "/api/pickup/..%2F..%2Fsecrets".to_owned(),
        "/api/pickup/".to_owned(),
    ] {
        let answer = get(&short, &ca, &path, None).await;
        assert_eq!(answer.code, 404, "{path}: {answer:?}");
    }
    let bound = bind(&short, &ca, Some(&alice.token), widgets).await;
    assert_eq!(bound.code, 201, "{bound:?}");
    let pickup = bound.json()["pickup"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Taken on the other replica: the record carries its own lifetime.
    let late = get(&strict, &ca, &pickup, None).await;
    assert_eq!(late.code, 410, "{late:?}");
    assert!(late.body.contains("expired"), "{late:?}");
    assert_eq!(get(&strict, &ca, &pickup, None).await.code, 404);

    // Bounded per caller: 5 pickups held at once, 7 binds a minute on this replica; bob's
    // calls are not slowed by alice's.
    let mut pickups = Vec::new();
    for i in 0..5 {
        let bound = bind(&strict, &ca, Some(&alice.token), widgets).await;
        assert_eq!(bound.code, 201, "bind {i}: {bound:?}");
        pickups.push(bound.json()["pickup"].as_str().unwrap().to_owned());
    }
    for _ in 0..2 {
        let held = bind(&strict, &ca, Some(&alice.token), widgets).await;
        assert_eq!(held.code, 429, "{held:?}");
        assert!(held.body.contains("you hold 5 pickups"), "{held:?}");
    }
    let taken = get(&strict, &ca, &pickups[0], None).await;
    assert_eq!(taken.code, 200, "{taken:?}");
    assert_eq!(taken.header("content-type"), Some("application/yaml"));
    assert_eq!(yaml_documents(&taken.body).unwrap().len(), 3);
    let throttled = bind(&strict, &ca, Some(&alice.token), widgets).await;
    assert_eq!(throttled.code, 429, "{throttled:?}");
    assert!(
        throttled.body.contains("binds this minute"),
        "{throttled:?}"
    );
    let bob_refused = bind(&strict, &ca, Some(&bob.token), widgets).await;
    assert_eq!(
        bob_refused.code, 403,
        "bob is judged, not throttled: {bob_refused:?}"
    );
    // An Accept the gateway cannot serve: no bundle, and the pickup stays.
    let html = get(&strict, &ca, &pickups[1], Some("text/html")).await;
    assert_eq!(html.code, 406, "{html:?}");
    assert_eq!(get(&strict, &ca, &pickups[1], None).await.code, 200);

    // The fence: the gateway's own account may mint tokens only for a boundary's consumer
    // account, write no Secret but a pickup, and record no Grant with a lasting credential.
    let gateway = client_for(&account.kubeconfig).await.unwrap();
    let refused = Api::<ServiceAccount>::namespaced(gateway.clone(), ISSUER_NAMESPACE)
        .create_token_request(
            ISSUER_SERVICE_ACCOUNT,
            &PostParams::default(),
            &TokenRequest::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("mints tokens only for a boundary"),
        "{refused}"
    );
    let refused = Api::<Secret>::namespaced(gateway.clone(), ISSUER_NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "other" }, "type": "Opaque" }))
                .unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("writes only its records"), "{refused}");
    let refused = Api::<kbind_shared::api::iam::Grant>::all(gateway.clone())
        .patch(
            "lasting",
            &PatchParams::apply("kbind-gateway"),
            &Patch::Apply(json!({
                "apiVersion": "iam.kbind.io/v1alpha1",
                "kind": "Grant",
                "metadata": { "name": "lasting" },
                "spec": { "export": "widgets", "consumer": { "identity": "x" }, "credential": { "mode": "LongLived" } },
            })),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("expiring credential"), "{refused}");

    assert_no_log_holds(
        &env,
        &[
            ("alice's token", &alice.token),
            ("bob's token", &bob.token),
            ("the admin's token", &admin_token),
        ],
    );
    let _ = provider;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kbind_bind_applies_the_bundle_and_waits_until_the_apis_are_served() {
    let mut env = TestEnv::start("gateway-plugin", &["provider", "consumer"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let controller = run_provider_widget_controller(provider.clone());
    let consumer = consumer_running_kbind(&mut env, &["team-a"]).await;
    let (cert, key, ca) = gateway_certificate(&env);
    let gateway = start_gateway(&mut env, "gateway", &account, (&cert, &key), &[]).await;
    let alice = alice_may_bind_widgets(&env).await;
    let ca_file = env.dir().join("gateway-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let token_file = env.dir().join("alice.token");
    std::fs::write(&token_file, &alice.token).unwrap();
    let url = format!("https://{}", gateway.address);
    let (ca_file, token_file) = (
        ca_file.display().to_string(),
        token_file.display().to_string(),
    );
    let consumer_kubeconfig = env.cluster("consumer").admin_kubeconfig_path();
    let gateway_args = ["--gateway", &url, "--gateway-ca-file", &ca_file];

    // The catalog, as a table and as JSON.
    let mut args = vec!["catalog"];
    args.extend_from_slice(&gateway_args);
    let run = plugin(&consumer_kubeconfig, &args).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(run.stdout.contains("widgets.example.org"), "{run}");
    assert!(!run.stdout.contains("gadgets"), "not offered: {run}");
    args.extend_from_slice(&["-o", "json"]);
    let run = plugin(&consumer_kubeconfig, &args).await;
    assert_eq!(run.json()["exports"][0]["name"], "widgets", "{run}");

    // No token: refused before anything is asked.
    let mut args = vec!["bind", "widgets"];
    args.extend_from_slice(&gateway_args);
    let run = plugin(&consumer_kubeconfig, &args).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("a token is required"), "{run}");
    // A gateway not trusted: refused by TLS.
    let run = plugin(&consumer_kubeconfig, &["catalog", "--gateway", &url]).await;
    assert_eq!(run.code, 2, "{run}");

    // `-o yaml`: the bundle printed, nothing written on the consumer.
    args.extend_from_slice(&["--token-file", &token_file]);
    let mut yaml_args = args.clone();
    yaml_args.extend_from_slice(&["-o", "yaml"]);
    let run = plugin(&consumer_kubeconfig, &yaml_args).await;
    assert_eq!(run.code, 0, "{run}");
    let documents = yaml_documents(&run.stdout).unwrap();
    assert_eq!(documents[1]["kind"], "Connection", "{run}");
    assert!(
        Api::<kbind_shared::api::Connection>::all(consumer.clone())
            .get_opt("widgets")
            .await
            .unwrap()
            .is_none(),
        "-o yaml writes nothing"
    );

    // The one command: bound, applied, Ready, served — and it said so step by step.
    let run = plugin(&consumer_kubeconfig, &args).await;
    assert_eq!(run.code, 0, "{run}");
    for step in [
        "applied Secret kbind/widgets-kubeconfig",
        "applied Connection widgets",
        "applied ClusterBinding widgets",
        "Connection widgets is Ready",
        "ClusterBinding widgets is Ready",
        "API widgets.example.org is Ready",
    ] {
        assert!(run.stderr.contains(step), "{step}: {run}");
    }
    assert!(
        run.stdout
            .contains("bound widgets: Connection widgets Ready, serving widgets.example.org"),
        "{run}"
    );
    // What it said is what the consumer's API server holds: the binding Ready, the API served,
    // and a Widget syncs into the caller's boundary.
    wait_cluster_binding_ready(&consumer, "widgets").await;
    widgets(&consumer, "team-a")
        .create(&PostParams::default(), &widget("w", 2))
        .await
        .unwrap();
    let boundary = kbind_provider::issuer::rbac::boundary(&alice.username, None, "widgets");
    let copies = widgets(&provider, &format!("{boundary}-team-a"));
    wait_for("the Widget's copy in the boundary", 30, || async {
        Ok((size_of(&copies, "w").await == Some(2)).then_some(()))
    })
    .await;

    // Binding again is the same Grant and boundary, its Secret updated in place.
    let run = plugin(&consumer_kubeconfig, &args).await;
    assert_eq!(run.code, 0, "{run}");
    // A Connection of that name someone else wrote is not taken over.
    Api::<Secret>::namespaced(consumer.clone(), SECRET_NAMESPACE)
        .patch(
            "taken-kubeconfig",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": "taken-kubeconfig", "namespace": SECRET_NAMESPACE },
                "stringData": { "kubeconfig": "theirs" },
            })),
        )
        .await
        .unwrap();
    let mut taken = args.clone();
    taken.extend_from_slice(&["--connection", "taken"]);
    let run = plugin(&consumer_kubeconfig, &taken).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("someone else wrote it"), "{run}");
    let theirs = Api::<Secret>::namespaced(consumer.clone(), SECRET_NAMESPACE)
        .get("taken-kubeconfig")
        .await
        .unwrap();
    assert_eq!(
        theirs.data.unwrap()["kubeconfig"].0,
        b"theirs".to_vec(),
        "kept byte for byte"
    );
    controller.abort();
}

/// A browser's cookie jar (what the tests' requests carry as a browser would).
#[derive(Default, Clone)]
struct Jar(std::collections::BTreeMap<String, String>);

impl Jar {
    /// Keeps the cookies an answer sets (an empty value or `Max-Age=0` removes one).
    fn absorb(&mut self, answer: &Answer) {
        for (name, value) in &answer.headers {
            if name != "set-cookie" {
                continue;
            }
            let Some((pair, attributes)) = value.split_once(';').or(Some((value.as_str(), "")))
            else {
                continue;
            };
            let Some((key, value)) = pair.split_once('=') else {
                continue;
            };
            if value.is_empty() || attributes.contains("Max-Age=0") {
                self.0.remove(key.trim());
            } else {
                self.0
                    .insert(key.trim().to_owned(), value.trim().to_owned());
            }
        }
    }

    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The path and query of `url` (`http://host:port/p?q` → `/p?q`; a path stays as it is).
fn path_of(url: &str) -> String {
    match url.split_once("://") {
        Some((_, rest)) => rest
            .find('/')
            .map_or("/".to_owned(), |i| rest[i..].to_owned()),
        None => url.to_owned(),
    }
}

/// The user at the identity provider: from the authorization URL the gateway sent the browser
/// to, through the provider's own login form (a wrong password first), to the callback URL the
/// provider sends the browser back to.
async fn log_in_at_the_provider(idp: &OidcProvider, authorize: &str) -> String {
    let at_idp = http(&idp.address, "GET", &path_of(authorize), &[], b"")
        .await
        .unwrap();
    assert_eq!(at_idp.code, 302, "{at_idp:?}");
    let form = at_idp.header("location").unwrap().to_owned();
    let request_id = form.split("authRequestID=").nth(1).unwrap().to_owned();
    let page = http(&idp.address, "GET", &path_of(&form), &[], b"")
        .await
        .unwrap();
    assert_eq!(page.code, 200, "{page:?}");
    let wrong = http(
        &idp.address,
        "POST",
        "/login/username",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("id={request_id}&username=alice&password=guessed").as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(
        wrong.code, 200,
        "a wrong password stays on the form: {wrong:?}"
    );
    let posted = http(
        &idp.address,
        "POST",
        "/login/username",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("id={request_id}&username=alice&password=wonderland").as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(posted.code, 302, "{posted:?}");
    let back = http(
        &idp.address,
        "GET",
        &path_of(posted.header("location").unwrap()),
        &[],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(back.code, 302, "{back:?}");
    back.header("location").unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_through_a_real_oidc_provider_and_binds_while_the_replica_it_started_on_dies()
 {
    let mut env = TestEnv::start("gateway-login", &["provider"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let (cert, key, ca) = gateway_certificate(&env);
    // One address in front of both replicas, as a Service is: the identity provider returns
    // browsers there.
    let front = Front::with_login(&mut env).await;
    let (front_address, external, idp) =
        (front.address.clone(), front.external.clone(), &front.idp);
    let oidc = front.flags();
    let oidc: Vec<&str> = oidc.iter().map(String::as_str).collect();
    let a = start_gateway(&mut env, "gateway-a", &account, (&cert, &key), &oidc).await;
    let b = start_gateway(&mut env, "gateway-b", &account, (&cert, &key), &oidc).await;
    front.route_to(&a);
    let via_front = Gateway {
        address: front_address.clone(),
        metrics: String::new(),
        probes: String::new(),
        index: usize::MAX,
    };
    let advertised = get(&via_front, &ca, "/api/provider", None).await.json();
    assert_eq!(
        advertised["authentication"][1]["type"], "oidc",
        "{advertised}"
    );

    // The browser starts its login on replica A: sent to the identity provider with a challenge,
    // holding a cookie that binds the login to it.
    let mut browser = Jar::default();
    let started = https(&front_address, &ca, "GET", "/login?then=/", &[], b"")
        .await
        .unwrap();
    assert_eq!(started.code, 302, "{started:?}");
    browser.absorb(&started);
    assert!(browser.0.contains_key("__Host-kbind-login"), "{started:?}");
    let authorize = started.header("location").unwrap().to_owned();
    assert!(authorize.starts_with(&idp.issuer), "{authorize}");
    assert!(
        authorize.contains("code_challenge_method=S256"),
        "{authorize}"
    );
    let set_cookie = started.header("set-cookie").unwrap();
    for attribute in ["Secure", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }

    // Replica A dies; the front now reaches B.
    env.process(a.index).kill();
    front.route_to(&b);

    // The user logs in at the identity provider (its own form), which sends the browser back.
    let callback = log_in_at_the_provider(idp, &authorize).await;

    assert!(
        callback.starts_with(&format!("{external}/callback?")),
        "{callback}"
    );
    let callback = path_of(&callback);

    // Another browser holding the callback URL cannot finish this login, nor one without the
    // cookie; the login stays for its own browser.
    let other = https(
        &front_address,
        &ca,
        "GET",
        &callback,
        &[("Cookie", "__Host-kbind-login=someone-elses")],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(other.code, 403, "{other:?}");
    assert!(other.body.contains("another browser"), "{other:?}");
    let cookieless = https(&front_address, &ca, "GET", &callback, &[], b"")
        .await
        .unwrap();
    assert_eq!(cookieless.code, 403, "{cookieless:?}");

    // Its own browser finishes on replica B: logged in, sent back where it asked.
    let jar = browser.header();
    let finished = https(
        &front_address,
        &ca,
        "GET",
        &callback,
        &[("Cookie", &jar)],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(finished.code, 302, "{finished:?}");
    assert_eq!(finished.header("location"), Some("/"));
    browser.absorb(&finished);
    assert!(
        !browser.0.contains_key("__Host-kbind-login"),
        "the login cookie is cleared"
    );
    let session_token = browser.0.get("__Host-kbind-session").cloned().unwrap();
    // The same callback again: the login was taken.
    let replay = https(
        &front_address,
        &ca,
        "GET",
        &callback,
        &[("Cookie", &jar)],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(replay.code, 404, "{replay:?}");

    let jar = browser.header();
    let session = https(
        &front_address,
        &ca,
        "GET",
        "/api/session",
        &[("Cookie", &jar)],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(session.code, 200, "{session:?}");
    let session = session.json();
    assert_eq!(session["username"], "oidc:alice@example.org");
    let csrf = session["csrfToken"].as_str().unwrap().to_owned();

    // A bind riding on the cookie alone (what a cross-site page could make the browser send)
    // is refused; with the session's CSRF token it binds.
    let widgets = br#"{"export":"widgets"}"#;
    let forged = https(
        &front_address,
        &ca,
        "POST",
        "/api/bind",
        &[("Content-Type", "application/json"), ("Cookie", &jar)],
        widgets,
    )
    .await
    .unwrap();
    assert_eq!(forged.code, 403, "{forged:?}");
    assert!(forged.body.contains("CSRF"), "{forged:?}");
    let bound = https(
        &front_address,
        &ca,
        "POST",
        "/api/bind",
        &[
            ("Content-Type", "application/json"),
            ("Cookie", &jar),
            ("X-CSRF-Token", &csrf),
        ],
        widgets,
    )
    .await
    .unwrap();
    assert_eq!(bound.code, 201, "{bound:?}");
    let pickup = bound.json()["pickup"].as_str().unwrap().to_owned();
    let taken = https(&front_address, &ca, "GET", &pickup, &[], b"")
        .await
        .unwrap();
    assert_eq!(taken.code, 200, "{taken:?}");
    let boundary =
        kbind_provider::issuer::rbac::boundary("oidc:alice@example.org", None, "widgets");
    let grant = Api::<kbind_shared::api::iam::Grant>::all(provider.clone())
        .get(&boundary)
        .await
        .unwrap();
    assert_eq!(grant.spec.consumer.identity, "oidc:alice@example.org");

    // Logging out ends the session everywhere.
    let out = https(
        &front_address,
        &ca,
        "DELETE",
        "/api/session",
        &[("Cookie", &jar), ("X-CSRF-Token", &csrf)],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(out.code, 204, "{out:?}");
    let gone = https(
        &front_address,
        &ca,
        "GET",
        "/api/session",
        &[("Cookie", &jar)],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(gone.code, 401, "{gone:?}");

    assert_no_log_holds(
        &env,
        &[
            ("the session token", &session_token),
            ("the CSRF token", &csrf),
            ("the pickup", pickup.trim_start_matches("/api/pickup/")),
        ],
    );
}

/// A running `kubectl kbind login`, its stderr read line by line.
struct LoginRun {
    child: tokio::process::Child,
    stderr: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
}

impl LoginRun {
    fn start(args: &[&str], config_dir: &std::path::Path) -> Self {
        let mut child = tokio::process::Command::new(
            kbind_e2e::controlplane::kbind_bin("kubectl-kbind").unwrap(),
        )
        .arg("login")
        .args(args)
        .env("KBIND_CONFIG_DIR", config_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
        let stderr = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stderr.take().unwrap(),
        ));
        Self { child, stderr }
    }

    /// The URL it asks the user to open.
    async fn url(&mut self) -> String {
        let read = async {
            while let Some(line) = self.stderr.next_line().await.unwrap() {
                if let Some(at) = line.find("https://") {
                    return line[at..].trim().to_owned();
                }
            }
            panic!("kubectl kbind login printed no URL");
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap()
    }

    /// Waits until it ends: its exit code and standard output.
    async fn finish(self) -> (i32, String) {
        let output = tokio::time::timeout(Duration::from_secs(30), self.child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kbind_login_is_handed_its_session_through_the_browser_or_a_pasted_code() {
    let mut env = TestEnv::start("gateway-cli-login", &["provider"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let (cert, key, ca) = gateway_certificate(&env);
    let front = Front::with_login(&mut env).await;
    let (front_address, external) = (front.address.clone(), front.external.clone());
    let oidc = front.flags();
    let oidc: Vec<&str> = oidc.iter().map(String::as_str).collect();
    let gateway = start_gateway(&mut env, "gateway", &account, (&cert, &key), &oidc).await;
    front.route_to(&gateway);
    let config_dir = env.dir().join("kbind-config");
    let ca_file = env.dir().join("gateway-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let ca_file = ca_file.display().to_string();
    let cli_args = [
        "--gateway",
        external.as_str(),
        "--gateway-ca-file",
        ca_file.as_str(),
    ];

    // The browser flow: the command listens on loopback, the browser logs in and is sent there.
    let mut args = cli_args.to_vec();
    args.push("--no-open");
    let mut run = LoginRun::start(&args, &config_dir);
    let url = run.url().await;
    assert!(url.starts_with(&format!("{external}/login?cli=")), "{url}");
    let (browser, handed) = front.browser_login(&ca, &url).await;
    assert_eq!(handed.code, 302, "{handed:?}");
    assert!(
        !browser.0.contains_key("__Host-kbind-session"),
        "the session goes to the command, not the browser: {handed:?}"
    );
    let loopback = handed.header("location").unwrap().to_owned();
    assert!(loopback.starts_with("http://127.0.0.1:"), "{loopback}");
    let listener = loopback
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let page = http(&listener, "GET", &path_of(&loopback), &[], b"")
        .await
        .unwrap();
    assert_eq!(page.code, 200, "{page:?}");
    let (code, stdout) = run.finish().await;
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("as oidc:alice@example.org"), "{stdout}");
    let kept = config_dir.join("sessions.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o600,
        "the kept session is its owner's only"
    );

    // The kept session binds: no token given.
    let provider_kubeconfig = env.cluster("provider").admin_kubeconfig_path();
    let config_env = config_dir.display().to_string();
    let mut bind_args = vec!["bind", "widgets"];
    bind_args.extend_from_slice(&cli_args);
    bind_args.extend_from_slice(&["-o", "yaml"]);
    let bound = plugin_with(
        &provider_kubeconfig,
        &bind_args,
        &[("KBIND_CONFIG_DIR", &config_env)],
    )
    .await;
    assert_eq!(bound.code, 0, "{bound}");
    assert_eq!(yaml_documents(&bound.stdout).unwrap().len(), 3, "{bound}");
    let boundary =
        kbind_provider::issuer::rbac::boundary("oidc:alice@example.org", None, "widgets");
    let grant = Api::<kbind_shared::api::iam::Grant>::all(provider.clone())
        .get(&boundary)
        .await
        .unwrap();
    assert_eq!(grant.spec.consumer.identity, "oidc:alice@example.org");

    // The paste flow: the page shows a code; without the command's verifier it is worth nothing.
    let mut args = cli_args.to_vec();
    args.push("--paste");
    let mut run = LoginRun::start(&args, &config_dir);
    let url = run.url().await;
    assert!(url.contains("cli=paste"), "{url}");
    let (_, shown) = front.browser_login(&ca, &url).await;
    assert_eq!(shown.code, 200, "{shown:?}");
    let code = shown
        .body
        .split("<output id=\"code\">")
        .nth(1)
        .and_then(|rest| rest.split("</output>").next())
        .unwrap()
        .to_owned();
    let stolen = https(
        &front_address,
        &ca,
        "POST",
        "/api/session/handoff",
        &[("Content-Type", "application/json")],
        json!({ "code": code, "verifier": "a-guess" })
            .to_string()
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(stolen.code, 403, "{stolen:?}");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = run.child.stdin.take().unwrap();
        stdin
            .write_all(format!("{code}\n").as_bytes())
            .await
            .unwrap();
    }
    let (exit, stdout) = run.finish().await;
    assert_eq!(exit, 0, "{stdout}");
    assert!(stdout.contains("as oidc:alice@example.org"), "{stdout}");
    // Redeemed once: the same code again is nothing.
    let again = https(
        &front_address,
        &ca,
        "POST",
        "/api/session/handoff",
        &[("Content-Type", "application/json")],
        json!({ "code": code, "verifier": "a-guess" })
            .to_string()
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(again.code, 404, "{again:?}");
    let kept_text = std::fs::read_to_string(&kept).unwrap();
    let session = serde_json::from_str::<Value>(&kept_text).unwrap()[&external]["session"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_no_log_holds(
        &env,
        &[("the session", &session), ("the pasted code", &code)],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_real_browser_a_team_logs_in_binds_from_the_page_and_its_bundle_makes_a_connection_ready()
 {
    use fantoccini::Locator;
    let mut env = TestEnv::start("gateway-browser", &["provider", "consumer"])
        .await
        .unwrap();
    let (provider, account) = provider_with_gateway(&mut env).await;
    let controller = run_provider_widget_controller(provider.clone());
    let consumer = consumer_running_kbind(&mut env, &[]).await;
    let (cert, key, _ca) = gateway_certificate(&env);
    let front = Front::with_login(&mut env).await;
    let external = front.external.clone();
    let oidc = front.flags();
    let oidc: Vec<&str> = oidc.iter().map(String::as_str).collect();
    let gateway = start_gateway(&mut env, "gateway", &account, (&cert, &key), &oidc).await;
    front.route_to(&gateway);
    let browser = kbind_e2e::browser::start_browser(&mut env).await.unwrap();
    let page = &browser.client;

    // The catalog, before logging in: the offered Export, not the other; a way to log in.
    page.goto(&format!("{external}/")).await.unwrap();
    let card = page
        .wait()
        .for_element(Locator::Id("export-widgets"))
        .await
        .unwrap();
    assert!(card.text().await.unwrap().contains("widgets.example.org"));
    let offerings = page
        .find(Locator::Id("exports"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!offerings.contains("gadgets"), "{offerings}");
    let login = page.wait().for_element(Locator::Id("login")).await.unwrap();
    assert!(login.is_displayed().await.unwrap());

    // Log in through the identity provider's own form.
    login.click().await.unwrap();
    page.wait()
        .for_element(Locator::Css("input[name=username]"))
        .await
        .unwrap()
        .send_keys("alice")
        .await
        .unwrap();
    page.find(Locator::Css("input[name=password]"))
        .await
        .unwrap()
        .send_keys("wonderland")
        .await
        .unwrap();
    page.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the page to say who is logged in", 30, || async {
        let who = page
            .find(Locator::Id("who"))
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        Ok(who
            .contains("Logged in as oidc:alice@example.org")
            .then_some(()))
    })
    .await;
    assert!(
        page.current_url()
            .await
            .unwrap()
            .as_str()
            .starts_with(&external)
    );

    // Bind from the page; the bundle's pickup is offered as a download and a command.
    page.find(Locator::Css("#export-widgets form.bind button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let result = page
        .wait()
        .for_element(Locator::Id("result"))
        .await
        .unwrap();
    wait_for("the bundle's pickup on the page", 30, || async {
        Ok(result.is_displayed().await.unwrap_or(false).then_some(()))
    })
    .await;
    let download = page
        .find(Locator::Id("download"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap()
        .unwrap();
    assert!(
        download.starts_with(&format!("{external}/api/pickup/")),
        "{download}"
    );
    let command = page
        .find(Locator::Id("one-liner"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(command, format!("kubectl apply -f {download}"));
    if let Ok(path) = std::env::var("KBIND_GATEWAY_SCREENSHOT") {
        std::fs::write(&path, page.screenshot().await.unwrap()).unwrap();
    }
    std::fs::write(
        env.dir().join("gateway-page.png"),
        page.screenshot().await.unwrap(),
    )
    .unwrap();

    // The browser downloads it (once); nothing is left in its storage, and its cookies are
    // beyond the page's script.
    let fetch = "const done = arguments[arguments.length - 1]; fetch(arguments[0]).then(r => r.text().then(t => done([r.status, t])));";
    let downloaded = page
        .execute_async(fetch, vec![json!(download)])
        .await
        .unwrap();
    assert_eq!(downloaded[0], 200, "{downloaded}");
    let bundle = downloaded[1].as_str().unwrap().to_owned();
    let again = page
        .execute_async(fetch, vec![json!(download)])
        .await
        .unwrap();
    assert_eq!(again[0], 404, "{again}");
    let storage = page
        .execute(
            "return [localStorage.length, sessionStorage.length, document.cookie];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(storage, json!([0, 0, ""]));

    // The downloaded bundle, applied: the Connection becomes Ready and the binding serves.
    apply_manifest(&consumer, &bundle).await.unwrap();
    wait_cluster_binding_ready(&consumer, "widgets").await;
    wait_connection(&consumer, "widgets", "Ready=True").await;
    browser.client.close().await.unwrap();
    controller.abort();
}
