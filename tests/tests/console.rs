//! The web console at `/ui` (ext): served with its security headers, behind the API's
//! authentication, off with `http.console_enabled=false`, no secret in what it serves; and
//! in a real headless Chromium (WebDriver), with security off and on: its pages load
//! without console errors, a topic is created, a message produced and peeked (replay, no
//! lease), and the backlog shown changes. Screenshots of the main pages are saved under
//! `console-screenshots/` of the target directory.

use std::time::Duration;

use narad_tests::browser::{self, Browser};
use narad_tests::*;

const ROOT_PW: &str = "console-root-secret-8c1f";
const VIEWER_PW: &str = "console-viewer-secret-51aa";
/// The console's `Content-Security-Policy`: only this origin, no inline code, no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";
/// How long the browser may take to show what the API already answered (its pages refresh
/// every 5 s, and at once after an action of their own).
const UI_WAIT: Duration = Duration::from_secs(20);

/// The URLs of the files the page loads (`/ui/<file>?v=<hash>`).
fn asset_urls(page: &str) -> Vec<String> {
    page.match_indices("\"/ui/")
        .map(|(i, _)| {
            let rest = &page[i + 1..];
            rest[..rest.find('"').expect("a closing quote")].to_string()
        })
        .collect()
}

/// Checks the headers every console answer carries.
fn has_policy(r: &Resp) {
    assert_eq!(
        r.header("content-security-policy"),
        Some(CSP),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{}",
        r.describe()
    );
    assert_eq!(
        r.header("x-frame-options"),
        Some("DENY"),
        "{}",
        r.describe()
    );
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy_and_cache_headers() {
    let server = Server::start_default().await;
    let http = server.http();
    let r = http.get("/ui").await;
    r.expect(200);
    has_policy(&r);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let etag = r.header("etag").expect("an ETag on the page").to_string();
    let page = r.text();
    assert!(page.contains("<title>Narad console</title>"), "{page}");
    assert_eq!(http.get("/ui/").await.expect(200).body, r.body);

    // Revalidation: the same ETag answers 304 without a body.
    let again = http
        .request(Method::GET, "/ui")
        .header("if-none-match", &etag)
        .send()
        .await;
    again.expect(304);
    assert!(again.body.is_empty());
    has_policy(&again);

    let urls = asset_urls(&page);
    let mut types: Vec<String> = Vec::new();
    for url in &urls {
        assert!(url.contains("?v="), "{url} carries no content hash");
        let r = http.get(url.as_str()).await;
        r.expect(200);
        has_policy(&r);
        assert_eq!(
            r.header("cache-control"),
            Some("private, max-age=31536000, immutable"),
            "{}",
            r.describe()
        );
        types.push(r.header("content-type").unwrap_or_default().to_string());
    }
    types.sort();
    assert_eq!(
        types,
        [
            "image/svg+xml",
            "text/css; charset=utf-8",
            "text/javascript; charset=utf-8"
        ],
        "{urls:?}"
    );
    // The page has no inline script or style for the policy to block.
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );

    let missing = http.get("/ui/nothing.js").await;
    missing.expect_error(404);
    has_policy(&missing);
    http.request(Method::POST, "/ui")
        .send()
        .await
        .expect_error(405);
}

#[tokio::test]
async fn a_disabled_console_is_not_routed() {
    let server =
        Server::start(ServerOpts::default().env("NARAD_HTTP_CONSOLE_ENABLED", "false")).await;
    let http = server.http();
    for path in ["/ui", "/ui/", "/ui/app.js"] {
        let r = http.get(path).await;
        r.expect_error(404);
        assert!(
            r.header("content-security-policy").is_none(),
            "{}",
            r.describe()
        );
    }
    http.get("/v1/topics").await.expect(200);
}

#[tokio::test]
async fn a_secured_console_asks_for_credentials_and_serves_no_secret() {
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = server.http();
    let root = anon.as_user("admin", ROOT_PW);
    root.post_json(
        "/v1/users",
        &json!({"username": "viewer", "password": VIEWER_PW,
                "grants": [{"action": "consume", "patterns": ["orders-*"]}]}),
    )
    .await
    .expect(201);

    let page = root.get("/ui").await;
    page.expect(200);
    let urls = asset_urls(&page.text());
    assert_eq!(urls.len(), 3, "{}", page.text());
    for path in std::iter::once("/ui").chain(urls.iter().map(String::as_str)) {
        for who in [anon.clone(), anon.as_user("admin", "wrong-password")] {
            let r = who.get(path).await;
            r.expect_error(401);
            assert_eq!(
                r.header("www-authenticate"),
                Some("Basic realm=\"narad\""),
                "{}",
                r.describe()
            );
            has_policy(&r);
        }
        // Any user may load the console; what it shows is up to their grants.
        for who in [root.clone(), anon.as_user("viewer", VIEWER_PW)] {
            let r = who.get(path).await;
            r.expect(200);
            for secret in [ROOT_PW, VIEWER_PW, "$argon2"] {
                assert!(!r.text().contains(secret), "{path} contains {secret}");
            }
        }
    }
}

