//! The authorization matrix (SPEC §3.3–§3.10, §4.2, §4.3): every route × every kind of
//! caller — no credentials, wrong password, a user without the grant, with the grant, the
//! topic owner, a non-root admin, root — with the exact status each must get.
//!
//! One table, two runs: `tests/tests/security.rs::route_matrix` sends every row to one node,
//! `e2e/tests/security.rs` sends every row through each node of a three-node cluster (any
//! node serves any request, so the expectations are the same).
//!
//! A run: [`clients`] per node, [`setup`] once (users, grants, topics, messages), then
//! [`check_row`] for each row of [`rows`] and node. Rows that create or delete something have
//! `{c}` in path or body; it becomes the caller's name plus the node's suffix (`""` on one
//! node, `"-n1"` for node 1 of a cluster), so no two requests touch the same name. [`setup`]
//! creates the victims of every suffix it is given.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::checks::Checks;
use crate::http::{basic_auth, Http, Resp};
use crate::wait::eventually;

/// The callers of the matrix, in column order.
pub const CALLERS: [&str; 7] = [
    "none", "wrong", "nogrant", "granted", "owner", "admin2", "root",
];

/// Index of the topic owner in [`CALLERS`] (and in [`clients`]).
pub const OWNER: usize = 4;
/// Index of root in [`CALLERS`] (and in [`clients`]).
pub const ROOT: usize = 6;

/// One row: a request (path and body may contain `{c}`, replaced by the caller's name and
/// the node's suffix) and the expected status per caller (in [`CALLERS`] order).
pub struct Row {
    pub method: Method,
    pub path: &'static str,
    pub body: Option<&'static str>,
    pub want: [u16; 7],
}

fn row(method: Method, path: &'static str, body: Option<&'static str>, want: [u16; 7]) -> Row {
    Row {
        method,
        path,
        body,
        want,
    }
}

