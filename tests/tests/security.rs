//! Security (SPEC §3.8, §4, §7.1, §9) against a real `narad` started without `--dev`:
//! authentication on every `/v1` route, authorization per route (the full matrix of callers),
//! grant patterns, escalation rules, the failed-login throttle, the verified-credential
//! cache, root seeding, readiness, visibility in listings, and the `narad user` commands.
//!
//! The server hashes with its normal argon2id parameters, so the tests keep users few.

use std::process::Command;
use std::time::{Duration, Instant};

use narad_tests::auth_matrix::{self, add_user, check_401};
use narad_tests::*;

const ROOT_PW: &str = "root-Pa55-e7c1";

/// JSON logs at info level whatever the test environment says (the tests read audit lines).
fn logged(opts: ServerOpts) -> ServerOpts {
    opts.env("NARAD_LOG_FORMAT", "json")
        .env("NARAD_LOG_LEVEL", "info")
}

/// A secured server seeded with `ROOT_PW`; returns it with an anonymous and a root client.
async fn secured() -> (Server, Http, Http) {
    let server = Server::start(logged(ServerOpts::secured(ROOT_PW))).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    (server, anon, root)
}

async fn put_json(http: &Http, path: &str, v: &Value) -> Resp {
    http.request(Method::PUT, path).json(v).send().await
}

