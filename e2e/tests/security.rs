//! Security across a cluster (SPEC §4): users and grants live in the Raft metadata, so every
//! node enforces a change at once — including dropping verified credentials it had cached —
//! and the cluster secret gates node-to-node traffic (§4.5). The authorization matrix of the
//! one-node suite holds through every node.

use std::time::{Duration, Instant};

use narad_e2e::{ClusterOpts, TestCluster};
use narad_tests::certs::TestCa;
use narad_tests::{auth_matrix, eventually, json, Checks, Http};

const ADMIN_PASSWORD: &str = "root-pw-for-e2e";
const SECRET: &str = "cluster-secret-for-e2e-0123456789";

fn secured() -> ClusterOpts {
    ClusterOpts {
        env: vec![
            ("NARAD_SECURITY_ENABLED".into(), "true".into()),
            ("NARAD_ADMIN_PASSWORD".into(), ADMIN_PASSWORD.into()),
            ("NARAD_CLUSTER_SECRET".into(), SECRET.into()),
        ],
        ..ClusterOpts::default()
    }
}

/// Waits until `http` gets `want` for a produce to `topic` (a change made through another
/// node reaches this one within the metadata replication delay).
async fn produce_status(http: &Http, topic: &str, want: u16) {
    eventually(Duration::from_secs(5), Duration::from_millis(20), || {
        let http = http.clone();
        let topic = topic.to_string();
        async move {
            let r = http.produce(&topic, "", "x").await;
            anyhow::ensure!(r.status == want, "want {want}, got {}", r.describe());
            Ok(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_grants_apply_on_every_node_at_once() {
    let c = TestCluster::start_with(3, secured()).await;
    let admin: Vec<Http> = (0..3)
        .map(|i| c.http(i).as_user("admin", ADMIN_PASSWORD))
        .collect();
    // The root admin is seeded once for the cluster and works on every node.
    for a in &admin {
        a.get("/v1/users").await.expect(200);
    }
    admin[0].create_topic(&json!({"name": "orders-eu"})).await;
    // The cluster-view helpers send the admin's credentials on a secured cluster.
    assert_eq!(c.members(1).await.len(), 3);
    assert!(c.leader(2).await.is_some());
    assert!(!c.owners(0, "orders-eu").await.is_empty());
    c.wait_status(1, "n2", "alive").await;
    admin[0]
        .post_json(
            "/v1/users",
            &json!({"username": "billing", "password": "pw-1",
                    "grants": [{"action": "produce", "patterns": ["orders-*"]}]}),
        )
        .await
        .expect(201);
    let billing: Vec<Http> = (0..3)
        .map(|i| c.http(i).as_user("billing", "pw-1"))
        .collect();
    // Created through n0, usable through n1 and n2 (the credentials get cached there).
    for b in &billing {
        produce_status(b, "orders-eu", 202).await;
        b.produce("orders-eu", "", "y").await.expect(202);
    }
    // No consume grant anywhere.
    billing[2].consume("orders-eu", "").await.expect_error(403);

    // A password change through n0: the old password stops working on n2 at once (its
    // verified-credentials cache is dropped), the new one works.
    admin[0]
        .request(narad_tests::Method::PUT, "/v1/users/billing/password")
        .json(&json!({"new_password": "pw-2"}))
        .send()
        .await
        .expect(204);
    produce_status(&billing[2], "orders-eu", 401).await;
    produce_status(&billing[1], "orders-eu", 401).await;
    let billing2: Vec<Http> = (0..3)
        .map(|i| c.http(i).as_user("billing", "pw-2"))
        .collect();
    produce_status(&billing2[2], "orders-eu", 202).await;

    // Grants replaced through n1: n2 refuses at once.
    admin[1]
        .request(narad_tests::Method::PUT, "/v1/users/billing/grants")
        .json(&json!({"grants": [{"action": "consume", "patterns": ["orders-*"]}]}))
        .send()
        .await
        .expect(200);
    produce_status(&billing2[2], "orders-eu", 403).await;
    billing2[0].consume("orders-eu", "").await.expect(200);

    // Deleted through n2: 401 on n0.
    admin[2].delete("/v1/users/billing").await.expect(204);
    eventually(Duration::from_secs(5), Duration::from_millis(20), || {
        let b = billing2[0].clone();
        async move {
            let r = b.consume("orders-eu", "").await;
            anyhow::ensure!(r.status == 401, "{}", r.describe());
            Ok(())
        }
    })
    .await;
}

/// The route matrix of `tests/tests/security.rs::route_matrix` (every route × no credentials,
/// wrong password, no grant, grant, owner, admin, root), every row sent through each of the
/// three nodes: any node serves any request (SPEC §6.3), so every status is the one-node one,
/// also where the node forwards to a partition owner (produce, consume, replay, ack) or to
/// the metadata leader (topic and user writes). Each node's `{c}` names get its own suffix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_matrix_through_every_node() {
    let c = TestCluster::start_with(3, secured()).await;
    let started = Instant::now();
    let clients: Vec<Vec<Http>> = (0..3)
        .map(|i| auth_matrix::clients(&c.http(i), ADMIN_PASSWORD))
        .collect();
    let suffixes: Vec<String> = (0..3).map(|i| format!("-n{i}")).collect();
    let suffixes: Vec<&str> = suffixes.iter().map(String::as_str).collect();
    auth_matrix::setup(&clients[0], &suffixes).await;
    // Made through n0; users and grants reach n1 and n2 through the metadata log.
    for node in &clients {
        auth_matrix::wait_setup_applied(node, &suffixes, Duration::from_secs(30)).await;
    }
    let admin = &clients[0][auth_matrix::ROOT];
    // Every node owns one partition of `orders` and forwards to the owners of the other two;
    // two of the three forward metadata writes to the leader.
    let members = admin.get("/v1/cluster/members").await.expect_json(200);
    let leader = members["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["leader"] == true))
        .and_then(|m| m["id"].as_str())
        .unwrap_or_else(|| panic!("no leader in {members}"))
        .to_string();
    let owners: Vec<String> = admin
        .partition_stats("orders")
        .await
        .iter()
        .map(|p| p["owner_node"].as_str().unwrap_or_default().to_string())
        .collect();
    for n in &c.nodes {
        assert!(
            owners.contains(&n.id),
            "{} owns no partition of orders: {owners:?}",
            n.id
        );
    }
    eprintln!(
        "setup {:?}; leader {leader}; owners of orders {owners:?}",
        started.elapsed()
    );

    let mut checks = Checks::new("route matrix through three nodes");
    let mut sent = 0;
    for r in &auth_matrix::rows() {
        for (i, node) in clients.iter().enumerate() {
            let via = &c.nodes[i].id;
            sent += auth_matrix::check_row(&mut checks, r, node, suffixes[i], via).await;
        }
    }
    for (i, node) in clients.iter().enumerate() {
        sent +=
            auth_matrix::check_malformed_credentials(&mut checks, &node[0], &c.nodes[i].id).await;
    }
    eprintln!(
        "{sent} requests checked in {:?} (setup included)",
        started.elapsed()
    );
    checks.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_wrong_cluster_secret_cannot_join() {
    let mut c = TestCluster::start_with(3, secured()).await;
    // A fourth node, join-only, with the wrong secret: never admitted, never ready.
    let i = c
        .add_node_unready(vec![(
            "NARAD_CLUSTER_SECRET".into(),
            "wrong-secret-value-4567-wrong-secret-value".into(),
        )])
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await; // it asks every 2 s: give it tries
    let r = c.http(i).get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.describe());
    let members = c
        .http(0)
        .as_user("admin", ADMIN_PASSWORD)
        .get("/v1/cluster/members")
        .await
        .expect_json(200);
    assert_eq!(members["members"].as_array().unwrap().len(), 3, "{members}");
    // Secrets never appear in any log.
    for n in &c.nodes {
        let log = n.server.log_tail(100_000);
        assert!(!log.contains(SECRET), "{} logged the cluster secret", n.id);
        assert!(
            !log.contains("wrong-secret-value-4567-wrong-secret-value"),
            "{} logged a secret",
            n.id
        );
    }
}

/// Mutual TLS on the cluster port (SPEC §4.5) with certificates made here: a cluster whose
/// nodes hold certificates of one CA forms, forwards and replicates; a node with the right
/// secret but a certificate of another CA is never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutual_tls_cluster_forms_and_refuses_a_foreign_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("narad-cluster-ca");
    let mut opts = secured();
    for i in 0..3 {
        let f = ca.issue(dir.path(), &format!("n{i}"), &["127.0.0.1", "localhost"]);
        for (name, path) in [
            ("NARAD_CLUSTER_TLS_CERT_FILE", &f.cert),
            ("NARAD_CLUSTER_TLS_KEY_FILE", &f.key),
            ("NARAD_CLUSTER_TLS_CA_FILE", &f.ca),
        ] {
            opts.node_env
                .push((i, name.into(), path.display().to_string()));
        }
    }
    let mut c = TestCluster::start_with(3, opts).await;
    let admin: Vec<Http> = (0..3)
        .map(|i| c.http(i).as_user("admin", ADMIN_PASSWORD))
        .collect();
    admin[0]
        .create_topic(&json!({"name": "tls-orders", "partitions": 6}))
        .await;
    // Produce through n1 to every partition (most owned elsewhere: forwarded over TLS).
    eventually(Duration::from_secs(10), Duration::from_millis(50), || {
        let a = admin[1].clone();
        async move {
            let r = a.get("/v1/topics/tls-orders").await;
            anyhow::ensure!(r.status == 200, "{}", r.describe());
            Ok(())
        }
    })
    .await;
    for p in 0..6 {
        admin[1]
            .produce_ok("tls-orders", &format!("partition={p}"), format!("m{p}"))
            .await;
    }
    // Consume all six through n2.
    let mut got = Vec::new();
    while got.len() < 6 {
        let m = admin[2].consume_msg("tls-orders", "wait=2s").await;
        admin[2].ack_ok("tls-orders", m.handle()).await;
        got.push(String::from_utf8(m.payload_bytes()).unwrap());
    }
    got.sort();
    assert_eq!(got, (0..6).map(|p| format!("m{p}")).collect::<Vec<_>>());
    for n in &c.nodes {
        let log = n.server.log_tail(100_000);
        assert!(log.contains("cluster port listening"), "{}", n.id);
        assert!(
            !log.contains("cluster port is plaintext"),
            "{} warned plaintext",
            n.id
        );
    }

    // The right secret, a certificate of another CA: the TLS handshake fails, never admitted.
    let evil = TestCa::new("evil-ca").issue(dir.path(), "n3", &["127.0.0.1"]);
    let i = c
        .add_node_unready(vec![
            (
                "NARAD_CLUSTER_TLS_CERT_FILE".into(),
                evil.cert.display().to_string(),
            ),
            (
                "NARAD_CLUSTER_TLS_KEY_FILE".into(),
                evil.key.display().to_string(),
            ),
            (
                "NARAD_CLUSTER_TLS_CA_FILE".into(),
                evil.ca.display().to_string(),
            ),
        ])
        .await;
    eventually(Duration::from_secs(20), Duration::from_millis(100), || {
        let log = c.nodes[0].server.log_tail(100_000);
        async move {
            anyhow::ensure!(
                log.contains("tls handshake failed"),
                "no refusal logged yet"
            );
            Ok(())
        }
    })
    .await;
    assert_eq!(c.http(i).get("/readyz").await.status, 503);
    let members = admin[0].get("/v1/cluster/members").await.expect_json(200);
    assert_eq!(members["members"].as_array().unwrap().len(), 3, "{members}");
}