/// Fails on any entry of the browser's console log at level SEVERE other than one containing
/// an `expected` text (a refused API call the test made on purpose logs its status).
async fn no_console_errors(b: &Browser, step: &str, expected: &[&str]) {
    let log = b.console_log().await.expect("the browser's console log");
    let errors: Vec<_> = log
        .iter()
        .filter(|(level, m)| level == "SEVERE" && !expected.iter().any(|e| m.contains(e)))
        .collect();
    assert!(errors.is_empty(), "{step}: console errors: {errors:#?}");
}

/// The console's main flows in one browser: cluster page, create a topic, produce, see the
/// backlog change, peek (no lease), the topic list, a refused change showing the API's
/// error, the users page; screenshots named `<mode>-<page>.png`.
async fn drive(b: &Browser, ui: &str, api: &Http, mode: &str, topic: &str) {
    let shots = browser::screenshot_dir();
    let shot = |name: &'static str| {
        let shots = shots.clone();
        async move {
            let p = b
                .screenshot(&shots, &format!("{mode}-{name}"))
                .await
                .expect("screenshot");
            println!("screenshot: {}", p.display());
        }
    };

    // Cluster: members and health.
    b.goto(&format!("{ui}/ui")).await.expect("open /ui");
    b.wait_text("#members", UI_WAIT, |t| {
        t.contains("alive") && t.contains("leader")
    })
    .await
    .expect("the members table");
    b.wait_text("#health", UI_WAIT, |t| t.contains("ready"))
        .await
        .expect("the health cards");
    no_console_errors(b, "cluster page", &[]).await;
    shot("cluster").await;

    // Create a topic through the form.
    b.click("#nav-topics").await.unwrap();
    b.type_into("#new-topic-name", topic).await.unwrap();
    b.type_into("#new-topic-partitions", "4").await.unwrap();
    b.click("#create-topic-submit").await.unwrap();
    b.wait_text("#topic-head h1", UI_WAIT, |t| t.starts_with(topic))
        .await
        .expect("the new topic's page");
    assert_eq!(api.get_topic(topic, "").await["partitions"], 4);
    b.wait_text("#backlog-messages", UI_WAIT, |t| t == "0")
        .await
        .unwrap();

    // Produce a test message; the backlog shown goes to 1.
    b.type_into(
        "#produce-payload",
        r#"{"order":42,"note":"from the console"}"#,
    )
    .await
    .unwrap();
    b.type_into("#produce-key", "customer-42").await.unwrap();
    b.click("#produce-submit").await.unwrap();
    b.wait_text("#flash", UI_WAIT, |t| t.contains("accepted"))
        .await
        .expect("the produce answer");
    b.wait_text("#backlog-messages", UI_WAIT, |t| t == "1")
        .await
        .expect("the backlog after a produce from the console");
    assert_eq!(api.backlog(topic).await, (1, 0));

    // Peek at it on its partition: replayed, never leased.
    let stats = api.partition_stats(topic).await;
    let p = stats
        .iter()
        .position(|s| s["high_watermark"] == 1)
        .expect("the message's partition");
    b.click(&format!("#peek-partition option[value=\"{p}\"]"))
        .await
        .unwrap();
    b.click("#peek-submit").await.unwrap();
    let peeked = b
        .wait_text("#peek-result", UI_WAIT, |t| t.contains("from the console"))
        .await
        .expect("the peeked message");
    assert!(peeked.contains("customer-42"), "{peeked}");
    assert!(peeked.contains("1 message from partition"), "{peeked}");
    assert_eq!(api.backlog(topic).await, (1, 0), "a peek leases nothing");
    b.exec(
        "document.getElementById('peek-result').scrollIntoView({block: 'end'})",
        vec![],
    )
    .await
    .unwrap();
    shot("peek").await;
    b.exec("window.scrollTo(0, 0)", vec![]).await.unwrap();
    b.wait_text("#backlog-in-flight", UI_WAIT, |t| t == "0")
        .await
        .unwrap();

    // A message produced elsewhere shows up on the next refresh.
    api.produce_ok(topic, "", "from curl").await;
    b.wait_text("#backlog-messages", UI_WAIT, |t| t == "2")
        .await
        .expect("the backlog after a produce through the API");
    no_console_errors(b, "topic page", &[]).await;
    shot("topic").await;

    // The topic list shows it with its backlog.
    b.click("#nav-topics").await.unwrap();
    b.wait_text(
        &format!("tr[data-topic=\"{topic}\"] td.backlog"),
        UI_WAIT,
        |t| t == "2",
    )
    .await
    .expect("the topic list's backlog");
    no_console_errors(b, "topics page", &[]).await;
    shot("topics").await;

    // Alter: more partitions is applied; fewer is refused with the API's own error.
    b.click(&format!("tr[data-topic=\"{topic}\"] a"))
        .await
        .unwrap();
    b.wait_text("#topic-head h1", UI_WAIT, |t| t.starts_with(topic))
        .await
        .unwrap();
    b.type_into("#alter-partitions", "5").await.unwrap();
    b.click("#alter-submit").await.unwrap();
    b.wait_text("#flash", UI_WAIT, |t| t.contains("Changed partitions"))
        .await
        .unwrap();
    assert_eq!(api.get_topic(topic, "").await["partitions"], 5);
    b.type_into("#alter-partitions", "4").await.unwrap();
    b.click("#alter-submit").await.unwrap();
    let refused = b
        .wait_text("#flash", UI_WAIT, |t| t.starts_with("400: "))
        .await
        .expect("the API's refusal shown");
    assert!(refused.contains("partitions"), "{refused}");
    no_console_errors(b, "refused alter", &["status of 400"]).await;

    // Users and grants; the refusal's message goes with the navigation.
    b.click("#nav-users").await.unwrap();
    b.wait_text("#user-list", UI_WAIT, |t| !t.is_empty())
        .await
        .unwrap();
    assert_eq!(b.text("#flash").await.unwrap(), "");
    no_console_errors(b, "users page", &[]).await;
    shot("users").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_chromium_with_security_off() {
    if !browser::available("the_console_works_in_chromium_with_security_off") {
        return;
    }
    let server = Server::start_default().await;
    let api = server.http();
    let b = Browser::start().await.expect("headless chromium");
    drive(&b, &server.url(), &api, "dev", "console-orders").await;
    b.wait_text("#user-list", UI_WAIT, |t| t.contains("security is off"))
        .await
        .unwrap();

    // Delete the topic (two clicks: the first arms the button).
    b.goto(&format!("{}/ui#/topics/console-orders", server.url()))
        .await
        .unwrap();
    b.wait_text("#topic-head h1", UI_WAIT, |t| {
        t.starts_with("console-orders")
    })
    .await
    .unwrap();
    b.click("#delete-topic").await.unwrap();
    b.click("#delete-topic").await.unwrap();
    b.wait_text("#flash", UI_WAIT, |t| t.contains("Deleted topic"))
        .await
        .unwrap();
    api.get("/v1/topics/console-orders").await.expect_error(404);
    no_console_errors(&b, "delete", &[]).await;
    b.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_chromium_with_security_on() {
    if !browser::available("the_console_works_in_chromium_with_security_on") {
        return;
    }
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let root = server.http().as_user("admin", ROOT_PW);
    let port = server.port();
    // Login by HTTP Basic: the credentials in the URL answer the 401's challenge, and the
    // browser sends them with the page's own /v1 requests.
    let as_admin = format!("http://admin:{ROOT_PW}@127.0.0.1:{port}");
    let b = Browser::start().await.expect("headless chromium");
    drive(&b, &as_admin, &root, "secured", "console-orders").await;

    // An admin creates a user from the console; the password field is emptied at once.
    b.type_into("#new-user-name", "console-viewer")
        .await
        .unwrap();
    b.type_into("#new-user-password", VIEWER_PW).await.unwrap();
    b.type_into("#new-user-grants", "consume: console-*")
        .await
        .unwrap();
    b.click("#create-user-submit").await.unwrap();
    b.wait_text("tr[data-user=\"console-viewer\"]", UI_WAIT, |t| {
        t.contains("console-viewer")
    })
    .await
    .expect("the new user listed");
    let pw = b
        .exec(
            "return document.getElementById('new-user-password').value",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(pw, "", "the password stays in the form");
    let user = root.get("/v1/users/console-viewer").await.expect_json(200);
    assert_eq!(
        user["grants"],
        json!([{"action": "consume", "patterns": ["console-*"]}])
    );
    let page_text = b.text("body").await.unwrap();
    assert!(!page_text.contains(VIEWER_PW) && !page_text.contains(ROOT_PW));
    no_console_errors(&b, "user created", &[]).await;
    shot_users(&b).await;
    b.quit().await;

    // The new user sees the topic but may not delete it, nor manage users: the console shows
    // the API's refusal.
    let as_viewer = format!("http://console-viewer:{VIEWER_PW}@127.0.0.1:{port}");
    let v = Browser::start().await.expect("headless chromium");
    v.goto(&format!("{as_viewer}/ui#/topics/console-orders"))
        .await
        .unwrap();
    v.wait_text("#backlog-messages", UI_WAIT, |t| t == "2")
        .await
        .expect("the viewer sees the topic");
    v.click("#delete-topic").await.unwrap();
    v.click("#delete-topic").await.unwrap();
    let refused = v
        .wait_text("#flash", UI_WAIT, |t| t.starts_with("403: "))
        .await
        .expect("the refusal shown");
    println!("refused delete shows: {refused}");
    root.get("/v1/topics/console-orders").await.expect(200);
    v.click("#nav-users").await.unwrap();
    v.wait_text("#users-forbidden", UI_WAIT, |t| {
        t.contains("no admin grant")
    })
    .await
    .unwrap();
    no_console_errors(&v, "viewer", &["status of 403"]).await;
    v.quit().await;
}

async fn shot_users(b: &Browser) {
    let p = b
        .screenshot(&browser::screenshot_dir(), "secured-users-created")
        .await
        .expect("screenshot");
    println!("screenshot: {}", p.display());
}