fn names(list: &Value) -> Vec<String> {
    list["topics"]
        .as_array()
        .unwrap_or_else(|| panic!("no topics array in {list}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every route × {no credentials, wrong password, user without the grant, with the grant,
/// owner, non-root admin, root}: the exact SPEC status (§3.3–§3.9, §4.2, §4.3); the table is
/// [`auth_matrix::rows`], shared with the three-node run in `e2e/tests/security.rs`.
#[tokio::test]
async fn route_matrix() {
    let (server, anon, _root) = secured().await;
    let clients = auth_matrix::clients(&anon, ROOT_PW);
    auth_matrix::setup(&clients, &[""]).await;

    let mut c = Checks::new("security route matrix");
    for r in &auth_matrix::rows() {
        auth_matrix::check_row(&mut c, r, &clients, "", "").await;
    }
    c.finish();

    let mut c = Checks::new("malformed credentials");
    auth_matrix::check_malformed_credentials(&mut c, &anon, "").await;
    c.finish();
    drop(server);
}

/// SPEC §4.2: `orders-*` matches `orders-` and `orders-x` but neither `orders` nor `ordersx`;
/// an exact pattern matches only that name; `*` matches everything.
#[tokio::test]
async fn grant_patterns() {
    let (_server, anon, root) = secured().await;
    for t in ["orders", "orders-", "ordersx", "orders-a", "other"] {
        root.create_topic_named(t).await;
    }
    add_user(
        &root,
        "wild",
        "pw",
        json!([{"action": "produce", "patterns": ["orders-*"]}]),
    )
    .await;
    add_user(
        &root,
        "exact",
        "pw",
        json!([{"action": "produce", "patterns": ["orders"]}]),
    )
    .await;
    add_user(
        &root,
        "all",
        "pw",
        json!([{"action": "produce", "patterns": ["*"]}]),
    )
    .await;
    let table: [(&str, [u16; 5]); 3] = [
        ("wild", [403, 202, 403, 202, 403]),
        ("exact", [202, 403, 403, 403, 403]),
        ("all", [202, 202, 202, 202, 202]),
    ];
    let mut c = Checks::new("grant patterns");
    for (user, want) in table {
        let http = anon.as_user(user, "pw");
        for (t, w) in ["orders", "orders-", "ordersx", "orders-a", "other"]
            .iter()
            .zip(want)
        {
            let r = http.produce(t, "", "x").await;
            c.status(&format!("produce to {t} as {user}"), &r, w);
        }
    }
    // Visibility follows the same matching: an existing but unmatched topic is 403, a missing
    // matched one 404.
    let wild = anon.as_user("wild", "pw");
    c.error(
        "get orders as wild",
        &wild.get("/v1/topics/orders").await,
        403,
    );
    c.error(
        "get ordersx as wild",
        &wild.get("/v1/topics/ordersx").await,
        403,
    );
    c.status(
        "get orders- as wild",
        &wild.get("/v1/topics/orders-").await,
        200,
    );
    c.error(
        "get orders-zz as wild",
        &wild.get("/v1/topics/orders-zz").await,
        404,
    );
    c.finish();
}

/// SPEC §4.2: only root grants admin; nobody changes their own grants; root cannot be deleted
/// nor regranted; nobody deletes themselves; only root changes root's password; one's own
/// password needs the right current one.
#[tokio::test]
async fn escalation_is_refused() {
    let (_server, anon, root) = secured().await;
    add_user(&root, "admin2", "pw-a2", json!([{"action": "admin"}])).await;
    add_user(
        &root,
        "plain",
        "pw-plain",
        json!([{"action": "consume", "patterns": ["x"]}]),
    )
    .await;
    add_user(&root, "target", "pw-target", json!([])).await;
    let admin2 = anon.as_user("admin2", "pw-a2");
    let plain = anon.as_user("plain", "pw-plain");
    let admin_grant = json!({"grants": [{"action": "admin"}]});
    let scoped = json!({"grants": [{"action": "produce", "patterns": ["t"]}]});

    let mut c = Checks::new("escalation");
    let r = admin2
        .post_json(
            "/v1/users",
            &json!({"username": "sneaky", "password": "p", "grants": [{"action": "admin"}]}),
        )
        .await;
    c.error("non-root admin creates an admin", &r, 403);
    c.error(
        "the refused user does not exist",
        &root.get("/v1/users/sneaky").await,
        404,
    );
    let r = put_json(&admin2, "/v1/users/target/grants", &admin_grant).await;
    c.error("non-root admin grants admin", &r, 403);
    let r = put_json(&admin2, "/v1/users/target/grants", &scoped).await;
    c.status("non-root admin grants a scoped action", &r, 200);
    let r = put_json(&admin2, "/v1/users/admin2/grants", &scoped).await;
    c.error("admin changes own grants", &r, 403);
    let r = put_json(&plain, "/v1/users/plain/grants", &admin_grant).await;
    c.error("user grants themselves admin", &r, 403);
    let r = put_json(&root, "/v1/users/admin/grants", &scoped).await;
    c.error("root's grants are fixed (root)", &r, 403);
    let r = put_json(&admin2, "/v1/users/admin/grants", &scoped).await;
    c.error("root's grants are fixed (admin2)", &r, 403);
    c.error(
        "admin2 deletes root",
        &admin2.delete("/v1/users/admin").await,
        403,
    );
    c.error(
        "root deletes root",
        &root.delete("/v1/users/admin").await,
        403,
    );
    c.error(
        "admin2 deletes itself",
        &admin2.delete("/v1/users/admin2").await,
        403,
    );
    c.error(
        "user deletes itself",
        &plain.delete("/v1/users/plain").await,
        403,
    );
    let r = put_json(
        &admin2,
        "/v1/users/admin/password",
        &json!({"new_password": "x"}),
    )
    .await;
    c.error("admin2 resets root's password", &r, 403);
    let r = put_json(
        &admin2,
        "/v1/users/admin/password",
        &json!({"current_password": ROOT_PW, "new_password": "x"}),
    )
    .await;
    c.error("admin2 changes root's password knowing it", &r, 403);
    let r = put_json(
        &plain,
        "/v1/users/target/password",
        &json!({"new_password": "x"}),
    )
    .await;
    c.error("user changes another's password", &r, 403);
    let r = put_json(
        &plain,
        "/v1/users/plain/password",
        &json!({"new_password": "x"}),
    )
    .await;
    c.error("own password without current_password", &r, 403);
    let r = put_json(
        &plain,
        "/v1/users/plain/password",
        &json!({"current_password": "nope", "new_password": "x"}),
    )
    .await;
    c.error("own password with a wrong current_password", &r, 403);
    c.status(
        "still the old password",
        &plain.get("/v1/topics").await,
        200,
    );
    // Root may grant admin; the new admin manages users.
    let r = put_json(&root, "/v1/users/target/grants", &admin_grant).await;
    c.status("root grants admin", &r, 200);
    let target = anon.as_user("target", "pw-target");
    c.status("new admin lists users", &target.get("/v1/users").await, 200);
    c.finish();

    // The allowed password changes apply from the next request.
    put_json(
        &plain,
        "/v1/users/plain/password",
        &json!({"current_password": "pw-plain", "new_password": "pw-plain-2"}),
    )
    .await
    .expect(204);
    plain.get("/v1/topics").await.expect_error(401);
    anon.as_user("plain", "pw-plain-2")
        .get("/v1/topics")
        .await
        .expect(200);
    put_json(
        &admin2,
        "/v1/users/plain/password",
        &json!({"new_password": "pw-plain-3"}),
    )
    .await
    .expect(204);
    anon.as_user("plain", "pw-plain-3")
        .get("/v1/topics")
        .await
        .expect(200);
    put_json(
        &root,
        "/v1/users/admin/password",
        &json!({"current_password": ROOT_PW, "new_password": "root-2"}),
    )
    .await
    .expect(204);
    root.get("/v1/users").await.expect_error(401);
    anon.as_user("admin", "root-2")
        .get("/v1/users")
        .await
        .expect(200);
}

/// SPEC §3.8: shapes, the `400`s, `404`, `409`; hashes and passwords never returned.
#[tokio::test]
async fn user_routes_shapes_and_validation() {
    let (server, _anon, root) = secured().await;
    let u = add_user(
        &root,
        "billing",
        "pw-billing-x",
        json!([{"action": "produce", "patterns": ["orders-*"]}]),
    )
    .await;
    let obj = u.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["created_at_ms", "grants", "updated_at_ms", "username"],
        "{u}"
    );
    assert_eq!(
        u["grants"],
        json!([{"action": "produce", "patterns": ["orders-*"]}])
    );
    assert!(u["created_at_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let list = root.get("/v1/users").await.expect_json(200);
    let list = list.as_array().expect("a JSON array");
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["username"], "admin");
    assert_eq!(list[0]["root"], true);
    assert_eq!(list[0]["grants"], json!([{"action": "admin"}]));
    assert_eq!(list[1]["username"], "billing");
    assert!(list[1].get("root").is_none());
    assert_eq!(
        root.get("/v1/users/billing").await.expect_json(200),
        u,
        "GET one"
    );
    let text = serde_json::to_string(list).unwrap();
    assert!(
        !text.contains("argon2") && !text.contains("password"),
        "{text}"
    );

    let mut c = Checks::new("user validation");
    for (label, body) in [
        ("bad username", r#"{"username":"bad name","password":"p"}"#),
        ("empty username", r#"{"username":"","password":"p"}"#),
        (
            "long username",
            &*format!(r#"{{"username":"{}","password":"p"}}"#, "u".repeat(65)),
        ),
        ("empty password", r#"{"username":"u1","password":""}"#),
        ("missing password", r#"{"username":"u1"}"#),
        (
            "unknown action",
            r#"{"username":"u1","password":"p","grants":[{"action":"publish","patterns":["x"]}]}"#,
        ),
        (
            "scoped without patterns",
            r#"{"username":"u1","password":"p","grants":[{"action":"consume"}]}"#,
        ),
        (
            "scoped with empty patterns",
            r#"{"username":"u1","password":"p","grants":[{"action":"consume","patterns":[]}]}"#,
        ),
        (
            "bad pattern",
            r#"{"username":"u1","password":"p","grants":[{"action":"create","patterns":["a*b"]}]}"#,
        ),
        (
            "empty pattern",
            r#"{"username":"u1","password":"p","grants":[{"action":"create","patterns":[""]}]}"#,
        ),
        (
            "admin with patterns",
            r#"{"username":"u1","password":"p","grants":[{"action":"admin","patterns":["*"]}]}"#,
        ),
        (
            "unknown field",
            r#"{"username":"u1","password":"p","root":true}"#,
        ),
        ("not JSON", "nope"),
        ("trailing data", r#"{"username":"u1","password":"p"} {}"#),
    ] {
        let r = root
            .send_raw_json(Method::POST, "/v1/users", body.as_bytes().to_vec())
            .await;
        c.error(&format!("create: {label}"), &r, 400);
    }
    let r = root
        .post_json(
            "/v1/users",
            &json!({"username": "billing", "password": "x"}),
        )
        .await;
    c.error("create: taken", &r, 409);
    let r = root
        .post_json("/v1/users", &json!({"username": "admin", "password": "x"}))
        .await;
    c.error("create: root's name", &r, 409);
    for (label, body) in [
        ("grants missing", "{}"),
        ("grants not an array", r#"{"grants":"admin"}"#),
        ("unknown action", r#"{"grants":[{"action":"nope"}]}"#),
        ("unknown field", r#"{"grants":[],"x":1}"#),
    ] {
        let r = root
            .send_raw_json(
                Method::PUT,
                "/v1/users/billing/grants",
                body.as_bytes().to_vec(),
            )
            .await;
        c.error(&format!("grants: {label}"), &r, 400);
    }
    for (label, body) in [
        ("empty new_password", r#"{"new_password":""}"#),
        ("missing new_password", "{}"),
        ("unknown field", r#"{"new_password":"x","old":"y"}"#),
    ] {
        let r = root
            .send_raw_json(
                Method::PUT,
                "/v1/users/billing/password",
                body.as_bytes().to_vec(),
            )
            .await;
        c.error(&format!("password: {label}"), &r, 400);
    }
    c.finish();

    // `{"grants":[]}` removes every grant (and the field disappears).
    let before = root.get("/v1/users/billing").await.expect_json(200);
    let u = put_json(&root, "/v1/users/billing/grants", &json!({"grants": []}))
        .await
        .expect_json(200);
    assert!(u.get("grants").is_none(), "{u}");
    assert!(u["updated_at_ms"].as_u64() >= before["updated_at_ms"].as_u64());
    assert_eq!(u["created_at_ms"], before["created_at_ms"]);
    root.delete("/v1/users/billing").await.expect(204);
    root.get("/v1/users/billing").await.expect_error(404);
    root.delete("/v1/users/billing").await.expect_error(404);

    // Audit lines for every change; no password or hash in the log.
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    for event in ["user.create", "user.grants", "user.delete"] {
        assert!(
            log.lines()
                .any(|l| l.contains("\"audit\"") && l.contains(event) && l.contains("billing")),
            "no audit line for {event}:\n{log}"
        );
    }
    assert!(!log.contains("pw-billing-x"), "a password was logged");
    assert!(!log.contains("$argon2"), "a hash was logged");
    assert!(!log.contains(ROOT_PW), "the root password was logged");
}

/// SPEC §4.1: 5 failed attempts per username, then `429` with `Retry-After`; the same wrong
/// password repeated is `401` without using an attempt; other users and already verified
/// credentials are unaffected; `auth.failed` and `auth.throttled` are audited.
#[tokio::test]
async fn failed_login_throttle() {
    let (server, anon, root) = secured().await;
    for u in ["t1", "t2", "t3"] {
        add_user(&root, u, &format!("pw-{u}"), json!([])).await;
    }
    let get = |u: &str, p: &str| {
        let h = anon.as_user(u, p);
        async move { h.get("/v1/topics").await }
    };

    let mut c = Checks::new("throttle");
    for i in 0..5 {
        let r = get("t1", &format!("wrong-{i}")).await;
        check_401(&mut c, &format!("t1 wrong #{i}"), &r);
    }
    let r = get("t1", "wrong-5").await;
    c.error("t1 sixth wrong password", &r, 429);
    let retry: Option<u64> = r.header("retry-after").and_then(|v| v.parse().ok());
    c.check(retry.is_some_and(|s| (1..=12).contains(&s)), || {
        format!("429 Retry-After should be 1..=12 s: {}", r.describe())
    });
    let r = get("t1", "pw-t1").await;
    c.error(
        "t1 right password while throttled (never verified)",
        &r,
        429,
    );
    c.status("another user is unaffected", &get("t2", "pw-t2").await, 200);

    // t2 verified above: an attacker exhausting t2's attempts does not lock t2's client out.
    for i in 0..6 {
        get("t2", &format!("attack-{i}")).await;
    }
    c.error("t2 attacked", &get("t2", "attack-new").await, 429);
    c.status(
        "t2's verified credentials still pass",
        &get("t2", "pw-t2").await,
        200,
    );

    // The same wrong password within 60 s: answered from the negative cache.
    check_401(&mut c, "t3 first wrong", &get("t3", "oops").await);
    for i in 0..20 {
        check_401(
            &mut c,
            &format!("t3 same wrong #{i}"),
            &get("t3", "oops").await,
        );
    }
    for i in 0..4 {
        check_401(
            &mut c,
            &format!("t3 distinct wrong #{i}"),
            &get("t3", &format!("w{i}")).await,
        );
    }
    c.error("t3 sixth distinct failure", &get("t3", "w-last").await, 429);
    check_401(
        &mut c,
        "t3 the cached wrong one is still 401",
        &get("t3", "oops").await,
    );
    c.finish();

    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let audit = |event: &str, user: &str| {
        log.lines().any(|l| {
            l.contains("\"component\":\"audit\"")
                && l.contains(&format!("\"event\":\"{event}\""))
                && l.contains(&format!("\"actor\":\"{user}\""))
        })
    };
    assert!(audit("auth.failed", "t1"), "no auth.failed line:\n{log}");
    assert!(
        audit("auth.throttled", "t1"),
        "no auth.throttled line:\n{log}"
    );
    assert!(
        !log.contains("wrong-3") && !log.contains("oops"),
        "a tried password was logged"
    );
}

/// SPEC §4.1/§4.2: changes to a user apply from the next request even on a keep-alive
/// connection whose credentials are cached: password change, grants change, deletion.
#[tokio::test]
async fn user_changes_invalidate_cached_credentials() {
    let (_server, anon, root) = secured().await;
    root.create_topic_named("t").await;
    add_user(
        &root,
        "bob",
        "old",
        json!([{"action": "produce", "patterns": ["t"]}]),
    )
    .await;
    let bob_old = anon.as_user("bob", "old");
    for _ in 0..3 {
        bob_old.produce("t", "", "x").await.expect(202);
    }
    // Grants come from the current record, never from the cache.
    put_json(&root, "/v1/users/bob/grants", &json!({"grants": []}))
        .await
        .expect(200);
    bob_old.produce("t", "", "x").await.expect_error(403);
    put_json(
        &root,
        "/v1/users/bob/grants",
        &json!({"grants": [{"action": "produce", "patterns": ["t"]}]}),
    )
    .await
    .expect(200);
    bob_old.produce("t", "", "x").await.expect(202);
    // Password reset by an admin: the old password fails on the very next request.
    put_json(
        &root,
        "/v1/users/bob/password",
        &json!({"new_password": "new"}),
    )
    .await
    .expect(204);
    let r = bob_old.produce("t", "", "x").await;
    r.expect_error(401);
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"narad\""));
    let bob_new = anon.as_user("bob", "new");
    bob_new.produce("t", "", "x").await.expect(202);
    // Deletion: 401 at once; re-creation with the same name does not revive old entries.
    root.delete("/v1/users/bob").await.expect(204);
    bob_new.produce("t", "", "x").await.expect_error(401);
    add_user(&root, "bob", "third", json!([])).await;
    bob_new.produce("t", "", "x").await.expect_error(401);
    anon.as_user("bob", "third")
        .produce("t", "", "x")
        .await
        .expect_error(403);
}

/// SPEC §4.4/§7.1: `NARAD_ADMIN_PASSWORD` seeds root `admin` on first start; later starts
/// never change an existing root (a changed password survives a restart with the variable
/// still set), and the password is never logged.
#[tokio::test]
async fn root_seeded_from_env_and_never_reseeded() {
    let (mut server, anon, root) = secured().await;
    let users = root.get("/v1/users").await.expect_json(200);
    assert_eq!(
        users,
        json!([{"username": "admin", "grants": [{"action": "admin"}], "root": true,
                "created_at_ms": users[0]["created_at_ms"], "updated_at_ms": users[0]["updated_at_ms"]}])
    );
    anon.as_user("admin", "wrong")
        .get("/v1/users")
        .await
        .expect_error(401);
    put_json(
        &root,
        "/v1/users/admin/password",
        &json!({"current_password": ROOT_PW, "new_password": "changed-pw"}),
    )
    .await
    .expect(204);
    server.restart().await;
    let anon = Http::new(server.url());
    anon.as_user("admin", "changed-pw")
        .get("/v1/users")
        .await
        .expect(200);
    anon.as_user("admin", ROOT_PW)
        .get("/v1/users")
        .await
        .expect_error(401);
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(!log.contains(ROOT_PW), "NARAD_ADMIN_PASSWORD was logged");
    assert!(!log.contains("changed-pw"), "a password was logged");
}

/// The generated root password: logged exactly once (warn) by the seeding node, 48 hex
/// digits (192 bits), usable, and not logged again on restart.
#[tokio::test]
async fn generated_root_password_logged_once() {
    let mut server = Server::start(logged(ServerOpts::secured_generated())).await;
    let find = |log: &str| -> Vec<(String, String)> {
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| {
                let pw = v.get("password")?.as_str()?.to_string();
                let level = v.get("level")?.as_str()?.to_string();
                Some((level, pw))
            })
            .collect()
    };
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let found = find(&log);
    assert_eq!(found.len(), 1, "one log line with the password:\n{log}");
    let (level, pw) = found[0].clone();
    assert_eq!(level, "WARN");
    assert!(
        pw.len() == 48 && pw.bytes().all(|b| b.is_ascii_hexdigit()),
        "192-bit hex password, got {pw:?}"
    );
    assert_eq!(log.matches(&pw).count(), 1, "the password appears once");
    let anon = Http::new(server.url());
    anon.as_user("admin", &pw)
        .get("/v1/users")
        .await
        .expect(200);

    server.restart().await;
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert_eq!(find(&log).len(), 1, "not logged again on restart:\n{log}");
    assert_eq!(log.matches(&pw).count(), 1);
    Http::new(server.url())
        .as_user("admin", &pw)
        .get("/v1/users")
        .await
        .expect(200);
}

/// SPEC §3.10: with security on, `/readyz` is `200` only once the root admin exists: whenever
/// it says ready, root can log in.
#[tokio::test]
async fn readyz_waits_for_root() {
    let server = Server::start(ServerOpts {
        wait_ready: false,
        ..logged(ServerOpts::secured(ROOT_PW))
    })
    .await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = anon.get("/readyz").await;
        if r.status == 200 {
            assert_eq!(r.json(), json!({"status": "ready"}));
            root.get("/v1/users").await.expect(200);
            break;
        }
        r.expect_error(503);
        assert!(r.header("retry-after").is_some(), "{}", r.describe());
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// SPEC §4.3: a listing shows only visible topics (admin: all; others: owned or matching any
/// grant), and pagination runs over the visible set: the token is the last visible name of
/// the page and `""` when no visible topic follows.
#[tokio::test]
async fn listing_shows_only_visible_topics() {
    let (_server, anon, root) = secured().await;
    for t in ["a-1", "a-2", "orders-1", "orders-2", "orders-3", "z-1"] {
        let rec = root.create_topic_named(t).await;
        assert_eq!(rec["owner"], "admin");
    }
    add_user(
        &root,
        "lister",
        "pw",
        json!([
            {"action": "consume", "patterns": ["orders-*"]},
            {"action": "create", "patterns": ["mine-*"]}
        ]),
    )
    .await;
    add_user(&root, "nobody", "pw", json!([])).await;
    let lister = anon.as_user("lister", "pw");
    lister.create_topic_named("mine-1").await;
    // Ownership alone keeps it visible once the create grant is gone.
    put_json(
        &root,
        "/v1/users/lister/grants",
        &json!({"grants": [{"action": "consume", "patterns": ["orders-*"]}]}),
    )
    .await
    .expect(200);

    let all = lister.get("/v1/topics").await.expect_json(200);
    assert_eq!(names(&all), ["mine-1", "orders-1", "orders-2", "orders-3"]);
    assert_eq!(all["next_page_token"], "");
    let everything = root.get("/v1/topics").await.expect_json(200);
    assert_eq!(
        names(&everything),
        ["a-1", "a-2", "mine-1", "orders-1", "orders-2", "orders-3", "z-1"]
    );
    let none = anon
        .as_user("nobody", "pw")
        .get("/v1/topics")
        .await
        .expect_json(200);
    assert_eq!(none, json!({"topics": [], "next_page_token": ""}));

    for (limit, pages) in [
        (
            1,
            vec![
                vec!["mine-1"],
                vec!["orders-1"],
                vec!["orders-2"],
                vec!["orders-3"],
            ],
        ),
        (
            2,
            vec![vec!["mine-1", "orders-1"], vec!["orders-2", "orders-3"]],
        ),
        (
            3,
            vec![vec!["mine-1", "orders-1", "orders-2"], vec!["orders-3"]],
        ),
        (4, vec![vec!["mine-1", "orders-1", "orders-2", "orders-3"]]),
    ] {
        let mut token = String::new();
        for (i, want) in pages.iter().enumerate() {
            let page = lister
                .get(format!(
                    "/v1/topics?limit={limit}&page_token={}",
                    pct(&token)
                ))
                .await
                .expect_json(200);
            assert_eq!(&names(&page), want, "limit {limit} page {i}");
            let next = page["next_page_token"].as_str().unwrap().to_string();
            if i + 1 == pages.len() {
                assert_eq!(next, "", "limit {limit}: no visible topic follows");
            } else {
                assert_eq!(next, *want.last().unwrap(), "limit {limit} page {i}");
            }
            token = next;
        }
    }
    // A token naming an invisible topic still means "names after it".
    let page = lister
        .get("/v1/topics?page_token=a-1")
        .await
        .expect_json(200);
    assert_eq!(names(&page)[0], "mine-1");

    lister.get("/v1/topics/a-1").await.expect_error(403);
    let mine = lister.get("/v1/topics/mine-1").await.expect_json(200);
    assert_eq!(mine["owner"], "lister");
    lister.get("/v1/topics/orders-1").await.expect(200);
}

/// The verified-credential cache keeps argon2 off the hot path: after the first request, an
/// authenticated keep-alive request costs about what an unauthenticated one does.
#[tokio::test]
async fn authenticated_hot_path_pays_no_argon2() {
    const N: usize = 1000;
    let (_secure, anon, root) = secured().await;
    let dev = Server::start_default().await;
    let open = Http::new(dev.url());
    root.create_topic_named("perf").await;
    open.create_topic_named("perf").await;
    add_user(
        &root,
        "perf",
        "pw-perf",
        json!([{"action": "produce", "patterns": ["perf"]}]),
    )
    .await;
    add_user(&root, "probe", "pw-probe", json!([])).await;
    let perf = anon.as_user("perf", "pw-perf");

    // One argon2 verification, measured on a user of its own (a wrong password: 401).
    let t = Instant::now();
    anon.as_user("probe", "wrong")
        .get("/v1/topics")
        .await
        .expect_error(401);
    let verify = t.elapsed();
    // The first request of `perf` verifies; the rest hit the cache.
    perf.get("/v1/topics/perf").await.expect(200);

    // Interleaved rounds so that machine noise hits both sides alike.
    let (mut secured_total, mut open_total) = (Duration::ZERO, Duration::ZERO);
    let (mut secured_get, mut open_get) = (Duration::ZERO, Duration::ZERO);
    for round in 0..10 {
        let t = Instant::now();
        for i in 0..N / 10 {
            perf.produce("perf", "", format!("r{round}-{i}"))
                .await
                .expect(202);
        }
        secured_total += t.elapsed();
        let t = Instant::now();
        for i in 0..N / 10 {
            open.produce("perf", "", format!("r{round}-{i}"))
                .await
                .expect(202);
        }
        open_total += t.elapsed();
        let t = Instant::now();
        for _ in 0..N / 10 {
            perf.get("/v1/topics/perf?partition=0").await.expect(200);
        }
        secured_get += t.elapsed();
        let t = Instant::now();
        for _ in 0..N / 10 {
            open.get("/v1/topics/perf?partition=0").await.expect(200);
        }
        open_get += t.elapsed();
    }
    let per = |d: Duration| d / N as u32;
    eprintln!(
        "auth hot path: one argon2 verification {verify:?}; {N} produces: authenticated {secured_total:?} \
         ({:?}/req), open {open_total:?} ({:?}/req); {N} GET topic: authenticated {secured_get:?} \
         ({:?}/req), open {open_get:?} ({:?}/req)",
        per(secured_total),
        per(open_total),
        per(secured_get),
        per(open_get),
    );
    // argon2 per request would cost N × verify; the cache makes it a lookup.
    assert!(
        secured_get < verify * (N as u32) / 10,
        "authenticated GETs ({secured_get:?}) look like they pay argon2 ({verify:?} each)"
    );
    assert!(
        secured_total < open_total * 2 + Duration::from_secs(1),
        "authenticated produces {secured_total:?} vs open {open_total:?}"
    );
    assert!(
        secured_get < open_get * 3 + Duration::from_millis(500),
        "authenticated GETs {secured_get:?} vs open {open_get:?}"
    );
}

/// `narad user …` (SPEC §7.2) against a secured server, end to end.
#[tokio::test]
async fn cli_user_commands() {
    let (server, anon, _root) = secured().await;
    let cfg = tempfile::tempdir().unwrap();
    let url = server.url();
    let run = |args: &[&str], user: &str, pw: &str| {
        let mut cmd = Command::new(narad_bin());
        cmd.args(args)
            .args(["-s", &url, "-u", user, "-p", pw])
            .env("NARAD_CONFIG_DIR", cfg.path());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("NARAD_") && k != "NARAD_CONFIG_DIR" {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().expect("run narad");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let ok = |r: (Option<i32>, String, String), what: &str| -> String {
        assert_eq!(r.0, Some(0), "{what}: stdout {} stderr {}", r.1, r.2);
        r.1
    };

    let out = ok(
        run(
            &[
                "user",
                "add",
                "carol",
                "--user-password",
                "pw-c1",
                "--grant",
                "produce:orders-*,audit",
            ],
            "admin",
            ROOT_PW,
        ),
        "user add",
    );
    assert!(out.contains("carol"), "{out}");
    let out = ok(run(&["user", "ls", "--json"], "admin", ROOT_PW), "user ls");
    let users: Value = serde_json::from_str(&out).unwrap();
    let carol = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "carol")
        .unwrap_or_else(|| panic!("carol not listed: {out}"));
    assert_eq!(
        carol["grants"],
        json!([{"action": "produce", "patterns": ["orders-*", "audit"]}])
    );
    ok(run(&["user", "ls"], "admin", ROOT_PW), "user ls (table)");
    ok(
        run(
            &[
                "user",
                "grant",
                "carol",
                "--grant",
                "consume:x",
                "--grant",
                "create:x",
            ],
            "admin",
            ROOT_PW,
        ),
        "user grant",
    );
    let u = anon
        .as_user("admin", ROOT_PW)
        .get("/v1/users/carol")
        .await
        .expect_json(200);
    assert_eq!(
        u["grants"],
        json!([{"action": "consume", "patterns": ["x"]}, {"action": "create", "patterns": ["x"]}])
    );
    // Quotas: set, shown in the table, refused without a value, lifted.
    let out = ok(
        run(
            &[
                "user",
                "quotas",
                "carol",
                "--produce-msgs-per-s",
                "100",
                "--max-topics",
                "3",
            ],
            "admin",
            ROOT_PW,
        ),
        "user quotas",
    );
    assert!(out.contains("100 msg/s, 3 topics"), "{out}");
    let out = ok(run(&["user", "ls"], "admin", ROOT_PW), "user ls (quotas)");
    assert!(
        out.contains("QUOTAS") && out.contains("100 msg/s, 3 topics"),
        "{out}"
    );
    let r = run(&["user", "quotas", "carol"], "admin", ROOT_PW);
    assert_ne!(r.0, Some(0), "no quota and no --none: {r:?}");
    let r = run(
        &["user", "quotas", "carol", "--max-topics", "0"],
        "admin",
        ROOT_PW,
    );
    assert_ne!(r.0, Some(0), "0 is refused: {r:?}");
    let out = ok(
        run(&["user", "quotas", "carol", "--none"], "admin", ROOT_PW),
        "user quotas --none",
    );
    assert!(out.contains("quotas of carol: -"), "{out}");
    ok(
        run(
            &["user", "passwd", "carol", "--new", "pw-c2"],
            "admin",
            ROOT_PW,
        ),
        "admin reset",
    );
    ok(
        run(
            &[
                "user",
                "passwd",
                "carol",
                "--current",
                "pw-c2",
                "--new",
                "pw-c3",
            ],
            "carol",
            "pw-c2",
        ),
        "own change",
    );
    anon.as_user("carol", "pw-c3")
        .get("/v1/topics")
        .await
        .expect(200);
    let (code, _, err) = run(&["user", "ls"], "carol", "pw-c3");
    assert_eq!(code, Some(1));
    assert!(err.contains("http 403"), "{err}");
    let (code, _, err) = run(&["user", "ls"], "admin", "wrong");
    assert_eq!(code, Some(1));
    assert!(err.contains("http 401"), "{err}");
    let (code, _, err) = run(
        &[
            "user",
            "add",
            "x",
            "--user-password",
            "p",
            "--grant",
            "admin:*",
        ],
        "admin",
        ROOT_PW,
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("http 400"), "{err}");
    ok(run(&["user", "rm", "carol"], "admin", ROOT_PW), "user rm");
    let (code, _, err) = run(&["user", "rm", "carol"], "admin", ROOT_PW);
    assert_eq!(code, Some(1));
    assert!(err.contains("http 404"), "{err}");
}