/// Every route × {no credentials, wrong password, user without the grant, with the grant,
/// owner, non-root admin, root}: the exact SPEC status (§3.3–§3.9, §4.2, §4.3). Needs the
/// state [`setup`] makes.
pub fn rows() -> Vec<Row> {
    use Method as M;
    #[rustfmt::skip]
    let rows = vec![
        // topics (§3.3)
        row(M::POST, "/v1/topics", Some(r#"{"name":"orders-new-{c}"}"#), [401, 401, 403, 201, 403, 201, 201]),
        row(M::POST, "/v1/topics", Some(r#"{"name":"payments-new-{c}"}"#), [401, 401, 403, 403, 403, 201, 201]),
        row(M::GET, "/v1/topics", None, [401, 401, 200, 200, 200, 200, 200]),
        row(M::GET, "/v1/topics?limit=1", None, [401, 401, 200, 200, 200, 200, 200]),
        row(M::GET, "/v1/topics/orders", None, [401, 401, 403, 200, 200, 200, 200]),
        row(M::GET, "/v1/topics/orders?partition=0", None, [401, 401, 403, 200, 200, 200, 200]),
        // Missing: 404 only for those whose grants match the name (or admins); names do not leak.
        row(M::GET, "/v1/topics/orders-missing", None, [401, 401, 403, 404, 403, 404, 404]),
        row(M::GET, "/v1/topics/zzz-missing", None, [401, 401, 403, 403, 403, 404, 404]),
        // Manage: 404 for a missing topic first, then 403 for a non-owner.
        row(M::PATCH, "/v1/topics/orders", Some(r#"{"retention_ms":0}"#), [401, 401, 403, 403, 200, 200, 200]),
        row(M::PATCH, "/v1/topics/zzz-missing", Some(r#"{"retention_ms":0}"#), [401, 401, 404, 404, 404, 404, 404]),
        // Queue administration (ext §3.8): manage, like PATCH.
        row(M::POST, "/v1/topics/orders-del-{c}/pause", None, [401, 401, 403, 403, 200, 200, 200]),
        row(M::POST, "/v1/topics/orders-del-{c}/resume", None, [401, 401, 403, 403, 200, 200, 200]),
        row(M::POST, "/v1/topics/orders-del-{c}/purge", None, [401, 401, 403, 403, 200, 200, 200]),
        row(M::POST, "/v1/topics/orders-del-{c}/seek", Some(r#"{"timestamp":0}"#), [401, 401, 403, 403, 200, 200, 200]),
        row(M::POST, "/v1/topics/zzz-missing/pause", None, [401, 401, 404, 404, 404, 404, 404]),
        row(M::POST, "/v1/topics/zzz-missing/purge", None, [401, 401, 404, 404, 404, 404, 404]),
        row(M::POST, "/v1/topics/zzz-missing/seek", Some(r#"{"timestamp":0}"#), [401, 401, 404, 404, 404, 404, 404]),
        row(M::DELETE, "/v1/topics/orders-del-{c}", None, [401, 401, 403, 403, 204, 204, 204]),
        row(M::DELETE, "/v1/topics/zzz-missing", None, [401, 401, 404, 404, 404, 404, 404]),
        // produce (§3.4): the grant first (even for a missing topic), then 404. Owning is not
        // a produce grant.
        row(M::POST, "/v1/topics/orders/produce", Some("hello"), [401, 401, 403, 202, 403, 202, 202]),
        row(M::POST, "/v1/topics/orders-missing/produce", Some("hello"), [401, 401, 403, 404, 403, 404, 404]),
        row(M::POST, "/v1/topics/orders/produce/batch", Some(r#"{"messages":[{"payload":"x"}]}"#), [401, 401, 403, 202, 403, 202, 202]),
        // consume, replay, ack, extend, nack, batch ack (§3.5, §3.6): the consume grant.
        row(M::GET, "/v1/topics/orders/consume?wait=0", None, [401, 401, 403, 200, 403, 200, 200]),
        row(M::GET, "/v1/topics/orders/consume?partition=0&offset=0", None, [401, 401, 403, 200, 403, 200, 200]),
        row(M::GET, "/v1/topics/orders-missing/consume", None, [401, 401, 403, 404, 403, 404, 404]),
        row(M::POST, "/v1/topics/orders/ack?receipt_handle=0:0:1", None, [401, 401, 403, 410, 403, 410, 410]),
        row(M::POST, "/v1/topics/orders/ack?receipt_handle=0:0:1&extend=true", None, [401, 401, 403, 410, 403, 410, 410]),
        row(M::POST, "/v1/topics/orders/ack?receipt_handle=0:0:1&extend=0", None, [401, 401, 403, 410, 403, 410, 410]),
        row(M::POST, "/v1/topics/orders/ack", Some(r#"{"receipt_handles":["0:0:1"]}"#), [401, 401, 403, 200, 403, 200, 200]),
        row(M::POST, "/v1/topics/orders-missing/ack?receipt_handle=0:0:1", None, [401, 401, 403, 404, 403, 404, 404]),
        // cluster (§3.9): any authenticated user
        row(M::GET, "/v1/cluster/members", None, [401, 401, 200, 200, 200, 200, 200]),
        row(M::GET, "/v1/cluster/moves", None, [401, 401, 200, 200, 200, 200, 200]),
        // users (§3.8): admin
        row(M::POST, "/v1/users", Some(r#"{"username":"new-{c}","password":"pw"}"#), [401, 401, 403, 403, 403, 201, 201]),
        row(M::GET, "/v1/users", None, [401, 401, 403, 403, 403, 200, 200]),
        row(M::GET, "/v1/users/granted", None, [401, 401, 403, 403, 403, 200, 200]),
        row(M::GET, "/v1/users/ghost", None, [401, 401, 403, 403, 403, 404, 404]),
        row(M::PUT, "/v1/users/victim-{c}/grants", Some(r#"{"grants":[{"action":"consume","patterns":["x"]}]}"#), [401, 401, 403, 403, 403, 200, 200]),
        row(M::PUT, "/v1/users/ghost/grants", Some(r#"{"grants":[]}"#), [401, 401, 403, 403, 403, 404, 404]),
        row(M::PUT, "/v1/users/victim-{c}/password", Some(r#"{"new_password":"np"}"#), [401, 401, 403, 403, 403, 204, 204]),
        row(M::PUT, "/v1/users/ghost/password", Some(r#"{"new_password":"np"}"#), [401, 401, 403, 403, 403, 404, 404]),
        row(M::PUT, "/v1/users/victim-{c}/quotas", Some(r#"{"max_topics":5}"#), [401, 401, 403, 403, 403, 200, 200]),
        row(M::PUT, "/v1/users/ghost/quotas", Some(r#"{}"#), [401, 401, 403, 403, 403, 404, 404]),
        row(M::DELETE, "/v1/users/victim-{c}", None, [401, 401, 403, 403, 403, 204, 204]),
        row(M::DELETE, "/v1/users/ghost", None, [401, 401, 403, 403, 403, 404, 404]),
        // routing: unknown route and wrong method still need credentials under /v1
        row(M::GET, "/v1/nope", None, [401, 401, 404, 404, 404, 404, 404]),
        row(M::DELETE, "/v1/topics", None, [401, 401, 405, 405, 405, 405, 405]),
        // probes and metrics never need credentials (§3.10)
        row(M::GET, "/healthz", None, [200; 7]),
        row(M::GET, "/readyz", None, [200; 7]),
        row(M::GET, "/metrics", None, [200; 7]),
    ];
    rows
}

/// The callers' clients for one node (`anon`: that node's client without credentials), in
/// [`CALLERS`] order; root is `admin` with `root_password`.
pub fn clients(anon: &Http, root_password: &str) -> Vec<Http> {
    vec![
        anon.anonymous(),
        anon.as_user("granted", "not-the-password"),
        anon.as_user("nogrant", "pw-nogrant"),
        anon.as_user("granted", "pw-granted"),
        anon.as_user("owner", "pw-owner"),
        anon.as_user("admin2", "pw-admin2"),
        anon.as_user("admin", root_password),
    ]
}

/// `POST /v1/users` as `by`; expects `201` and returns the user.
pub async fn add_user(by: &Http, name: &str, password: &str, grants: Value) -> Value {
    let u = by
        .post_json(
            "/v1/users",
            &json!({"username": name, "password": password, "grants": grants}),
        )
        .await
        .expect_json(201);
    assert_eq!(u["username"], name);
    u
}

/// The topics [`setup`] makes for `suffixes`.
fn topics(suffixes: &[&str]) -> Vec<String> {
    let mut t = vec!["orders".to_string(), "orders-del-x".to_string()];
    for s in suffixes {
        t.extend(CALLERS.iter().map(|c| format!("orders-del-{c}{s}")));
    }
    t
}

/// The users [`setup`] makes for `suffixes`.
fn users(suffixes: &[&str]) -> Vec<String> {
    let mut u: Vec<String> = ["nogrant", "granted", "owner", "admin2"]
        .map(String::from)
        .into();
    for s in suffixes {
        u.extend(CALLERS.iter().map(|c| format!("victim-{c}{s}")));
    }
    u
}

/// Makes what the rows need, through `clients` (one node's, from [`clients`]): the users,
/// `orders` owned by `owner` with 10 visible messages in partition 0, and per caller and
/// suffix a deletable topic `orders-del-{c}{suffix}` and a victim user `victim-{c}{suffix}`.
pub async fn setup(clients: &[Http], suffixes: &[&str]) {
    let root = &clients[ROOT];
    let owner = &clients[OWNER];
    add_user(
        root,
        "nogrant",
        "pw-nogrant",
        json!([{"action": "produce", "patterns": ["payments-*"]}]),
    )
    .await;
    add_user(
        root,
        "granted",
        "pw-granted",
        json!([
            {"action": "produce", "patterns": ["orders*"]},
            {"action": "consume", "patterns": ["orders*"]},
            {"action": "create", "patterns": ["orders*"]}
        ]),
    )
    .await;
    add_user(
        root,
        "owner",
        "pw-owner",
        json!([{"action": "create", "patterns": ["orders", "orders-del-*"]}]),
    )
    .await;
    add_user(root, "admin2", "pw-admin2", json!([{"action": "admin"}])).await;

    let rec = owner.create_topic_named("orders").await;
    assert_eq!(rec["owner"], "owner", "the creator is the owner: {rec}");
    let rec = owner
        .create_topic(&json!({"name": "orders-del-x", "owner": "someone-else"}))
        .await;
    assert_eq!(rec["owner"], "owner", "a sent owner is ignored: {rec}");
    for s in suffixes {
        for c in CALLERS {
            owner
                .create_topic_named(&format!("orders-del-{c}{s}"))
                .await;
            add_user(root, &format!("victim-{c}{s}"), "pw-victim", json!([])).await;
        }
    }
    for i in 0..10 {
        root.produce_ok("orders", "partition=0", format!("m{i}"))
            .await;
    }
    root.wait_visible("orders", 0, 10).await;
}

/// Waits until the node of `clients` has applied everything [`setup`] made (users and
/// grants arrive through the metadata log): every user with credentials authenticates
/// there, and root sees every user and topic.
pub async fn wait_setup_applied(clients: &[Http], suffixes: &[&str], timeout: Duration) {
    let want_users = users(suffixes);
    let want_topics = topics(suffixes);
    eventually(timeout, Duration::from_millis(50), || {
        let (want_users, want_topics) = (&want_users, &want_topics);
        async move {
            // Not the wrong password: it would spend a throttle attempt (SPEC §4.1).
            for (i, http) in clients.iter().enumerate().skip(2) {
                let r = http.get("/v1/cluster/members").await;
                anyhow::ensure!(
                    r.status == 200,
                    "{} as {}: {}",
                    http.base(),
                    CALLERS[i],
                    r.describe()
                );
            }
            let root = &clients[ROOT];
            let r = root.get("/v1/users").await;
            anyhow::ensure!(r.status == 200, "{}", r.describe());
            let have: Vec<String> = r
                .json()
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|u| u["username"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let missing: Vec<&String> = want_users.iter().filter(|u| !have.contains(u)).collect();
            anyhow::ensure!(
                missing.is_empty(),
                "{}: users not there yet: {missing:?}",
                root.base()
            );
            let r = root.get("/v1/topics?limit=1000").await;
            anyhow::ensure!(r.status == 200, "{}", r.describe());
            let have: Vec<String> = r.json()["topics"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t["name"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let missing: Vec<&String> = want_topics.iter().filter(|t| !have.contains(t)).collect();
            anyhow::ensure!(
                missing.is_empty(),
                "{}: topics not there yet: {missing:?}",
                root.base()
            );
            Ok(())
        }
    })
    .await;
}

/// Whether the `401` carries what SPEC §3.11 asks for.
pub fn check_401(c: &mut Checks, label: &str, r: &Resp) {
    c.error(label, r, 401);
    c.check(
        r.header("www-authenticate") == Some("Basic realm=\"narad\""),
        || {
            format!(
                "{label}: 401 without WWW-Authenticate: Basic realm=\"narad\": {}",
                r.describe()
            )
        },
    );
}

/// Sends `r` once per caller through `clients` (one node's), `{c}` replaced by the caller's
/// name and `suffix`, and records every status that is not the expected one (error statuses
/// with the uniform error body, `401` with the challenge). `via` names the node in labels
/// (empty on one node). Returns how many requests it sent.
pub async fn check_row(
    c: &mut Checks,
    r: &Row,
    clients: &[Http],
    suffix: &str,
    via: &str,
) -> usize {
    for (i, caller) in CALLERS.iter().enumerate() {
        let tag = format!("{caller}{suffix}");
        let path = r.path.replace("{c}", &tag);
        let mut req = clients[i].request(r.method.clone(), path.clone());
        if let Some(b) = r.body {
            req = req.body(b.replace("{c}", &tag).into_bytes());
        }
        let resp = req.send().await;
        let want = r.want[i];
        let label = if via.is_empty() {
            format!("{} {path} as {caller}", r.method)
        } else {
            format!("{} {path} as {caller} via {via}", r.method)
        };
        match want {
            401 => check_401(c, &label, &resp),
            403 | 404 | 405 | 410 => {
                c.error(&label, &resp, want);
            }
            _ => {
                c.status(&label, &resp, want);
            }
        }
    }
    CALLERS.len()
}

/// Malformed credentials through `anon` (a node's client): `401` with the challenge, never
/// `400` or `500`. `via` names the node in labels (empty on one node). Returns how many
/// requests it sent.
pub async fn check_malformed_credentials(c: &mut Checks, anon: &Http, via: &str) -> usize {
    let cases = [
        ("bearer", "Bearer abc".to_string()),
        ("not base64", "Basic !!!".to_string()),
        ("no colon", "Basic YWRtaW4=".to_string()),
        ("unknown user", basic_auth("ghost", "pw")),
    ];
    for (label, value) in &cases {
        let r = anon
            .anonymous()
            .request(Method::GET, "/v1/topics")
            .header("authorization", value)
            .send()
            .await;
        let label = if via.is_empty() {
            label.to_string()
        } else {
            format!("{label} via {via}")
        };
        check_401(c, &label, &r);
    }
    cases.len()
}
